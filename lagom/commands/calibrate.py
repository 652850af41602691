"""`lagom calibrate`: fit the analytic cost model to a cluster from a few hundred measurements.

    lagom calibrate --backend sim:PRESET -o cluster.yaml [--measurements N]
        [--nccl-version X.Y.Z] [--seed N] [--json]
    torchrun --nproc_per_node 8 -m lagom calibrate --backend torch \
        --cluster NAME|FILE -o cluster.yaml

The backend times collectives alone (over sizes, algorithms, protocols, channels,
chunks, threads), a few compute kernels alone and under concurrent collectives;
least squares with a robust loss fits the model's parameters to them. The output is
the cluster file with its ``model:`` section filled: give it to ``--cluster``
anywhere (``lagom simulate --evaluator analytic``, ``lagom tune``).

``sim:PRESET`` measures the simulator of that preset (with its ~1% noise; ``--noise``
changes it). ``torch`` measures the job it runs in (run it under torchrun, every
rank runs the same plan, rank 0 fits and writes): NCCL on GPUs, gloo on CPU where
NCCL's knobs have no effect. A progress bar goes to stderr; the fit report (error
per term of the model, fitted parameters) to stdout, or JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lagom.args.common_args import (
    DEFAULT_NOISE,
    add_cluster,
    add_json,
    add_nccl_version,
    add_noise,
    add_seed,
    check_seed,
    deprecated_alias,
)
from lagom.args.knob_args import check_noise, parse_nccl_version_arg
from lagom.files.output_paths import OutputFormat, check_output, write_output
from lagom.reports.console import stdout_console
from nccl_env.errors import LagomError

CLUSTER_HEADER = "# Lagom cluster file"  # the first line of what calibrate writes (OutputFormat.CLUSTER's marker)
MEASUREMENTS_FORMAT = "lagom.calibration-measurements"
MIN_MEASUREMENTS = 20  # fewer do not pin the model's parameters down
DEFAULT_MEASUREMENTS = 300


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "calibrate",
        help="fit the cost model to a cluster (simulated, or the torchrun job it runs in)",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    parser.add_argument("--backend", required=True, metavar="sim:PRESET|torch",
                        help="what to measure: the simulator of a preset or cluster file, or torch")
    parser.add_argument("-o", "--output", metavar="FILE", help="cluster YAML to write")
    parser.add_argument("--out", dest="deprecated_out", metavar="FILE", help=argparse.SUPPRESS)  # before -o/--output
    parser.add_argument("--force", action="store_true", help="overwrite an output even if it is not a file Lagom wrote")
    parser.add_argument("--measurements", type=int, default=None, metavar="N",
                        help=f"measurements at most (default {DEFAULT_MEASUREMENTS})")
    parser.add_argument("--budget", dest="deprecated_budget", type=int, default=None, metavar="N",
                        help=argparse.SUPPRESS)  # before --measurements: lagom tune's --budget counts evaluations
    add_seed(parser)
    add_noise(parser, "the sim backend's measurements")
    add_cluster(parser, "torch backend: the hardware to start from (default low-bw)")
    add_nccl_version(parser, "default: the cluster's (torch on GPUs: the NCCL torch loaded)")
    parser.add_argument("--dump-measurements", metavar="FILE", help="also write every measurement as JSON")
    add_json(parser)
    parser.set_defaults(func=run)


def _backend(args: argparse.Namespace):
    from lagom.orchestration.tuning import MAX_BUDGET

    if args.measurements < MIN_MEASUREMENTS or args.measurements > MAX_BUDGET:
        flag = "--budget" if args.deprecated_budget is not None else "--measurements"
        raise LagomError(f"{flag} {args.measurements}: must be between {MIN_MEASUREMENTS} and {MAX_BUDGET}")
    check_noise(args.noise)
    check_seed(args.seed)
    version = parse_nccl_version_arg(args.nccl_version)
    if args.backend == "torch":
        from dataclasses import replace

        from costmodel.calibration.torch_backend import TorchBackend
        from costmodel.cluster import load_cluster

        cluster = load_cluster(args.cluster or "low-bw")
        return TorchBackend(cluster if version is None else replace(cluster, nccl_version=version))
    from costmodel.calibration.backend import backend_from_spec

    return backend_from_spec(args.backend, noise=args.noise, seed=args.seed, nccl_version=version)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from costmodel.calibration.calibrate import calibrate
    from lagom.reports.console import StageProgress

    deprecated_alias(args, "--budget", "--measurements", "deprecated_budget", "measurements", "calibrate")
    if args.measurements is None:
        args.measurements = DEFAULT_MEASUREMENTS
    if args.noise is None:
        args.noise = DEFAULT_NOISE
    out = _output(args)
    inputs = [("--cluster", args.cluster), ("--backend", args.backend.removeprefix("sim:"))]
    if args.dump_measurements:
        check_output("--dump-measurements", args.dump_measurements, OutputFormat.MEASUREMENTS, inputs + [("-o", out)],
                     force=args.force)
    backend = _backend(args)
    leader = getattr(backend, "is_leader", True)
    err = Console(stderr=True)
    with StageProgress(err, f"calibrate {backend.name}", total=args.measurements, enabled=leader) as bar:
        result = calibrate(backend, budget=args.measurements, progress=bar.update, seed=args.seed)
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    if not leader:
        return 0
    header = f"{CLUSTER_HEADER} (fitted against {result.report.backend}; --cluster takes it)\n"
    write_output(out, header + result.cluster.to_yaml(), "-o")
    if args.dump_measurements:
        document = {"format": MEASUREMENTS_FORMAT, "version": 1,
                    "measurements": [_measurement_dict(m) for m in result.measurements]}
        write_output(args.dump_measurements, json.dumps(document, indent=1), "--dump-measurements")
    report = result.report
    if args.json:
        print(json.dumps({
            "output": str(out),
            "backend": report.backend,
            "measurements": report.measurements,
            "mape_pct": report.mape_pct,
            "uncalibrated_mape_pct": report.default_mape_pct,
            "terms": [vars(r) for r in report.residuals],
            "params": {name: value for name, value, *_ in report.params},
        }, indent=2))
        return 0
    _print_report(stdout_console(), result, out)
    return 0


def _output(args: argparse.Namespace) -> Path:
    """-o/--output (or the deprecated --out, with one line saying so), checked before minutes of measuring."""
    if args.deprecated_out is not None:
        if args.output is not None:
            raise LagomError("--out is the old name of -o/--output: give one of them")
        print("lagom calibrate: warning: --out is deprecated; use -o/--output", file=sys.stderr)
        args.output = args.deprecated_out
    if args.output is None:
        raise LagomError("-o/--output FILE is required (the cluster YAML to write)")
    inputs = [("--cluster", args.cluster), ("--backend", args.backend.removeprefix("sim:"))]
    flag = "--out" if args.deprecated_out is not None else "-o"
    return check_output(flag, args.output, OutputFormat.CLUSTER, inputs, force=args.force)


def _measurement_dict(m) -> dict:
    out = {"kind": m.kind, "group": m.group, "measured_us": list(m.measured_us)}
    if m.signature is not None:
        s = m.signature
        out["signature"] = {"collective": s.collective.value, "message_bytes": s.message_bytes,
                            "ranks": s.ranks, "nodes": s.nodes}
    if m.config is not None:
        out["config"] = m.config.to_dict()
    if m.op is not None:
        out["compute"] = {"name": m.op.name, "alone_us": m.op.duration_us}
    return out


def _print_report(console, result, out: Path) -> None:
    from rich.table import Table

    report = result.report
    terms = Table(title=f"fit against {report.backend}: {report.measurements} measurements", title_justify="left")
    for col in ("term", "n", "MAPE %", "max |err| %", "bias %"):
        terms.add_column(col, justify="left" if col == "term" else "right")
    for r in report.residuals:
        terms.add_row(r.term, str(r.count), f"{r.mape_pct:.2f}", f"{r.max_abs_pct:.2f}", f"{r.bias_pct:+.2f}")
    terms.add_row("all", "", f"{report.mape_pct:.2f}", "", "", style="bold")
    terms.add_row("all, uncalibrated", "", f"{report.default_mape_pct:.2f}", "", "", style="dim")
    console.print(terms)
    params = Table(title="fitted parameters (model: section)", title_justify="left")
    for col in ("parameter", "term", "fitted", "hardware default"):
        params.add_column(col, justify="left" if col in ("parameter", "term") else "right")
    for name, value, default, term, fitted in report.params:
        params.add_row(name, term, f"{value:.4g}", f"{default:.4g}", style=None if fitted else "dim")
    console.print(params)
    print(f"wrote {out}", file=sys.stderr)
