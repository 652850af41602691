"""`lagom plugin`: not built yet (see the open issues)."""

from __future__ import annotations

import argparse

from nccl_env.errors import LagomError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugin", help="(not built yet)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise LagomError("'lagom plugin' is not built yet")
