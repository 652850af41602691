"""`lagom simulate WORKLOAD [--cluster NAME|FILE]`: one iteration on a virtual cluster.

WORKLOAD is a profiler trace (file or directory; rank 0), a Lagom workload JSON file,
or a spec string such as ``fsdp:llama3-8b:gpus=16``, ``tp:phi2:tp=8,dp=2``, ``ep:olmoe:ep=8``.
--cluster is required for a spec or a workload file; for a trace it defaults to the
preset for the trace's GPU, with the NCCL version the trace ran (lagom/trace_context.py).

A trace is replayed (docs/replay.md): its execution graph scheduled with the measured
times, which the evaluator only scales by the ratio its mechanism gives between the
plan and the trace's recorded settings. With neither --config nor --set the plan is the
trace's own recorded settings, so the replay reproduces the trace. Figures are per
profiler step (the mean over the trace's complete steps) and every step is listed;
``--json`` adds ``"steps": [{"name", "iteration_us", "comm_us", "exposed_comm_us",
"measured_iteration_us", "measured_comm_us", "measured_exposed_comm_us", ...}]`` and
``"replay": {"median_step_error_pct", "comm_error_pct", "exposed_error_pct", ...}`` (the
replay under the recorded settings against the trace).

For other workloads every collective runs with NCCL's modelled default choice, unless ``--set`` gives one
CommConfig for all of them (``--set channels=16,chunk=2MiB``; keys channels, threads,
chunk, algorithm, protocol; sizes take B/KB/KiB/MB/MiB, binary; values must be valid on
the cluster's NCCL version; the evaluators model algorithm ring and tree) or ``--config`` applies a
tuned file from ``lagom tune`` (``--set`` then fills what the file leaves to NCCL).

Prints the iteration time, compute busy time, communication busy and exposed time, and
the slowdown of compute caused by contention; ``--json`` prints ``{"iteration_us",
"compute_us", "comm_us", "exposed_comm_us", "compute_uncontended_us",
"compute_slowdown", "evaluations", "cluster", "workload", "evaluator", "ops", "collectives"}``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from costmodel.evaluator import check_config
from lagom.rank_args import add_arguments, reading_from_args
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan

EVALUATORS = ("sim", "analytic")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate",
        help="one iteration of a workload on a virtual cluster",
        description=__doc__,
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="trace, workload JSON, or spec string")
    parser.add_argument("--cluster", default=None, metavar="NAME|FILE",
                        help="preset name or cluster YAML (for a trace, default: the preset for its GPU)")
    parser.add_argument("--evaluator", choices=EVALUATORS, default="sim",
                        help="sim: the simulator (default); analytic: Lagom's cost model")
    parser.add_argument("--set", dest="set_config", metavar="KNOB=VALUE,...",
                        help="one CommConfig for every collective, e.g. channels=16,chunk=2MiB")
    parser.add_argument("--config", metavar="lagom.yaml", help="apply a tuned-config file")
    parser.add_argument("--noise", type=float, default=0.01,
                        help="multiplicative noise (std. dev., default 0.01; 0 = exact)")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lagom.knob_args import parse_set
    from lagom.trace_context import resolve_cluster
    from lagom.workload_arg import read_workload_arg

    if not (math.isfinite(args.noise) and args.noise >= 0):
        raise LagomError(f"--noise must be a finite number >= 0, got {args.noise}")
    if args.seed < 0:
        raise LagomError(f"--seed must be >= 0, got {args.seed}")
    workload, from_trace = read_workload_arg(args.workload, reading_from_args(args))
    choice = resolve_cluster(workload, from_trace, args.cluster)
    cluster = choice.cluster
    # the settings a file or --set gives reach NCCL's collectives of known size only (CollectiveOp.tunable)
    signatures = sorted({workload.signature(c, cluster.gpus_per_node) for c in workload.collectives if c.tunable})
    from lagom.workload_fit import fit_warnings, unmatched_config_warning

    for note in choice.notes:
        print(f"note: {note}", file=sys.stderr)
    warnings = choice.warnings + fit_warnings(workload, cluster)
    from nccl_env.rules import NcclVersion, validate_config

    version = NcclVersion.parse(cluster.nccl_version)  # checked when the cluster was loaded

    def check(config, origin: str) -> None:
        """Values the cluster's NCCL would refuse, or the evaluators cannot model, are an error."""
        try:
            validate_config(config, version)
        except LagomError as exc:
            raise LagomError(f"{origin}: {exc}") from None
        check_config(config, origin)

    plan = Plan()
    if args.config:
        from lagom.tuned_config import load_tuned_config

        tuned = load_tuned_config(args.config)
        for i, entry in enumerate(tuned.collectives):
            check(entry.config, f"{args.config}: collectives[{i}]")
        plan = tuned.to_plan(signatures)
        unmatched = unmatched_config_warning(args.config, len(tuned.collectives), signatures, plan)
        if unmatched:
            warnings.append(unmatched)
    if args.set_config:
        forced = parse_set(args.set_config)
        check(forced, "--set")
        plan = Plan(entries={sig: plan.config_for(sig).merged_over(forced) for sig in signatures}, default=forced)
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    from lagom.tuning import make_evaluator

    evaluator = make_evaluator(args.evaluator, cluster, args.noise, args.seed)
    timing = evaluator.evaluate(workload, plan)
    result = {
        "iteration_us": round(timing.iteration_us, 3),
        "compute_us": round(timing.compute_us, 3),
        "comm_us": round(timing.comm_us, 3),
        "exposed_comm_us": round(timing.exposed_comm_us, 3),
        "compute_uncontended_us": round(timing.compute_uncontended_us, 3),
        "compute_slowdown": round(timing.compute_slowdown, 4),
        "evaluations": evaluator.evaluations,
        "cluster": cluster.name,
        "workload": workload.source or args.workload,
        "evaluator": args.evaluator,
        "ops": len(workload.compute_ops) + len(workload.collectives),
        "collectives": len(workload.collectives),
    }
    fid = None
    if timing.steps:
        from costmodel.replay.schedule import fidelity

        result["steps"] = [st.to_dict() for st in timing.steps]
        fid = fidelity(timing if not plan.entries and plan.default == CommConfig()
                       else evaluator.evaluate(workload, Plan()))
        result["replay"] = fid.to_dict() if fid is not None else None
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.console import Console
    from rich.table import Table

    per = " per step" if timing.steps else ""
    from pathlib import Path

    table = Table(title=f"{Path(str(result['workload'])).name} on {cluster.name} ({args.evaluator}){per}")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_row("iteration (Z)", f"{timing.iteration_us / 1e3:,.2f} ms")
    table.add_row("compute busy (Y)", f"{timing.compute_us / 1e3:,.2f} ms")
    table.add_row("communication busy (X)", f"{timing.comm_us / 1e3:,.2f} ms")
    table.add_row("exposed communication", f"{timing.exposed_comm_us / 1e3:,.2f} ms")
    table.add_row("compute without contention", f"{timing.compute_uncontended_us / 1e3:,.2f} ms")
    table.add_row("compute slowdown from contention", f"{timing.compute_slowdown:.3f}x")
    table.add_row("ops / collectives", f"{result['ops']} / {result['collectives']}")
    console = Console(file=sys.stdout, width=100)
    console.print(table)
    if timing.steps:
        from lagom.replay_report import fidelity_line, steps_table

        console.print(steps_table(timing.steps))
        if fid is not None:
            console.print(fidelity_line(fid), highlight=False)
    return 0
