"""`lagom simulate`: not built yet (see the open issues)."""

from __future__ import annotations

import argparse

from nccl_env.errors import LagomError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="(not built yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise LagomError("'lagom simulate' is not built yet")
