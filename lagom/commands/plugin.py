"""`lagom plugin`: build Lagom's NCCL tuner plugin, make its table from a tuned config, check a table.

  lagom plugin build [--force] [--cc CC]     compile (cached); last line = absolute .so path
  lagom plugin table lagom.yaml [-o FILE]    the plugin's CSV table for a tuned config (stdout without -o)
  lagom plugin check TABLE.csv               parse a table as the plugin does; one line per rejected line
                                             (exit status 1 when any line is rejected, 0 when none)

Use the plugin with NCCL:  NCCL_TUNER_PLUGIN=<so path> NCCL_TUNER_CONFIG_FILE=<table> torchrun ...
(docs/plugin.md has the table format and matching rules).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nccl_env.errors import LagomError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugin", help="build the NCCL tuner plugin; write or check its table", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    build = actions.add_parser("build", help="compile the plugin (cached by source hash); prints the .so path last")
    build.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    build.add_argument("--cc", help="C compiler (default: $CC, else cc/gcc/clang on PATH)")
    table = actions.add_parser("table", help="the plugin table (CSV) for a tuned config")
    table.add_argument("config", help="tuned config file (lagom.yaml)")
    table.add_argument("-o", "--output", help="write the table here instead of stdout")
    check = actions.add_parser("check", help="parse a plugin table; list rejected lines (exit 1 if any)")
    check.add_argument("table", help="plugin table file (CSV)")
    parser.set_defaults(func=run, _parser=parser)


def run(args: argparse.Namespace) -> int:
    if args.action == "build":
        from nccl_env.plugin_build import build_plugin

        print(build_plugin(force=args.force, cc=args.cc))
        return 0
    if args.action == "table":
        from lagom.plugin_export import render_plugin_table, write_plugin_table
        from lagom.tuned_config import load_tuned_config

        cfg = load_tuned_config(args.config)
        try:
            text = render_plugin_table(cfg)
        except LagomError as exc:  # an entry the plugin cannot carry: say which file it came from
            raise LagomError(f"{args.config}: {exc}") from None
        if args.output:
            print(write_plugin_table(cfg, args.output))
        else:
            sys.stdout.write(text)
        return 0
    if args.action == "check":
        from nccl_env.plugin_table import parse_table

        path = Path(args.table)
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")  # the C parser reads bytes too
        except FileNotFoundError:
            raise LagomError(f"{path}: no such file") from None
        except OSError as exc:
            raise LagomError(f"{path}: cannot read: {exc.strerror or exc}") from None
        entries, warnings = parse_table(text)
        for w in warnings:
            print(f"{path}: {w}")
        print(f"{path}: {len(entries)} entries, {len(warnings)} rejected lines")
        return 1 if warnings else 0
    args._parser.print_help()
    return 2
