"""The ``lagom`` command line. ``python -m lagom`` and the console script both call :func:`main`.

Each subcommand is a module in :mod:`lagom.commands` with ``register(subparsers)``
(adds its parser, sets ``func``) and a ``run(args) -> int``. Bad input raises
:class:`nccl_env.errors.LagomError`: printed as one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shutil
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import NoReturn

from lagom import __version__
from lagom.orchestration.package_check import shadowed

# Subcommand modules, in the order `lagom --help` lists them.
COMMANDS = ["record", "analyze", "simulate", "calibrate", "tune", "run", "bench", "plugin", "doctor"]


MAX_HELP_COLUMNS = 80  # help is read in terminals and pasted into issues: never wider


def help_columns() -> int:
    """$COLUMNS (else the terminal's width), at most MAX_HELP_COLUMNS."""
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else shutil.get_terminal_size().columns
    return max(40, min(width, MAX_HELP_COLUMNS))


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Options' help wrapped between words at :func:`help_columns`; a description's prose
    paragraphs re-filled to that width, and its indented lines (examples, tables) kept as
    written unless too wide, then wrapped under their own indent."""

    def __init__(self, prog: str, **kwargs) -> None:
        kwargs.setdefault("width", help_columns())
        kwargs.setdefault("max_help_position", 28)
        super().__init__(prog, **kwargs)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return super()._split_lines(plain_text(text), width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        text = plain_text(text)  # before filling: the markup's characters are not printed
        out = []
        for paragraph in re.split(r"\n\s*\n", text.strip("\n")):
            lines = paragraph.splitlines()
            if all(not line[:1].isspace() for line in lines):  # prose: refill
                out.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                         initial_indent=indent, subsequent_indent=indent, break_long_words=False,
                                         break_on_hyphens=False))
                continue
            kept = []
            for line in lines:
                if len(indent + line) <= width:
                    kept.append(indent + line)
                    continue
                lead = line[: len(line) - len(line.lstrip())]
                kept.append(textwrap.fill(line.strip(), width, initial_indent=indent + lead,
                                          subsequent_indent=indent + lead + "    ", break_long_words=False,
                                          break_on_hyphens=False))
            out.append("\n".join(kept))
        return "\n\n".join(out)


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints usage plus the error; we print one line naming the command.
    Help fits 80 columns (:class:`HelpFormatter`)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
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


def _deepest(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser that ``args`` reached: ``lagom plugin table``, not ``lagom``."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = getattr(args, sub.dest, None) if sub is not None and sub.dest else None
        if sub is None or chosen not in sub.choices:
            return parser
        parser = sub.choices[chosen]


def main(argv: list[str] | None = None) -> int:
    """The command line; a Ctrl-C at any moment, imports and argument parsing included, is one line and
    exit 130 (never a traceback). While the commands' modules are imported a Ctrl-C is held until the
    imports end (:func:`sigint_held`): a KeyboardInterrupt inside a compiled extension's initialisation
    can crash the interpreter (orjson's did: a segmentation fault)."""
    try:
        with sigint_held() as held:
            ready = _parse(argv)
        if held:
            raise KeyboardInterrupt
        return ready if isinstance(ready, int) else _run(*ready)
    except KeyboardInterrupt:
        print("lagom: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def sigint_held() -> Iterator[list[int]]:
    """SIGINT while the block runs is remembered (in the list yielded), not raised; the previous handler is
    back when it ends. Outside the main thread signals stay as they are."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)


def _parse(argv: list[str] | None) -> int | tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser (every command's module imported) and the arguments, or an exit status."""
    problems = shadowed()  # before importing any of them: a stray nccl_env.py would break that import
    if problems:
        print(f"lagom: error: {problems[0]}", file=sys.stderr)
        return 2
    from nccl_env.nccl_releases import forget_warnings

    forget_warnings()  # one command, one warning per newer NCCL version (also when called in-process)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # an option this command does not take: its own help names it, not lagom's
        _deepest(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return parser, args


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from nccl_env.errors import LagomError

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
    except MemoryError:  # an estimate fell short (the inputs are checked against the memory before reading)
        print(f"lagom {args.command}: error: out of memory (the memory at hand, the cgroup's limit or "
              f"ulimit -v is too small for this input)", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
