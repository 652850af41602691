"""`lagom doctor`: what this machine's NCCL and compiler let Lagom do.

Checks that nccl_env, traces, costmodel and tuner are Lagom's own packages (naming
a file that shadows one), and says where parsed traces are kept and how large.
Reports the NCCL library found (torch's, else the nvidia-nccl-cu12 wheel's, else the
system's; $LAGOM_LIBNCCL overrides) and its version from ncclGetVersion; which tuner
plugin symbols that version loads and which knobs it takes per collective; whether
each env variable Lagom may set is known to that library (its strings); the C
compiler; and whether the plugin builds and exports its five ABI structs. Each
problem is one line; exit status 1 when there is any, 0 otherwise. No GPU needed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
from dataclasses import dataclass, field

from lagom.args.common_args import add_json
from nccl_env.errors import LagomError


@dataclass
class Report:
    checks: list[tuple[str, str]] = field(default_factory=list)  # (item, finding), in order
    problems: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def ok(self, item: str, text: str) -> None:
        self.checks.append((item, text))

    def problem(self, item: str, text: str) -> None:
        self.checks.append((item, f"PROBLEM: {text}"))
        self.problems.append(f"{item}: {text}")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="NCCL library, version, plugin ABI, env names, compiler, plugin build",
                            description=__doc__)
    add_json(parser)
    parser.add_argument("--cc", help="C compiler to check (default: $CC, else cc/gcc/clang)")
    parser.set_defaults(func=run)


def examine(cc: str | None = None) -> Report:
    """Run every check; never raises for an environment problem."""
    from nccl_env.delivery import ENV_NAMES
    from nccl_env.libnccl import candidates, nccl_version, strings_present
    from nccl_env.plugin_build import build_plugin, find_compiler
    from nccl_env.rules import TUNER_SYMBOL_SINCE, per_collective_knobs, tuner_symbols

    report = Report()
    from lagom.orchestration.package_check import CHECKED_PACKAGES, shadowed

    problems = shadowed()
    for line in problems:
        report.problem("packages", line)
    if not problems:
        report.ok("packages", f"{', '.join(CHECKED_PACKAGES)} are Lagom's")
    from traces.parse_cache import cache_summary, enabled, max_bytes

    summary = cache_summary()
    if not enabled():
        report.ok("trace cache", "off (LAGOM_TRACE_CACHE): every command parses its traces afresh")
    elif summary is None:
        report.ok("trace cache", "unusable here (the cache folder is not this user's alone): traces are parsed "
                                 "afresh")
    else:
        where, entries, size = summary
        report.ok("trace cache", f"{where}: {entries} parsed file(s), {size / 2**20:.1f} MiB "
                                 f"(at most {max_bytes() / 2**30:.1f} GiB)")
        report.data["trace_cache"] = {"folder": str(where), "entries": entries, "bytes": size,
                                      "max_bytes": max_bytes()}
    found = candidates()
    report.data["libnccl_candidates"] = [{"path": str(c.path), "source": c.source} for c in found]
    version = None
    lib = None
    if not found:
        report.problem("libnccl", "none found (not in torch/lib, no nvidia-nccl-cu12 wheel, none on the system); "
                                  "pip install nvidia-nccl-cu12 or set LAGOM_LIBNCCL")
    else:
        lib = found[0]
        report.ok("libnccl", f"{lib.path} ({lib.source})")
        report.data["libnccl"] = {"path": str(lib.path), "source": lib.source}
        try:
            version = nccl_version(lib.path)
            report.ok("NCCL version", f"{version} (ncclGetVersion {version.code})")
            report.data["nccl_version"] = str(version)
            report.data["nccl_version_code"] = version.code
        except LagomError as exc:
            report.problem("NCCL version", str(exc))
    if version is not None and lib is not None:
        symbols = tuner_symbols(version)
        report.data["tuner_symbols"] = list(symbols)
        if symbols:
            report.ok("tuner plugin ABI", f"loads {', '.join(symbols)} (tries {symbols[0]} first)")
        else:
            report.problem("tuner plugin ABI", f"NCCL {version} loads none of Lagom's plugin symbols "
                                               f"(v2 needs {TUNER_SYMBOL_SINCE['ncclTunerPlugin_v2']}); "
                                               "per-collective settings fall back to env and process groups")
        knobs = sorted(per_collective_knobs(version))
        report.data["per_collective_knobs"] = knobs
        report.ok("per-collective knobs", ", ".join(knobs) if knobs else "none (all process-wide)")
        try:
            names = list(ENV_NAMES) + [f"ncclTunerPlugin_v{v}" for v in range(2, 7)]
            present = strings_present(lib.path, names)
            report.data["strings"] = present
            for name in ENV_NAMES:
                if present[name]:
                    report.ok(name, "known to this libnccl")
                else:
                    report.problem(name, f"not in {lib.path.name}'s strings: NCCL {version} ignores it")
            missing = [s for s in symbols if not present[s]]
            if missing:
                report.problem("tuner plugin ABI", f"{', '.join(missing)} expected for NCCL {version} "
                                                   "but not in the library's strings")
        except LagomError as exc:
            report.problem("env names", str(exc))
    try:
        compiler = find_compiler(cc)
        try:
            first = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
            line = first.splitlines()[0] if first else "version unknown"
        except (OSError, subprocess.TimeoutExpired):
            line = "version unknown"
        report.ok("C compiler", f"{compiler} ({line})")
        report.data["compiler"] = compiler
    except LagomError as exc:
        report.problem("C compiler", str(exc))
        compiler = None
    if compiler is not None:
        try:
            so = build_plugin(cc=compiler)
            plugin = ctypes.CDLL(str(so))
            exported = [f"ncclTunerPlugin_v{v}" for v in range(2, 7) if hasattr(plugin, f"ncclTunerPlugin_v{v}")]
            report.data["plugin"] = {"path": str(so), "exports": exported}
            if len(exported) == 5:
                report.ok("tuner plugin", f"builds: {so}")
            else:
                report.problem("tuner plugin", f"{so} exports only {', '.join(exported) or 'nothing'}")
        except (LagomError, OSError) as exc:
            report.problem("tuner plugin", str(exc).splitlines()[0])
    report.data["problems"] = report.problems
    return report


def run(args: argparse.Namespace) -> int:
    report = examine(args.cc)
    if args.json:
        print(json.dumps(report.data, indent=2))
    else:
        from rich.table import Table

        from lagom.reports.console import stdout_console

        table = Table(title="lagom doctor", show_lines=False)
        table.add_column("check")
        table.add_column("finding")
        for item, text in report.checks:
            style = "red" if text.startswith("PROBLEM") else None
            table.add_row(item, text, style=style)
        stdout_console().print(table)
        print(f"{len(report.problems)} problem(s)" + (": " + "; ".join(report.problems) if report.problems else ""))
    return 1 if report.problems else 0
