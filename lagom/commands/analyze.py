"""`lagom analyze PATH... [--json] [--plot FILE.png] [--include-last-step]`

Per rank of PyTorch profiler (Kineto) traces (a .json/.json.gz file, or a directory
with one file per rank): the collectives (type, group size, message size, count,
total time, exposed time = not overlapped by compute), communication/computation
overlap %, the temporal breakdown (idle / compute / non-compute %), compute slowdown
under communication, each NCCL kernel key's time split into waiting for the slowest
peer and transfer (traces.comm_split: from the fastest instances, or from the ranks'
launch times when a directory holds several ranks; only the transfer answers to NCCL
settings), and the largest overlap windows.

Overlap % and the breakdown follow Holistic Trace Analysis 0.5: by default the trace
is trimmed to whole profiler steps (the last, usually unfinished, step is dropped);
--include-last-step keeps it. All figures are over that analysed span. Per complete
profiler step (``steps`` in --json) it also prints the replay's reading of the trace
(docs/replay.md): the step as the GPU's period, its collectives, exposed time, the
collective time on its critical path (the most that faster collectives can save) and
GPU idle the execution graph shows no cause for.
--json prints one object {"ranks": [...]}; --plot writes a PNG timeline of one
profiler step of the first rank. Traces from ``lagom record`` add one line, the
profiler's overhead (profiled against unprofiled mean step; --json: "profiler_overhead").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from lagom.args.common_args import add_cluster, add_json
from lagom.args.rank_args import ExecutorKind, add_arguments, reading_from_args
from lagom.files.output_paths import OutputFormat, check_output
from lagom.reports.analyze_report import rank_report, render
from lagom.reports.console import stdout_console
from lagom.reports.record_overhead import overhead_line, profiler_overhead
from lagom.reports.replay_report import measured_steps
from nccl_env.errors import LagomError
from traces.reader import read_trace, trace_files
from traces.steps import trim_to_profiler_steps
from traces.workload import RecordedSteps, Workload


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "analyze",
        help="collectives, overlap and exposed communication in PyTorch profiler traces",
        description=__doc__,
    )
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="trace file (.json, .json.gz) or directory of per-rank traces")
    add_json(parser)
    parser.add_argument("--plot", metavar="FILE.png", help="write a PNG timeline of one profiler step (first rank)")
    parser.add_argument("--force", action="store_true", help="overwrite --plot even if it is not a plot Lagom wrote")
    parser.add_argument(
        "--include-last-step",
        action="store_true",
        help="keep the last profiler step (HTA's include_last_profiler_step=True)",
    )
    parser.add_argument("--top", type=int, default=5, metavar="N", help="overlap windows to list per rank (default 5)")
    add_cluster(parser, "bounds the transfer of collectives seen too few times (default: as simulate "
                        "chooses for the trace)")
    add_arguments(parser)
    parser.set_defaults(func=run)


SAY_READING_BYTES = 20_000_000  # files this large take seconds to parse: the user hears why it waits


def _input_bytes(path: Path) -> int:
    """Bytes of a trace file, or of the trace files in a folder (0 when neither)."""
    try:
        if path.is_dir():
            return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
        return path.stat().st_size if path.is_file() else 0
    except OSError:
        return 0


def run(args: argparse.Namespace) -> int:
    if args.top < 0:
        raise LagomError(f"--top {args.top}: must be 0 or more")
    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            raise LagomError(f"--plot {args.plot}: the timeline is written as PNG; give a .png file name")
        check_output("--plot", args.plot, OutputFormat.PLOT, [("PATH", p) for p in args.paths], force=args.force)
    if args.cluster is not None:
        from costmodel.cluster import load_cluster

        load_cluster(args.cluster)  # an unknown cluster: one line before anything is read
    for path in args.paths:
        trace_files(path)  # an empty, missing or too large input: one line before anything is said or read
    reading = reading_from_args(args)
    if reading.executor is not ExecutorKind.LOCAL:  # a folder's ranks on worker processes or Dask
        from lagom.orchestration.analyze_ranks import analyze_paths

        reports, plot_view, recorded = analyze_paths(args.paths, reading, args.include_last_step, args.top,
                                                     bool(args.plot), args.cluster)
    else:
        reports, plot_view, recorded = _analyze_here(args)
    if args.plot and plot_view is not None:
        from lagom.reports.plot_timeline import plot_step  # matplotlib only when asked

        plot_step(plot_view, args.plot)
    overhead = profiler_overhead(recorded)
    if args.json:
        document = {"ranks": reports, **({"profiler_overhead": overhead.to_dict()} if overhead else {})}
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        sys.stdout.flush()
    else:
        # piped or redirected: rich would assume 80 columns and cut the headers ("exposed…")
        console = stdout_console()
        render(reports, console)
        if overhead is not None:
            console.print(overhead_line(overhead), highlight=False)
        if args.plot:
            console.print(f"timeline written to {args.plot}")
    return 0


def _analyze_here(args: argparse.Namespace) -> tuple[list[dict], Workload | None, list[RecordedSteps | None]]:
    """Every rank read and analysed in this process: the reports, the first rank's analysed span and
    each rank's recorded step times."""
    workloads = []
    seen: set[Path] = set()
    folders: list[list[Workload]] = []  # each path's ranks: their clocks are aligned together
    for path in args.paths:
        size_bytes = _input_bytes(Path(path))
        if size_bytes >= SAY_READING_BYTES:  # seconds of reading: say so, on a terminal or not
            print(f"reading {path} ({size_bytes / 1e6:,.0f} MB)", file=sys.stderr, flush=True)
        folders.append(read_trace(path))
        for workload in folders[-1]:
            source = Path(workload.source).resolve()
            if source in seen:
                print(f"warning: {workload.source}: given more than once, analysed once", file=sys.stderr)
                continue
            seen.add(source)
            for line in workload.input_warnings:  # events the reader dropped (traces.kineto)
                print(f"warning: {line}", file=sys.stderr)
            workloads.append(workload)
    views = [trim_to_profiler_steps(w, include_last_step=args.include_last_step) for w in workloads]
    reports = [
        rank_report(v, top_windows=args.top, trimmed=len(v.profiler_steps) < len(w.profiler_steps))
        | {"steps": measured_steps(w)}
        for v, w in zip(views, workloads)
    ]
    from lagom.orchestration.analyze_ranks import add_joined_waits, analysis_cluster

    index = {id(w): i for i, w in enumerate(workloads)}
    for ranks in folders:
        kept = [index[id(w)] for w in ranks if id(w) in index]
        cluster = analysis_cluster(min(ranks, key=lambda w: w.rank), args.cluster) if ranks else None
        add_joined_waits([reports[i] for i in kept], [workloads[i] for i in kept], [views[i] for i in kept], cluster)
    return reports, views[0] if views else None, [w.recorded_steps for w in workloads]
