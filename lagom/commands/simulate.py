"""`lagom simulate WORKLOAD [--cluster NAME|FILE] [--nccl-version X.Y.Z]`: one iteration on a virtual cluster.

WORKLOAD is a profiler trace (a file; a directory of ranks: every rank replayed jointly, a
step's time the job's, the slowest rank's, ``--rank N`` for rank N alone; docs/replay.md
"Every rank at once"), a Lagom workload JSON file,
or a spec string such as ``fsdp:llama3-8b:gpus=16``, ``tp:phi2:tp=8,dp=2``, ``ep:olmoe:ep=8``.
--cluster is required for a spec or a workload file; for a trace it defaults to the
preset for the trace's GPU, with the NCCL version the trace ran (lagom/orchestration/trace_context.py).
--nccl-version sets the NCCL modelled; without it a --config file's own ``nccl_version``
(the one ``lagom tune`` tuned for) is honoured, else the trace's, else the cluster's.

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
original's layout and names (lagom/files/trace_export.py), to open beside the measured one.
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
A what-if on a trace (``--scale``, ``--set``, ``--config``) prints its figures beside the
trace's measured ones, labelled; ``--json`` adds ``"whatif": true`` and ``"measured":
{"iteration_us", "compute_us", "comm_us", "exposed_comm_us"}`` (the trace's means).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from costmodel.evaluator import DurationScale, StepTiming, check_config
from lagom.args.common_args import (
    DEFAULT_NOISE,
    add_cluster,
    add_evaluator,
    add_json,
    add_nccl_version,
    add_noise,
    add_seed,
    check_seed,
)
from lagom.args.knob_args import check_noise, parse_nccl_version_arg
from lagom.args.rank_args import add_arguments, reading_from_args
from lagom.files.trace_export import check_export_path, export_trace
from lagom.reports.record_overhead import check_recorded_steps, unprofiled_cpu, unprofiled_line
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan

SIMULATE_EVALUATOR = "sim"  # one run asked for: the simulator's answer, not the model fitted to it


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate",
        help="one iteration of a workload on a virtual cluster",
        description=__doc__,
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="trace, workload JSON, or spec string")
    add_cluster(parser, "for a trace, default: the preset for its GPU")
    add_nccl_version(parser, "default: the --config file's, else the trace's, else the cluster's")
    add_evaluator(parser, SIMULATE_EVALUATOR, "one run: the simulator itself, not the model fitted to it")
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
    add_noise(parser, "a spec or workload file only (a trace replays its measured times)")
    add_seed(parser)
    parser.add_argument("--export-trace", metavar="OUT.json.gz",
                        help="a trace: write the prediction as a Kineto trace (Perfetto, TensorBoard, HTA open it)")
    parser.add_argument("--force", action="store_true",
                        help="let --export-trace replace a file that is not a trace Lagom exported")
    add_json(parser)
    add_arguments(parser)
    parser.set_defaults(func=run)


def measured_means(steps: list[StepTiming]) -> dict[str, float]:
    """What the trace measured, the mean over its complete steps (us): the figures a what-if's
    summary stands beside."""
    n = len(steps)
    return {"iteration_us": round(sum(s.measured_iteration_us for s in steps) / n, 3),
            "compute_us": round(sum(s.measured_compute_us for s in steps) / n, 3),
            "comm_us": round(sum(s.measured_comm_us for s in steps) / n, 3),
            "exposed_comm_us": round(sum(s.measured_exposed_comm_us for s in steps) / n, 3)}


def _file_nccl_version(path: str) -> str | None:
    """The ``nccl_version`` a tuned file records (None when it records none); the file itself is
    checked later, by NCCL's rules for the version in force."""
    from nccl_env.files import check_not_empty, read_yaml

    check_not_empty(path, "--config")
    data = read_yaml(Path(path))
    value = data.get("nccl_version") if isinstance(data, dict) else None
    return value if isinstance(value, str) and value.strip() else None


