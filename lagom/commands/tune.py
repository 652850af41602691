"""`lagom tune WORKLOAD [--cluster NAME|FILE] -o lagom.yaml`: per-collective NCCL settings for a workload.

WORKLOAD is a profiler trace, a workload JSON file or a generator spec such as
``fsdp:llama3-8b:gpus=16`` (as in ``lagom simulate``). A directory of ranks is replayed
jointly and every plan judged on the job's step, the slowest rank's (``--rank N``: rank N
alone; docs/replay.md "Every rank at once"). For a trace, its own metadata
decides what --cluster and --nccl-version leave open: the preset for its GPU, sized to
its world, and the NCCL version it ran (lagom/orchestration/trace_context.py); a given value that
disagrees with the trace gets one warning line. A trace of an AMD GPU (RCCL) or of
one rank is not NCCL's to tune: one line, exit 2. Collectives the trace records no
size for, and communication kernels that are not NCCL's, are left out of tuning
(one warning line each kind); NCCL decides for them. The search (``--method``,
default Lagom's priority search) asks an evaluator (``--evaluator``: the fitted
``analytic`` cost model, calibrated against ``sim:PRESET`` and cached when --cluster
names a preset, or the ``sim`` simulator) for predicted iteration times;
NCCL's default and AutoCCL are evaluated on the same evaluator for comparison.

The table has one row per collective signature (collective[group] bytes x ranks /
nodes): NCCL's settings and the tuned ones in one cell (algorithm/protocol, nc
channels, nt threads, c chunk; nc2>3 means NCCL's 2, tuned 3), the signature's total
collective time and the slowdown of the compute it overlaps (contended /
uncontended), each as NCCL>tuned. --json adds, per signature, the order in which
Lagom's priority search finished the unit that holds its channels, with its last
priority H (compute time added per communication time saved).

For a trace the evaluator replays the trace (docs/replay.md): after the ``why:`` lines,
one line gives the replay's fidelity under the trace's own settings ("the model reproduces
N steps of this trace within X%"), with a warning past 10% naming the part that differs; times are
per profiler step (the mean over the complete steps) and every step is listed. A trace
from ``lagom record`` adds the profiler's overhead (one line; --json "profiler_overhead").
A trace whose collectives all ran on the CPU (gloo) has no NCCL kernel to replay: with
--cluster the figures are the model's for its collectives on that cluster, and one
warning line says so.

Where the NCCL version and the cluster have them, a process group may move its
collectives on symmetric kernels or the copy engines (docs/tuner.md "Paths"): the row
then reads "... > copy engine", and ``requires:`` lines (also in the file) say what to
turn on that Lagom cannot (registered buffers: FSDP2's ``set_symm_mem_for_comm``; the
torch, NCCL and driver versions).

Process-wide changes (env, process-group CTAs) and per-collective entries are written
only when the predicted gain is at least ``--min-gain`` (default 0.01 = 1%); otherwise
the file keeps NCCL's defaults and its notes say why.

``--unprofiled-cpu`` (a trace ``lagom record`` wrote) replays every plan with the CPU's
time between calls scaled so that the trace's own settings run at the step it timed
without the profiler (docs/replay.md).

``--export-trace OUT.json.gz`` (a trace) writes the tuned plan's predicted steps as a
Kineto trace with the original's layout (lagom/files/trace_export.py).

Writes the tuned-config file (``-o``, default lagom.yaml; an existing file is replaced
only if Lagom wrote it, else give ``--force``; never the input); ``--json`` prints
``{"baseline_us", "tuned_us", "autoccl_us", "speedup_vs_nccl", "speedup_vs_autoccl",
"evaluations" (every evaluation tune ran: the method's, NCCL's default and AutoCCL's
comparison, which reuses what the method already measured), "evaluations_by_method",
"replay" (traces), "steps" (traces), ...}`` to stdout instead of the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from costmodel.evaluator import DurationScale, Evaluator
from costmodel.replay.fidelity import fidelity
from lagom.args.common_args import add_cluster, add_evaluator, add_json, add_nccl_version, add_seed, check_seed
from lagom.args.knob_args import parse_nccl_version_arg
from lagom.args.rank_args import add_arguments, reading_from_args
from lagom.files.output_paths import OutputFormat, check_output
from lagom.files.trace_export import check_export_path, export_trace
from lagom.files.tuned_config import stored_path
from lagom.orchestration import tuning
from lagom.orchestration.trace_context import refuse_to_tune, resolve_cluster
from lagom.reports.console import StageProgress, mib, stdout_console
from lagom.reports.record_overhead import (
    check_recorded_steps,
    overhead_line,
    profiler_overhead,
    unprofiled_cpu,
    unprofiled_line,
)
from lagom.reports.replay_report import fidelity_line, fidelity_warning, steps_table
from lagom.reports.tune_report import JobView, tune_report
from lagom.reports.workload_fit import fit_warnings, untunable_warnings
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, PROTOCOL, REPORT_ORDER, value_of
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan
from nccl_env.rules import Mechanism
from tuner import METHODS


def register(sub: argparse._SubParsersAction) -> None:
    doc = __doc__ or ""
    parser = sub.add_parser(
        "tune", help="tuned per-collective NCCL settings for a workload", description=doc,
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="trace, workload JSON file or generator spec")
    add_cluster(parser, "for a trace, default: the preset for its GPU")
    add_evaluator(parser, tuning.DEFAULT_EVALUATOR, "a search asks hundreds of times: the fast model")
    parser.add_argument("--method", choices=sorted(METHODS), default="lagom", help="search method (default lagom)")
    add_nccl_version(parser, "default: the trace's, else the cluster's")
    parser.add_argument("--budget", type=int, default=None, metavar="N",
                        help="at most N evaluations by the search method (default: its own rule)")
    add_seed(parser)
    parser.add_argument("-o", "--output", default="lagom.yaml", metavar="FILE",
                        help="tuned-config file to write (default lagom.yaml)")
    parser.add_argument("--force", action="store_true", help="overwrite -o even if it is not a file Lagom wrote")
    parser.add_argument("--no-autoccl", action="store_true", help="skip the AutoCCL comparison")
    parser.add_argument("--min-gain", type=float, default=tuning.MIN_GAIN, metavar="F",
                        help="write changes only for a predicted gain of at least F (default 0.01 = 1%%)")
    parser.add_argument("--unprofiled-cpu", action="store_true",
                        help="a trace from lagom record: replay with the CPU's time scaled to the step measured "
                             "without the profiler")
    parser.add_argument("--export-trace", metavar="OUT.json.gz",
                        help="a trace: write the tuned plan's predicted steps as a Kineto trace (Perfetto, HTA)")
    add_json(parser)
    parser.add_argument("--rank", type=int, default=None, metavar="N",
                        help="a folder of ranks: tune on rank N replayed alone (default: every rank jointly, a plan "
                             "judged on the job's step)")
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_seed(args.seed)
    if not (args.min_gain >= 0 and args.min_gain < 10):
        raise LagomError(f"--min-gain {args.min_gain}: must be a fraction >= 0 (0.01 = 1%)")
    if args.budget is not None and not 1 <= args.budget <= tuning.MAX_BUDGET:
        raise LagomError(f"--budget {args.budget}: must be between 1 and {tuning.MAX_BUDGET} evaluations")
    check_output("-o", args.output, OutputFormat.TUNED_CONFIG, force=args.force,
                 inputs=[("WORKLOAD", args.workload), ("--cluster", args.cluster)])
    export = (check_export_path(args.export_trace, [("WORKLOAD", args.workload), ("-o", args.output)],
                                force=args.force) if args.export_trace else None)
    if export is not None and export.resolve() == Path(args.output).resolve():
        raise LagomError(f"--export-trace {args.export_trace}: is also -o's file; give them two names")
    from lagom.orchestration.joint_run import (
        JointEvaluator,
        bound_transfers,
        bounded_line,
        joint_line,
        read_workload_or_ranks,
    )

    given = read_workload_or_ranks(args.workload, args.rank, reading_from_args(args), joint=not args.unprofiled_cpu)
    workload, from_trace, workloads = given.workload, given.from_trace, given.workloads  # workloads: replayed jointly
    if export is not None and not from_trace:
        raise LagomError("--export-trace: applies to a trace (WORKLOAD is not a trace)")
    if args.unprofiled_cpu:
        check_recorded_steps(workload, from_trace)
    refusal = refuse_to_tune(workload, cluster_given=args.cluster is not None) if from_trace else None
    if refusal:
        raise LagomError(refusal)
    cpu_only = bool(from_trace and workload.collectives and not any(c.on_gpu for c in workload.collectives))
    choice = resolve_cluster(workload, from_trace, args.cluster, parse_nccl_version_arg(args.nccl_version))
    cluster = choice.cluster
    evaluator_name = args.evaluator or tuning.DEFAULT_EVALUATOR
    err = Console(stderr=True)
    for note in choice.notes:
        err.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if from_trace:
        from costmodel.nccl_defaults import disagreement_line, recorded_pick_disagreements

        picked = disagreement_line(choice.cluster, recorded_pick_disagreements(choice.cluster, workload))
        if picked:
            err.print(f"note: {picked}", highlight=False, markup=False, soft_wrap=True)
    if cpu_only:
        choice.warnings.append(f"{workload.source}: its collectives ran on the CPU (no NCCL kernels: a gloo job): "
                               f"the replay keeps their measured times, and the tuned figures are the model's for "
                               f"them as NCCL would run them on {cluster.name}, not a prediction for this job")
    for warning in choice.warnings + fit_warnings(workload, cluster) + untunable_warnings(workload):
        err.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    joined = bound_transfers(given.read, cluster) if from_trace else None  # waits where the cluster bounds them
    bounded = bounded_line(joined, cluster.name)
    if bounded:
        err.print(f"note: {bounded}", highlight=False, markup=False, soft_wrap=True)
    model_cluster = tuning.tuning_cluster(cluster, choice.cluster_arg, evaluator_name,
                                          log=lambda m: err.print(m, highlight=False))
    model = tuning.make_evaluator(evaluator_name, model_cluster, seed=args.seed, workload=workload)
    evaluator: Evaluator = model
    cpu_scale = 1.0  # the CPU's scale every plan is replayed at (--unprofiled-cpu)
    if args.unprofiled_cpu:  # the bisection's evaluator serves the search too (its replay data are built)
        found = unprofiled_cpu(model, workload)
        err.print(unprofiled_line(found), highlight=False, markup=False, soft_wrap=True)
        evaluator = tuning.ScaledEvaluator(model, DurationScale(cpu=found.cpu))
        cpu_scale = found.cpu
    joint = JointEvaluator(model, workloads, joined=joined) if workloads is not None else None
    if joint is not None:
        evaluator = joint
    started = time.perf_counter()
    with StageProgress(err, f"tuning ({args.method}, evaluations)", total=args.budget) as bar:
        outcome = tuning.tune(
            workload, cluster, evaluator, method=args.method, budget=args.budget,
            with_autoccl=not args.no_autoccl, progress=bar.update, seed=args.seed,
            other_ranks=[w for w in workloads if w is not workload] if workloads is not None else (),
        )
    elapsed_s = time.perf_counter() - started
    config = tuning.tuned_config(outcome, cluster, stored_path(choice.cluster_arg, "cluster", args.output),
                                 stored_path(args.workload, "workload", args.output), min_gain=args.min_gain)
    config.dump(args.output, "-o")
    job_view = None
    if joint is not None and workloads is not None:  # the rows from every rank: the job's step, step by step
        job_view = JobView({w.rank: w for w in workloads}, joint.joint(Plan()), joint.joint(outcome.result.plan),
                           cluster.gpus_per_node)
    report = tune_report(outcome, workload, args.min_gain, job_view)
    auto = outcome.autoccl.iteration_us if outcome.autoccl is not None else None
    base, tuned = outcome.baseline.iteration_us, outcome.result.iteration_us
    summary = {
        "workload": args.workload,
        "cluster": cluster.name,
        "evaluator": evaluator_name,
        "method": args.method,
        "baseline_us": round(base, 3),
        "tuned_us": round(tuned, 3),
        "autoccl_us": None if auto is None else round(auto, 3),
        "speedup_vs_nccl": round(base / tuned, 4),
        "speedup_vs_autoccl": None if auto is None else round(auto / tuned, 4),
        "evaluations": outcome.evaluations_run,
        "evaluations_by_method": {args.method: outcome.result.evaluations,
                                  **({"autoccl": outcome.autoccl.evaluations}
                                     if outcome.autoccl is not None and args.method != "autoccl" else {})},
        "signatures": len(report.rows),
        "elapsed_s": round(elapsed_s, 2),
        "output": args.output,
        **report.to_dict(),
        "notes": config.notes,
        "requirements": config.requirements,
    }
    if export is not None:
        export_trace(workload, outcome.result.timing, export, f"the tuned plan ({args.method}), as in {args.output}",
                     cpu_scale)
        summary["export_trace"] = str(export)
    overhead = profiler_overhead([workload.recorded_steps]) if from_trace else None
    if overhead is not None:
        summary["profiler_overhead"] = overhead.to_dict()
    if joint is not None and joint.last is not None:
        err.print(joint_line(joint.last), highlight=False, markup=False, soft_wrap=True)
    fid = fidelity(outcome.baseline)
    if fid is not None:
        summary["replay"] = fid.to_dict()
        summary["steps"] = [
            {**b.to_dict(), "tuned_iteration_us": round(t.iteration_us, 3), "tuned_comm_us": round(t.comm_us, 3),
             "tuned_exposed_comm_us": round(t.exposed_comm_us, 3)}
            for b, t in zip(outcome.baseline.steps, outcome.result.timing.steps)
        ]
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = stdout_console()
    for line in report.why():
        out.print(f"why: {line}", highlight=False)
    if fid is not None:
        out.print(fidelity_line(fid), highlight=False)
        untrusted = fidelity_warning(fid)
        if untrusted:
            out.print(untrusted, highlight=False)
    if overhead is not None:
        out.print(overhead_line(overhead), highlight=False)
    name = Path(args.workload).name if Path(args.workload).exists() else args.workload
    per = "per step" if outcome.baseline.steps else "per iteration"
    whose = f" of {report.figures_of}" if report.figures_of else ""
    table = Table(title=f"lagom tune: {name} on {cluster.name} ({evaluator_name}, {args.method}); ms {per}{whose}",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), title_justify="left")
    for col in ("signature", "setting: NCCL>tuned", "coll. ms", "slowdown"):
        table.add_column(col, justify="left" if col in ("signature", "setting: NCCL>tuned") else "right",
                         no_wrap=col != "setting: NCCL>tuned")
    for r in report.rows:
        s = r.signature
        label = escape(f"{s.collective.value}[{s.group}] {mib(s.message_bytes)} x{s.ranks}r/{s.nodes}n"
                       + r.where())
        mark = "*" if r.slowdown_mostly_modelled else ""
        if r.kept:
            table.add_row(label, _change(r.old, r.old) + " (kept)", f"{r.old_ms:,.2f}", f"{r.old_slowdown:.3f}{mark}")
        else:
            setting = (_change(r.old, r.new) if r.mechanism is Mechanism.SM_KERNEL
                       else f"{_change(r.old, r.old)} > {r.mechanism.value.replace(' ', '-')}")  # one word
            table.add_row(label, setting, f"{r.old_ms:,.2f}>{r.new_ms:,.2f}",
                          f"{r.old_slowdown:.3f}>{r.new_slowdown:.3f}{mark}")
    if len(report.rows) > 1:
        total_old, total_new = report.rows_total_ms
        counted = sum(1 for r in report.rows if r.in_total)
        table.add_section()
        table.add_row(f"all {len(report.rows)} signatures" if counted == len(report.rows)
                      else f"the step's {counted} signatures", "", f"{total_old:,.2f}>{total_new:,.2f}", "")
    out.print(table)
    out.print("X>Y: NCCL's settings > tuned; c: chunk, MiB; kept: the file keeps NCCL's (gain below --min-gain); "
              "coll. ms: the signature's collectives, summed (collectives that overlap each other count once in "
              "a step's coll.); slowdown: the compute they overlap, its time over its time alone (time-weighted; "
              "analyze's contention is a median per-kernel ratio)"
              + ("; *: mostly the model's, the trace never ran those kernels alone"
                 if any(r.slowdown_mostly_modelled for r in report.rows) else "")
              + ("; (rank N): a signature the step's ranks never ran, rank N's figures, outside the total"
                 if any(r.rank is not None for r in report.rows) else "")
              + ("; (outside the kept steps): run only in a step the replay drops, its time there, outside "
                 "the total" if any(r.outside_steps for r in report.rows) else "")
              + "; --json adds the search's order and priority per signature", highlight=False)
    if outcome.baseline.steps:
        out.print(steps_table(outcome.baseline.steps, outcome.result.timing.steps))
    w = report.written
    out.print(f"predicted {per}: NCCL's settings {report.nccl.step_ms:,.2f} ms, "
              + ("" if report.autoccl is None else f"AutoCCL {report.autoccl.step_ms:,.2f} ms, ")
              + f"{args.method} {report.tuned.step_ms:,.2f} ms (x{report.nccl.step_ms / report.tuned.step_ms:.3f}"
              + ("" if report.autoccl is None else f", x{report.autoccl.step_ms / report.tuned.step_ms:.3f} vs AutoCCL")
              + f"); the file runs {w.step_ms:,.2f} ms", highlight=False)
    by = summary["evaluations_by_method"]
    shared = sum(by.values()) - outcome.evaluations_run
    out.print(f"{outcome.evaluations_run} evaluations in {elapsed_s:.1f} s ({args.method} {outcome.result.evaluations}"
              + (f", AutoCCL {by['autoccl']}" if "autoccl" in by else "")
              + (f", {shared} answered from the others'" if shared else "") + f"); wrote {args.output}",
              highlight=False)
    for note in config.notes:
        out.print(f"note: {note}", highlight=False)
    for line in config.requirements:
        out.print(f"requires: {line}", highlight=False, markup=False, soft_wrap=True)
    sys.stdout.flush()
    return 0


def _parts(cfg: CommConfig) -> list[tuple[str, str]]:
    """(prefix, value) per knob set: algorithm/protocol, then each resource knob by its row's prefix
    (nc channels, nt threads, c chunk: nccl_env.knob_table)."""
    parts = []
    algo, proto = ALGORITHM.get(cfg), PROTOCOL.get(cfg)
    if algo is not None:
        parts.append(("", f"{algo.nccl_name}/{proto.nccl_name if proto is not None else '?'}"))
    for knob in REPORT_ORDER:
        value = value_of(cfg, knob)
        if isinstance(value, int):
            parts.append((knob.prefix, mib(value, unit=False) if knob.in_bytes else str(value)))
    return parts


def _change(old: CommConfig, new: CommConfig) -> str:
    """NCCL's setting and the tuned one in one cell: "ring/simple nc2>3 nt512>192 c2M>128K"."""
    before, after = dict(_parts(old)), dict(_parts(new))
    out = []
    for prefix in dict.fromkeys([*before, *after]):
        a, b = before.get(prefix, "NCCL"), after.get(prefix, "NCCL")
        out.append(f"{prefix}{a}" if a == b else f"{prefix}{a}>{b}")
    return " ".join(out) or "NCCL decides"
