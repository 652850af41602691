"""`lagom simulate WORKLOAD [--cluster NAME|FILE]`: one iteration on a virtual cluster.

WORKLOAD is a profiler trace (a file; a directory of ranks: every rank replayed jointly, a
step's time the job's, the slowest rank's, ``--rank N`` for rank N alone; docs/replay.md
"Every rank at once"), a Lagom workload JSON file,
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

``--scale comm=F`` / ``compute=F`` / ``cpu=F`` (a trace only; several in one flag as
``comm=F,compute=G``; ``compute=F@5`` or ``comm=F@0-3`` on those ranks only) asks a
what-if first: every collective's (every compute kernel's; the CPU's own time between
calls) measured time times F, and the replay's schedule follows; the plan, if any,
applies on top. ``replay`` stays the fidelity under the trace's own times.
``--export-trace OUT.json.gz`` writes the prediction as a Kineto trace with the
original's layout and names (lagom/trace_export.py), to open beside the measured one.
``--unprofiled-cpu`` (a trace ``lagom record`` wrote, with the steps it timed without
the profiler) scales the CPU's time between calls so that the replay runs at that
unprofiled step, before anything else applies (docs/replay.md).

For other workloads every collective runs with NCCL's modelled default choice, unless ``--set`` gives one
CommConfig for all of them (``--set channels=16,chunk=2MiB``; keys channels, threads,
chunk, algorithm, protocol, path (sm, symmetric, copy_engine, efficiency: docs/tuner.md
"Paths"); sizes take B/KB/KiB/MB/MiB, binary; values must be valid on the cluster's NCCL
version; the evaluators model algorithm ring and tree) or ``--config`` applies a
tuned file from ``lagom tune`` (``--set`` then fills what the file leaves to NCCL).

Prints the iteration time, compute busy time, communication busy and exposed time, and
the slowdown of compute caused by contention; ``--json`` prints ``{"iteration_us",
"compute_us", "comm_us", "exposed_comm_us", "compute_uncontended_us",
"compute_slowdown", "evaluations", "cluster", "workload", "evaluator", "ops", "collectives"}``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from costmodel.evaluator import DurationScale, check_config
from lagom.knob_args import NOISE_RANGE, check_noise
from lagom.rank_args import add_arguments, reading_from_args
from lagom.record_overhead import check_recorded_steps, unprofiled_cpu, unprofiled_line
from lagom.trace_export import check_export_path, export_trace
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan

EVALUATORS = ("sim", "analytic")
DEFAULT_NOISE = 0.01  # the simulator's run-to-run spread for a spec or workload file


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
    parser.add_argument("--scale", action="append", metavar="comm=F|compute=F|cpu=F[@RANKS]",
                        help="a trace's what-if: each collective's (compute kernel's, CPU gap's) measured time "
                             "times F; @5 or @0-3: on those ranks only")
    parser.add_argument("--rank", type=int, default=None, metavar="N",
                        help="a folder of ranks: replay rank N alone (default: every rank jointly)")
    parser.add_argument("--unprofiled-cpu", action="store_true",
                        help="a trace from lagom record: scale the CPU's time to the step measured without the "
                             "profiler")
    parser.add_argument("--noise", type=float, default=None,
                        help=f"multiplicative noise in {NOISE_RANGE} (std. dev., default 0.01; 0 = exact); a trace is "
                             "replayed from its measured times: no noise")
    parser.add_argument("--seed", type=int, default=0, help="noise seed (default 0)")
    parser.add_argument("--export-trace", metavar="OUT.json.gz",
                        help="a trace: write the prediction as a Kineto trace (Perfetto, TensorBoard, HTA open it)")
    parser.add_argument("--force", action="store_true",
                        help="let --export-trace replace a file that is not a trace Lagom exported")
    parser.add_argument("--json", action="store_true", help="print a JSON object instead of a table")
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lagom.knob_args import parse_set
    from lagom.trace_context import resolve_cluster
    from lagom.workload_arg import read_workload_arg

    if args.noise is not None:
        check_noise(args.noise)
    if args.seed < 0:
        raise LagomError(f"--seed must be >= 0, got {args.seed}")
    export = (check_export_path(args.export_trace, [("WORKLOAD", args.workload), ("--config", args.config)],
                                force=args.force) if args.export_trace else None)
    from lagom.joint_run import read_folder_ranks

    folder = None if args.unprofiled_cpu else read_folder_ranks(args.workload, args.rank, reading_from_args(args))
    workloads = folder[1] if folder is not None else None  # every rank, replayed jointly
    if folder is not None:
        workload, from_trace = folder[0], True
    else:
        workload, from_trace = read_workload_arg(args.workload, reading_from_args(args))
    if export is not None and not from_trace:
        raise LagomError("--export-trace: applies to a trace (WORKLOAD is not a trace)")
    if args.unprofiled_cpu:
        check_recorded_steps(workload, from_trace)
    if from_trace and args.noise:
        raise LagomError("--noise: a trace is replayed from its measured times, which no noise changes; drop --noise")
    choice = resolve_cluster(workload, from_trace, args.cluster)
    cluster = choice.cluster
    # the settings a file or --set gives reach NCCL's collectives of known size only (CollectiveOp.tunable)
    signatures = sorted({w.signature(c, cluster.gpus_per_node) for w in workloads or [workload]
                         for c in w.collectives if c.tunable})
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

        tuned = load_tuned_config(args.config, version)  # NCCL's rules for the cluster's version
        for i, entry in enumerate(tuned.collectives):
            check_config(entry.config, f"{args.config}: collectives[{i}]")  # and what the evaluators model
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
    from lagom.joint_run import (
        JointEvaluator,
        joint_identity,
        joint_line,
        parse_scale_items,
        rank_scales,
        scale_for_rank,
    )
    from lagom.tuning import make_evaluator

    items = parse_scale_items(args.scale) if args.scale else []
    scale = scale_for_rank(items, workload.rank) if items else None
    if items and not from_trace:
        raise LagomError("--scale: applies to a trace's measured times (WORKLOAD is not a trace)")
    noise = 0.0 if from_trace else DEFAULT_NOISE if args.noise is None else args.noise
    evaluator = make_evaluator(args.evaluator, cluster, noise, args.seed)
    if args.unprofiled_cpu:
        if scale is not None and scale.cpu != 1.0:
            raise LagomError("--unprofiled-cpu chooses the CPU's scale itself: drop cpu= from --scale")
        found = unprofiled_cpu(evaluator, workload)
        print(unprofiled_line(found), file=sys.stderr)
        scale = replace(scale or DurationScale(), cpu=found.cpu)
    joint, jev = None, None
    if workloads is not None:
        jev = JointEvaluator(evaluator, workloads, rank_scales(items, [w.rank for w in workloads]))
        joint = jev.joint(plan)
        timing = jev.timing_of(joint, workload.rank)
    else:
        timing = evaluator.evaluate(workload, plan, scale)
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
        from costmodel.replay.fidelity import fidelity

        result["steps"] = [st.to_dict() for st in timing.steps]
        own = not plan.entries and plan.default == CommConfig() and not items
        fid = fidelity(timing if own else joint_identity(jev) if jev is not None
                       else evaluator.evaluate(workload, Plan()))
        result["replay"] = fid.to_dict() if fid is not None else None
    if joint is not None:
        from lagom.joint_run import joint_json, ranks_json

        result["ranks"] = ranks_json(joint)
        result["joint"] = joint_json(joint)
        print(joint_line(joint), file=sys.stderr)
        timing_export = joint.ranks[workload.rank]
    else:
        timing_export = timing
    if export is not None:
        what = ", ".join([*([f"--config {args.config}"] if args.config else []),
                          *([f"--set {args.set_config}"] if args.set_config else []),
                          *([f"--scale {','.join(args.scale)}"] if args.scale else [])]) or "the recorded settings"
        export_trace(workload, timing_export, export, what)
        result["export_trace"] = str(export)
        print(f"prediction written to {export} ({what})", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.table import Table

    from lagom.console import stdout_console

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
    console = stdout_console()
    console.print(table)
    if timing.steps:
        from lagom.replay_report import fidelity_line, steps_table

        console.print(steps_table(timing.steps))
        if fid is not None:
            console.print(fidelity_line(fid), highlight=False)
    return 0
