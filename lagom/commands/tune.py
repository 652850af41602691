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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from lagom.args.common_args import add_cluster, add_evaluator, add_json, add_nccl_version, add_seed
from lagom.args.knob_args import parse_nccl_version_arg
from lagom.args.rank_args import add_arguments, reading_from_args
from lagom.files.trace_export import export_trace
from lagom.orchestration import tuning
from lagom.orchestration.tune_workload import Told, TuneRequest, TuneResult, tune
from lagom.reports.console import StageProgress, mib, stdout_console
from lagom.reports.record_overhead import overhead_line
from lagom.reports.replay_report import fidelity_line, fidelity_warning, steps_table
from lagom.reports.tune_report import SignatureRow
from nccl_env.knob_table import ALGORITHM, PROTOCOL, REPORT_ORDER, value_of
from nccl_env.knobs import CommConfig
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
    request = TuneRequest(
        workload=args.workload, cluster=args.cluster, nccl_version=parse_nccl_version_arg(args.nccl_version),
        evaluator=args.evaluator or tuning.DEFAULT_EVALUATOR, method=args.method, budget=args.budget,
        seed=args.seed, output=args.output, force=args.force, with_autoccl=not args.no_autoccl,
        min_gain=args.min_gain, unprofiled_cpu=args.unprofiled_cpu, export_trace=args.export_trace,
        rank=args.rank, reading=reading_from_args(args),
    )
    err = Console(stderr=True)
    result = tune(request, progress=_StderrProgress(err))
    result.config.dump(request.output, "-o")
    if result.export_path is not None:
        export_trace(result.workload, result.outcome.result.timing, result.export_path,
                     f"the tuned plan ({request.method}), as in {request.output}", result.cpu_scale)
    if result.joint is not None:
        from lagom.orchestration.joint_run import joint_line

        err.print(joint_line(result.joint), highlight=False, markup=False, soft_wrap=True)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    out = stdout_console()
    report, outcome, fid = result.report, result.outcome, result.fidelity
    for line in report.why():
        out.print(f"why: {line}", highlight=False)
    if fid is not None:
        out.print(fidelity_line(fid), highlight=False)
        untrusted = fidelity_warning(fid)
        if untrusted:
            out.print(untrusted, highlight=False)
    if result.overhead is not None:
        out.print(overhead_line(result.overhead), highlight=False)
    per = "per step" if outcome.baseline.steps else "per iteration"
    out.print(_rows_table(result, per))
    out.print(_legend(report.rows), highlight=False)
    if outcome.baseline.steps:
        out.print(steps_table(outcome.baseline.steps, outcome.result.timing.steps))
    w, method = report.written, request.method
    out.print(f"predicted {per}: NCCL's settings {report.nccl.step_ms:,.2f} ms, "
              + ("" if report.autoccl is None else f"AutoCCL {report.autoccl.step_ms:,.2f} ms, ")
              + f"{method} {report.tuned.step_ms:,.2f} ms (x{report.nccl.step_ms / report.tuned.step_ms:.3f}"
              + ("" if report.autoccl is None else f", x{report.autoccl.step_ms / report.tuned.step_ms:.3f} vs AutoCCL")
              + f"); the file runs {w.step_ms:,.2f} ms", highlight=False)
    by = result.evaluations_by_method
    shared = sum(by.values()) - outcome.evaluations_run
    out.print(f"{outcome.evaluations_run} evaluations in {result.elapsed_s:.1f} s ({method} "
              f"{outcome.result.evaluations}" + (f", AutoCCL {by['autoccl']}" if "autoccl" in by else "")
              + (f", {shared} answered from the others'" if shared else "") + f"); wrote {request.output}",
              highlight=False)
    for note in result.config.notes:
        out.print(f"note: {note}", highlight=False)
    for line in result.config.requirements:
        out.print(f"requires: {line}", highlight=False, markup=False, soft_wrap=True)
    sys.stdout.flush()
    return 0


class _StderrProgress:
    """What ``tune`` meets, printed on stderr as it happens; the search's bar (a plain line on a pipe)."""

    def __init__(self, err: Console) -> None:
        self.err = err

    def tell(self, kind: Told, text: str) -> None:
        self.err.print(f"{kind.value}{text}", highlight=False, markup=False, soft_wrap=True)

    @contextmanager
    def search(self, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
        with StageProgress(self.err, label, total=total) as bar:
            yield bar.update


def _rows_table(result: TuneResult, per: str) -> Table:
    """One row per collective signature: NCCL's settings and the tuned ones, the time, the slowdown."""
    request, report = result.request, result.report
    name = Path(request.workload).name if Path(request.workload).exists() else request.workload
    whose = f" of {report.figures_of}" if report.figures_of else ""
    table = Table(title=f"lagom tune: {name} on {result.cluster.name} ({request.evaluator}, {request.method}); "
                        f"ms {per}{whose}",
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
    return table


def _legend(rows: list[SignatureRow]) -> str:
    """The line under the table: what its cells mean, and the marks its rows use."""
    return ("X>Y: NCCL's settings > tuned; c: chunk, MiB; kept: the file keeps NCCL's (gain below --min-gain); "
            "coll. ms: the signature's collectives, summed (collectives that overlap each other count once in "
            "a step's coll.); slowdown: the compute they overlap, its time over its time alone (time-weighted; "
            "analyze's contention is a median per-kernel ratio)"
            + ("; *: mostly the model's, the trace never ran those kernels alone"
               if any(r.slowdown_mostly_modelled for r in rows) else "")
            + ("; (rank N): a signature the step's ranks never ran, rank N's figures, outside the total"
               if any(r.rank is not None for r in rows) else "")
            + ("; (outside the kept steps): run only in a step the replay drops, its time there, outside "
               "the total" if any(r.outside_steps for r in rows) else "")
            + "; --json adds the search's order and priority per signature")


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
