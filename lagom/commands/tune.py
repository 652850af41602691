"""`lagom tune WORKLOAD [--cluster NAME|FILE] -o lagom.yaml`: per-collective NCCL settings for a workload.

WORKLOAD is a profiler trace, a workload JSON file or a generator spec such as
``fsdp:llama3-8b:gpus=16`` (as in ``lagom simulate``). For a trace, its own metadata
decides what --cluster and --nccl-version leave open: the preset for its GPU, sized to
its world, and the NCCL version it ran (lagom/trace_context.py); a given value that
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

For a trace the evaluator replays the trace (docs/replay.md): the first line printed is
the replay's fidelity under the trace's own settings ("the model reproduces N steps of
this trace within X%"), with a warning past 10% naming the part that differs; times are
per profiler step (the mean over the complete steps) and every step is listed.

Process-wide changes (env, process-group CTAs) and per-collective entries are written
only when the predicted gain is at least ``--min-gain`` (default 0.01 = 1%); otherwise
the file keeps NCCL's defaults and its notes say why.

Writes the tuned-config file (``-o``, default lagom.yaml); ``--json`` prints
``{"baseline_us", "tuned_us", "autoccl_us", "speedup_vs_nccl", "speedup_vs_autoccl",
"evaluations", "replay" (traces), "steps" (traces), ...}`` to stdout instead of the table.
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

from costmodel.replay.schedule import fidelity
from lagom import tuning
from lagom.console import StageProgress, stdout_console
from lagom.rank_args import add_arguments, reading_from_args
from lagom.replay_report import fidelity_line, fidelity_warning, steps_table
from lagom.trace_context import refuse_to_tune, resolve_cluster
from lagom.workload_arg import read_workload_arg
from lagom.workload_fit import fit_warnings, untunable_warnings
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from tuner import METHODS


def register(sub: argparse._SubParsersAction) -> None:
    doc = __doc__ or ""
    parser = sub.add_parser(
        "tune", help="tuned per-collective NCCL settings for a workload", description=doc,
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="trace, workload JSON file or generator spec")
    parser.add_argument("--cluster", default=None,
                        help="preset name or cluster YAML (e.g. a calibrated one); for a trace, default: the "
                             "preset for its GPU")
    parser.add_argument("--evaluator", choices=tuning.EVALUATORS, default=None,
                        help="what predicts iteration times (default: analytic)")
    parser.add_argument("--method", choices=sorted(METHODS), default="lagom", help="search method (default lagom)")
    parser.add_argument("--nccl-version", default=None,
                        help="the NCCL the job will run (default: the trace's, else the cluster file's); "
                             "decides which knobs are per collective")
    parser.add_argument("--budget", type=int, default=None, help="cap on evaluations (default: the method's own rule)")
    parser.add_argument("-o", "--output", default="lagom.yaml", help="tuned-config file to write (default lagom.yaml)")
    parser.add_argument("--no-autoccl", action="store_true", help="skip the AutoCCL comparison")
    parser.add_argument("--min-gain", type=float, default=tuning.MIN_GAIN, metavar="F",
                        help="write changes only for a predicted gain of at least F (default 0.01 = 1%%)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of the table")
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not (args.min_gain >= 0 and args.min_gain < 10):
        raise LagomError(f"--min-gain {args.min_gain}: must be a fraction >= 0 (0.01 = 1%)")
    if args.budget is not None and args.budget < 1:
        raise LagomError(f"--budget {args.budget}: must be at least 1 evaluation")
    output = Path(args.output)
    if output.is_dir():
        raise LagomError(f"-o {args.output}: is a folder, expected a file name")
    if not output.parent.is_dir():
        raise LagomError(f"-o {args.output}: {output.parent} is not an existing folder")
    workload, from_trace = read_workload_arg(args.workload, reading_from_args(args))
    refusal = refuse_to_tune(workload) if from_trace else None
    if refusal:
        raise LagomError(refusal)
    choice = resolve_cluster(workload, from_trace, args.cluster, args.nccl_version)
    cluster = choice.cluster
    evaluator_name = args.evaluator or tuning.DEFAULT_EVALUATOR
    err = Console(stderr=True)
    for note in choice.notes:
        err.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    for warning in choice.warnings + fit_warnings(workload, cluster) + untunable_warnings(workload):
        err.print(f"warning: {warning}", highlight=False, markup=False, soft_wrap=True)
    model_cluster = tuning.tuning_cluster(cluster, choice.cluster_arg, evaluator_name,
                                          log=lambda m: err.print(m, highlight=False))
    evaluator = tuning.make_evaluator(evaluator_name, model_cluster)
    started = time.perf_counter()
    with StageProgress(err, f"tuning ({args.method}, evaluations)", total=args.budget) as bar:
        outcome = tuning.tune(
            workload, cluster, evaluator, method=args.method, budget=args.budget,
            with_autoccl=not args.no_autoccl, progress=bar.update,
        )
    elapsed_s = time.perf_counter() - started
    config = tuning.tuned_config(outcome, cluster, choice.cluster_arg, args.workload, min_gain=args.min_gain)
    try:
        config.dump(args.output)
    except OSError as exc:
        raise LagomError(f"-o {args.output}: cannot write: {exc.strerror or exc}") from None
    rows = tuning.signature_rows(outcome, workload)
    base, tuned = outcome.baseline.iteration_us, outcome.result.iteration_us
    auto = outcome.autoccl.iteration_us if outcome.autoccl is not None else None
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
        "evaluations": outcome.result.evaluations,
        "signatures": len(rows),
        "elapsed_s": round(elapsed_s, 2),
        "output": args.output,
        "why": tuning.explain(outcome),
        "notes": config.notes,
        "rows": [r.to_dict() for r in rows],
    }
    fid = fidelity(outcome.baseline)
    if fid is not None:
        summary["replay"] = fid.to_dict()
        summary["steps"] = [
            {**b.to_dict(), "tuned_iteration_us": round(t.iteration_us, 3)}
            for b, t in zip(outcome.baseline.steps, outcome.result.timing.steps)
        ]
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    out = stdout_console()
    if fid is not None:
        out.print(fidelity_line(fid), highlight=False)
        untrusted = fidelity_warning(fid)
        if untrusted:
            out.print(untrusted, highlight=False)
    name = Path(args.workload).name if Path(args.workload).exists() else args.workload
    table = Table(title=f"lagom tune: {name} on {cluster.name} ({evaluator_name}, {args.method})",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), title_justify="left")
    for col in ("signature", "setting: NCCL>tuned", "comm ms", "slowdown"):
        table.add_column(col, justify="left" if col in ("signature", "setting: NCCL>tuned") else "right",
                         no_wrap=col != "setting: NCCL>tuned")
    for r in rows:
        s = r.signature
        table.add_row(
            escape(f"{s.collective.value}[{s.group}] {_bytes(s.message_bytes)} x{s.ranks}r/{s.nodes}n"),
            _change(r.old, r.new),
            f"{r.old_comm_us / 1e3:,.1f}>{r.new_comm_us / 1e3:,.1f}",
            f"{r.old_compute_slowdown:.3f}>{r.new_compute_slowdown:.3f}",
        )
    out.print(table)
    out.print("X>Y: NCCL's default > tuned; slowdown: of the compute beside the collective; --json adds the "
              "search's order and priority per signature", highlight=False)
    if outcome.baseline.steps:
        out.print(steps_table(outcome.baseline.steps, outcome.result.timing.steps))
    per = "per profiler step" if outcome.baseline.steps else "iteration"
    out.print(f"predicted {per}: NCCL default {base:,.1f} us, "
              + ("" if auto is None else f"AutoCCL {auto:,.1f} us, ")
              + f"{args.method} {tuned:,.1f} us  (x{base / tuned:.3f} vs NCCL"
              + ("" if auto is None else f", x{auto / tuned:.3f} vs AutoCCL") + ")")
    out.print(f"{outcome.result.evaluations} evaluations in {elapsed_s:.1f} s; wrote {args.output}")
    for line in summary["why"]:
        out.print(f"why: {line}", highlight=False)
    for note in config.notes:
        out.print(f"note: {note}")
    sys.stdout.flush()
    return 0


def _parts(cfg: CommConfig) -> list[tuple[str, str]]:
    """(prefix, value) per knob set: algorithm/protocol, nc channels, nt threads, c chunk."""
    parts = []
    if cfg.algorithm is not None:
        parts.append(("", f"{cfg.algorithm.nccl_name}/{cfg.protocol.nccl_name if cfg.protocol is not None else '?'}"))
    if cfg.channels is not None:
        parts.append(("nc", str(cfg.channels)))
    if cfg.threads is not None:
        parts.append(("nt", str(cfg.threads)))
    if cfg.chunk_bytes is not None:
        parts.append(("c", _bytes(cfg.chunk_bytes)))
    return parts


def _change(old: CommConfig, new: CommConfig) -> str:
    """NCCL's setting and the tuned one in one cell: "ring/simple nc2>3 nt512>192 c2M>128K"."""
    before, after = dict(_parts(old)), dict(_parts(new))
    out = []
    for prefix in dict.fromkeys([*before, *after]):
        a, b = before.get(prefix, "NCCL"), after.get(prefix, "NCCL")
        out.append(f"{prefix}{a}" if a == b else f"{prefix}{a}>{b}")
    return " ".join(out) or "NCCL decides"


def _bytes(n: int) -> str:
    if n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= (1 << 20):
        return f"{n / (1 << 20):.2f}M"
    return f"{n >> 10}K" if n >= 1024 else f"{n}B"
