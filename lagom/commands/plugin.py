"""`lagom plugin`: build Lagom's NCCL tuner plugin, make its table from a tuned config, check a table.

  lagom plugin build [--force] [--cc CC] [--json]
      compile (cached); the last line is the absolute .so path
  lagom plugin table lagom.yaml [-o FILE]
      the plugin's CSV table for a tuned config (stdout without -o)
  lagom plugin check TABLE.csv [--json]
      parse a table as the plugin does; one line per rejected line
      (exit status 1 when any line is rejected, 0 when none)
  --json on build and check: one JSON object instead of lines

Use the plugin with NCCL (docs/plugin.md has the table format and matching rules):

  NCCL_TUNER_PLUGIN=<so path> NCCL_TUNER_CONFIG_FILE=<table> torchrun ...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lagom.args.common_args import add_json
from nccl_env.errors import LagomError

BUILD_DOC = """Compile Lagom's NCCL tuner plugin (nccl_env/plugin/lagom_tuner.c) with the system C
compiler (--cc, else $CC, else cc/gcc/clang) and cache it in Lagom's cache folder
($LAGOM_CACHE_DIR), named by a hash of the sources and the compile command; a cached
build is reused unless --force. The last line printed is the absolute path of the
.so, for NCCL_TUNER_PLUGIN. No compiler, or a source that does not compile: one line,
exit 2."""

TABLE_DOC = """The tuner plugin's table (CSV) for a tuned-config file: one line per collective entry,
first match wins, with what the file's NCCL version lets the plugin carry; comment
lines say what the table leaves out and why. Printed to stdout, or written to -o FILE
(an existing file only if Lagom wrote it, else --force; never the config itself).
For NCCL_TUNER_CONFIG_FILE; lagom run writes it for you."""

CHECK_DOC = """Parse a plugin table as the C plugin does (same accept/reject rules) and print one
line per line it would reject, then a count of entries and rejected lines. Exit status
1 when any line is rejected, 0 when none, 2 when the file cannot be read."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plugin", help="build the NCCL tuner plugin; write or check its table", description=__doc__)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    build = actions.add_parser("build", help="compile the plugin (cached by source hash); prints the .so path last",
                               description=BUILD_DOC)
    build.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    build.add_argument("--cc", help="C compiler (default: $CC, else cc/gcc/clang on PATH)")
    add_json(build)
    table = actions.add_parser("table", help="the plugin table (CSV) for a tuned config", description=TABLE_DOC)
    table.add_argument("config", metavar="CONFIG", help="tuned config file (lagom.yaml)")
    table.add_argument("-o", "--output", metavar="FILE", help="write the table here instead of stdout")
    table.add_argument("--force", action="store_true", help="overwrite -o even if it is not a table Lagom wrote")
    check = actions.add_parser("check", help="parse a plugin table; list rejected lines (exit 1 if any)",
                               description=CHECK_DOC)
    check.add_argument("table", metavar="TABLE", help="plugin table file (CSV)")
    add_json(check)
    parser.set_defaults(func=run, _parser=parser)


def run(args: argparse.Namespace) -> int:
    if args.action == "build":
        from nccl_env.plugin_build import build_plugin

        so_path = build_plugin(force=args.force, cc=args.cc)
        print(json.dumps({"plugin": str(so_path)}) if args.json else so_path)
        return 0
    if args.action == "table":
        from lagom.files.output_paths import OutputFormat, check_output, write_output
        from lagom.files.plugin_export import render_plugin_table
        from lagom.files.tuned_config import absent_group_warning, load_tuned_config

        if args.output is not None:
            check_output("-o", args.output, OutputFormat.PLUGIN_TABLE, [("CONFIG", args.config)], force=args.force)
        cfg = load_tuned_config(args.config)
        absent = absent_group_warning(args.config, cfg, cfg.process_groups, "the job it was tuned for")
        if absent:  # the job's groups as the file records them (process_groups), where it names any
            print(f"warning: {absent}", file=sys.stderr)
        try:
            text = render_plugin_table(cfg)
        except LagomError as exc:  # an entry the plugin cannot carry: say which file it came from
            raise LagomError(f"{args.config}: {exc}") from None
        if args.output is not None:
            print(write_output(Path(args.output), text, "-o").resolve())
        else:
            sys.stdout.write(text)
        return 0
    if args.action == "check":
        from nccl_env.files import MAX_TEXT_BYTES, read_bounded
        from nccl_env.plugin_table import parse_table

        path = Path(args.table)
        raw = read_bounded(path, MAX_TEXT_BYTES, str(path), "a plugin table", gunzip=False)  # a FIFO: refused
        if raw[:2] == b"\x1f\x8b":
            raise LagomError(f"{path}: is gzip-compressed data (a trace?), expected a plugin table (CSV)")
        text = raw.decode("utf-8", errors="replace")  # the C parser reads bytes too
        entries, warnings = parse_table(text)
        if args.json:
            print(json.dumps({"table": str(path), "entries": len(entries), "rejected": warnings}))
            return 1 if warnings else 0
        for w in warnings:
            print(f"{path}: {w}")
        print(f"{path}: {len(entries)} entries, {len(warnings)} rejected lines")
        return 1 if warnings else 0
    args._parser.print_help()
    return 2
