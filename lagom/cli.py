"""The ``lagom`` command line. ``python -m lagom`` and the console script both call :func:`main`.

Each subcommand is a module in :mod:`lagom.commands` with ``register(subparsers)``
(adds its parser, sets ``func``) and a ``run(args) -> int``. Bad input raises
:class:`nccl_env.errors.LagomError`: printed as one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import NoReturn

from lagom import __version__
from lagom.package_check import shadowed

# Subcommand modules, in the order `lagom --help` lists them.
COMMANDS = ["record", "analyze", "simulate", "calibrate", "tune", "run", "bench", "plugin", "doctor"]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print one line naming the command.
    Descriptions (each command's module docstring) keep their own line breaks."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def format_help(self) -> str:
        """Help in plain text: the commands' docstrings double as help and use reST markup."""
        return plain_text(super().format_help())


def plain_text(text: str) -> str:
    """reStructuredText inline markup (``x``, :mod:`x`, `x`) as plain text."""
    text = re.sub(r":[a-z]+:`~?([^`]*)`", r"\1", text)
    return re.sub(r"``?([^`]*?)``?", r"\1", text)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="lagom",
        description="Co-tune NCCL with the computation it overlaps: analyse traces, simulate, tune, run.",
    )
    parser.add_argument("--version", action="version", version=f"lagom {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"lagom.commands.{name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    problems = shadowed()  # before importing any of them: a stray nccl_env.py would break that import
    if problems:
        print(f"lagom: error: {problems[0]}", file=sys.stderr)
        return 2
    from nccl_env.errors import LagomError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except LagomError as exc:
        print(f"lagom {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"lagom {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