def run(args: argparse.Namespace) -> int:
    from lagom.args.knob_args import parse_set
    from lagom.orchestration.trace_context import resolve_cluster

    if args.noise is not None:
        check_noise(args.noise)
    check_seed(args.seed)
    evaluator_name = args.evaluator or SIMULATE_EVALUATOR
    export = (check_export_path(args.export_trace, [("WORKLOAD", args.workload), ("--config", args.config)],
                                force=args.force) if args.export_trace else None)
    from lagom.orchestration.joint_run import read_workload_or_ranks

    given = read_workload_or_ranks(args.workload, args.rank, reading_from_args(args), joint=not args.unprofiled_cpu)
    workload, from_trace, workloads = given.workload, given.from_trace, given.workloads  # workloads: replayed jointly
    if args.scale and from_trace:  # a rank the input lacks: refused before any work, on a file as on a folder
        from lagom.orchestration.joint_run import check_scale_ranks, parse_scale_items

        check_scale_ranks(parse_scale_items(args.scale), given.ranks, args.workload)
    if export is not None and not from_trace:
        raise LagomError("--export-trace: applies to a trace (WORKLOAD is not a trace)")
    if args.unprofiled_cpu:
        check_recorded_steps(workload, from_trace)
    if from_trace and args.noise:
        raise LagomError("--noise: a trace is replayed from its measured times, which no noise changes; drop --noise")
    nccl_version = parse_nccl_version_arg(args.nccl_version)
    version_from = "--nccl-version"
    if nccl_version is None and args.config:  # the NCCL the file was tuned for, unless the flag says otherwise
        nccl_version = parse_nccl_version_arg(_file_nccl_version(args.config), f"{args.config}: nccl_version")
        version_from = f"{args.config}'s nccl_version"
    choice = resolve_cluster(workload, from_trace, args.cluster, nccl_version, version_from, "modelling")
    cluster = choice.cluster
    from lagom.orchestration.joint_run import bound_transfers, bounded_line

    joined = bound_transfers(given.read, cluster) if from_trace else None  # waits where the cluster bounds them
    # the settings a file or --set gives reach NCCL's collectives of known size only (CollectiveOp.tunable)
    signatures = sorted({w.signature(c, cluster.gpus_per_node) for w in workloads or [workload]
                         for c in w.collectives if c.tunable})
    from lagom.reports.workload_fit import fit_warnings, unmatched_config_warning

    for note in choice.notes:
        print(f"note: {note}", file=sys.stderr)
    if from_trace:
        from costmodel.nccl_defaults import disagreement_line, recorded_pick_disagreements

        picked = disagreement_line(cluster, recorded_pick_disagreements(cluster, workload))
        if picked:
            print(f"note: {picked}", file=sys.stderr)
    warnings = choice.warnings + fit_warnings(workload, cluster)
    from nccl_env.rules import validate_config

    version = cluster.nccl_version

    def check(config, origin: str) -> None:
        """Values the cluster's NCCL would refuse, or the evaluators cannot model, are an error."""
        try:
            validate_config(config, version)
        except LagomError as exc:
            raise LagomError(f"{origin}: {exc}") from None
        check_config(config, origin, cluster)

    plan = Plan()
    if args.config:
        from lagom.files.tuned_config import absent_group_warning, load_tuned_config

        tuned = load_tuned_config(args.config, version)  # NCCL's rules for the cluster's version
        absent = absent_group_warning(args.config, tuned, {c.group for w in workloads or [workload]
                                                           for c in w.collectives}, "the job")
        if absent:
            warnings.append(absent)
        for i, entry in enumerate(tuned.collectives):
            check_config(entry.config, f"{args.config}: collectives[{i}]", cluster)  # and what the evaluators model
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
    bounded = bounded_line(joined, cluster.name)
    if bounded:
        print(f"note: {bounded}", file=sys.stderr)
    from lagom.orchestration.joint_run import (
        JointEvaluator,
        joint_identity,
        joint_line,
        parse_scale_items,
        rank_scales,
        scale_for_rank,
    )
    from lagom.orchestration.tuning import make_evaluator

    items = parse_scale_items(args.scale) if args.scale else []
    scale = scale_for_rank(items, workload.rank) if items else None
    if items and not from_trace:
        raise LagomError("--scale: applies to a trace's measured times (WORKLOAD is not a trace)")
    noise = 0.0 if from_trace else DEFAULT_NOISE if args.noise is None else args.noise
    evaluator = make_evaluator(evaluator_name, cluster, noise, args.seed, workload)
    if args.unprofiled_cpu:
        if scale is not None and scale.cpu != 1.0:
            raise LagomError("--unprofiled-cpu chooses the CPU's scale itself: drop cpu= from --scale")
        found = unprofiled_cpu(evaluator, workload)
        print(unprofiled_line(found), file=sys.stderr)
        scale = replace(scale or DurationScale(), cpu=found.cpu)
    joint, jev = None, None
    if workloads is not None:
        jev = JointEvaluator(evaluator, workloads, rank_scales(items, [w.rank for w in workloads]), joined)
        joint = jev.joint(plan)
        timing = jev.timing_of(joint, workload.rank)
    else:
        timing = evaluator.evaluate(workload, plan, scale)
    result: dict[str, Any] = {
        "iteration_us": round(timing.iteration_us, 3),
        "compute_us": round(timing.compute_us, 3),
        "comm_us": round(timing.comm_us, 3),
        "exposed_comm_us": round(timing.exposed_comm_us, 3),
        "compute_uncontended_us": round(timing.compute_uncontended_us, 3),
        "compute_slowdown": round(timing.compute_slowdown, 4),
        "evaluations": evaluator.evaluations,
        "cluster": cluster.name,
        "workload": workload.source or args.workload,
        "evaluator": evaluator_name,
        "ops": len(workload.compute_ops) + len(workload.collectives),
        "collectives": len(workload.collectives),
    }
    fid = None
    whatif = bool(plan.entries) or plan.default != CommConfig() or scale is not None
    if timing.steps:
        from costmodel.replay.fidelity import fidelity

        result["steps"] = [st.to_dict() for st in timing.steps]
        own = not plan.entries and plan.default == CommConfig() and not items
        fid = fidelity(timing if own else joint_identity(jev) if jev is not None
                       else evaluator.evaluate(workload, Plan()))
        result["replay"] = fid.to_dict() if fid is not None else None
        if not own:  # the figures above are the what-if's; what the trace measured, per step, beside them
            result["whatif"] = True
            result["measured"] = measured_means(timing.steps)
    if joint is not None:
        from lagom.orchestration.joint_run import joint_json, ranks_json

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
        export_trace(workload, timing_export, export, what, scale.cpu if scale is not None else 1.0)
        result["export_trace"] = str(export)
        print(f"prediction written to {export} ({what})", file=sys.stderr)
    if joint is not None:  # the figures are the job's: per step its slowest rank's
        slow = sorted(set(joint.slowest))
        whose = (f"{Path(args.workload).name}: {len(joint.ranks)} ranks, the job's step (its slowest "
                 f"rank{'s' if len(slow) > 1 else ''}: {', '.join(map(str, slow))})")
    else:
        whose = Path(str(result["workload"])).name + (f" (rank {workload.rank})" if from_trace else "")
    result["figures_of"] = whose
    if args.json:
        print(json.dumps(result))
        return 0
    from rich.table import Table

    from lagom.reports.console import stdout_console

    per = " per step" if timing.steps else ""

    measured = result.get("measured")
    table = Table(title=f"{whose} on {cluster.name} ({evaluator_name}){per}")
    table.add_column("quantity")
    if measured:
        table.add_column("measured", justify="right")
    table.add_column("what-if" if measured else "value", justify="right")

    def add(label: str, value: str, key: str | None = None, same: bool = False) -> None:
        """A row; beside a what-if, the measured figure ``key`` first (``same``: the trace's, as is)."""
        if measured:
            table.add_row(label, value if same else "-" if key is None else f"{measured[key] / 1e3:,.2f} ms", value)
        else:
            table.add_row(label, value)

    add("iteration (Z)", f"{timing.iteration_us / 1e3:,.2f} ms", "iteration_us")
    add("compute busy (Y)", f"{timing.compute_us / 1e3:,.2f} ms", "compute_us")
    add("communication busy (X)", f"{timing.comm_us / 1e3:,.2f} ms", "comm_us")
    add("exposed communication", f"{timing.exposed_comm_us / 1e3:,.2f} ms", "exposed_comm_us")
    add("compute without contention", f"{timing.compute_uncontended_us / 1e3:,.2f} ms")
    add("compute slowdown from contention", f"{timing.compute_slowdown:.3f}x")
    add(f"ops / collectives (rank {workload.rank})" if joint is not None else "ops / collectives",
        f"{result['ops']} / {result['collectives']}", same=True)
    console = stdout_console()
    console.print(table)
    if timing.steps:
        from lagom.reports.replay_report import fidelity_line, steps_table

        console.print(steps_table(timing.steps, whatif=whatif))
        if fid is not None:
            console.print(fidelity_line(fid), highlight=False)
    return 0
