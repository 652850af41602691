"""Reading a folder of 1 to N ranks: `lagom analyze` in one process, on worker processes, and HTA.

    python3 bench/ranks_scaling.py [--command analyze|simulate] [--max-ranks 16 | --ranks 32,64] [--jobs N]
                                   [--repeat K] [--source NAME] [--hta-python PYTHON] [--hta-max-ranks N]

The folders hold 1, 2, 4, ... --max-ranks copies of one shared trace (default the 20 MB
a100_w16_sendrecv_3streams_rank0) rewritten as the distinct ranks of one job
(``distributedInfo.rank`` per copy: tests/kineto_builder.py ``write_rank_copies``),
written once to a temporary folder; each smaller folder links to the first files.
On each folder, each in its own child process:

- lagom, 1 job: ``python -m lagom analyze DIR --json --jobs 1`` (every rank read here;
  ``--command simulate``: ``lagom simulate``, which keeps the lowest rank);
  with ``--repeat K`` each lagom reader runs K times and the fastest run is shown;
- lagom, N jobs: ``python -m lagom analyze DIR --json --jobs N`` (N: --jobs, default the
  cores; the two outputs must be the same bytes: the "same" column);
- HTA: ``TraceAnalysis(trace_dir=DIR)``, then its overlap and temporal breakdown
  (bench/analyze_vs_hta.py's child), with the Python of ``--hta-python`` (default this
  one; the column is left out when that Python has no ``hta``: ``pip install -e '.[bench]'``).

Wall time is the child's, start to exit (interpreter start and imports included). CPU
time is user + system of the child and of every process under it: this script is the
"child subreaper" of its children, so a pool's processes that outlive their parent
(the forkserver and its workers) end here and are counted too. "peak" is the
child's own ``ru_maxrss`` ("main": lagom's process; HTA's, with the pool workers it
reaps itself) and the largest among the processes that outlived it ("worker": a lagom
pool's forkserver and workers, which this script reaps); "total" is the peak of their
summed resident memory, sampled every 20 ms with psutil (blank
without psutil). The copies are written by a child, so that this process stays small
(Linux carries a parent's high-water mark into a child's ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from analyze_vs_hta import HTA_CHILD, shared_traces_dir
from rich.console import Console
from rich.table import Table

REPO_ROOT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    main_mib: float  # the child's own peak resident memory (with what it reaped itself)
    others_mib: float | None  # the largest peak of the processes that outlived it (a pool's workers), if any
    total_mib: float | None  # the peak of the whole tree's resident memory (psutil), None without psutil
    out: bytes


def run_child(argv: list[str]) -> Run:
    """One child process and everything it starts: wall, CPU, peak memory, stdout."""
    try:
        import psutil
    except ImportError:
        psutil = None
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    total = [0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=REPO_ROOT)
        done = threading.Event()

        def sample() -> None:
            me = psutil.Process()
            while not done.wait(0.02):
                rss = 0
                for p in me.children(recursive=True):
                    with contextlib.suppress(psutil.Error):  # it ended meanwhile
                        rss += p.memory_info().rss
                total[0] = max(total[0], rss)

        sampler = threading.Thread(target=sample, daemon=True) if psutil is not None else None
        if sampler is not None:
            sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        cpu = usage.ru_utime + usage.ru_stime
        others = None
        while True:  # what outlived the child was re-parented here (subreaper): reap it and count it
            try:
                _, _, more = os.wait4(-1, 0)
            except ChildProcessError:
                break
            cpu += more.ru_utime + more.ru_stime
            others = max(others or 0, more.ru_maxrss)
        done.set()
        if sampler is not None:
            sampler.join()
        out.seek(0)
        data = out.read()
        err.seek(0)
        said = err.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"child failed ({code}): {' '.join(argv)}\n{said[-3000:]}")
    return Run(wall, cpu, usage.ru_maxrss / 1024.0, None if others is None else others / 1024.0,  # KiB on Linux
               total[0] / 2**20 if psutil is not None else None, data)


def fastest(argv: list[str], times: int) -> Run:
    """The run with the least wall time of ``times`` runs (interleaving with other jobs' load only adds)."""
    return min((run_child(argv) for _ in range(max(1, times))), key=lambda r: r.wall_s)


def has_hta(python: str) -> bool:
    return subprocess.run([python, "-c", "import hta"], capture_output=True).returncode == 0


def rank_counts(max_ranks: int) -> list[int]:
    counts = [1]
    while counts[-1] * 2 <= max_ranks:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == max_ranks else [*counts, max_ranks]


def folders(root: Path, files: list[Path], counts: list[int]) -> dict[int, Path]:
    """A folder per rank count, linking to the first files."""
    out = {}
    for n in counts:
        folder = root / f"ranks{n}"
        folder.mkdir()
        for f in files[:n]:
            (folder / f.name).symlink_to(f)
        out[n] = folder
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--command", choices=["analyze", "simulate"], default="analyze",
                        help="the lagom command to time (default analyze; HTA only beside analyze)")
    parser.add_argument("--max-ranks", type=int, default=16, help="largest folder (default 16)")
    parser.add_argument("--ranks", default=None, metavar="N,N,...",
                        help="these rank counts instead of 1, 2, 4, ... --max-ranks")
    parser.add_argument("--jobs", type=int, default=None, help="lagom's worker processes (default: the cores)")
    parser.add_argument("--source", default="a100_w16_sendrecv_3streams_rank0.json.gz", help="shared trace to copy")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each lagom reader this many times, keep the fastest (wall time on a shared machine)")
    parser.add_argument("--hta-python", default=sys.executable, help="the Python that has HTA (default this one)")
    parser.add_argument("--hta-max-ranks", type=int, default=None, help="largest folder HTA reads (default all)")
    parser.add_argument("--build-only", nargs=2, metavar=("DIR", "N"), help=argparse.SUPPRESS)  # child: the copies
    args = parser.parse_args()
    if args.build_only:
        sys.path.insert(0, str(REPO_ROOT / "tests"))
        from kineto_builder import write_rank_copies

        write_rank_copies(shared_traces_dir() / args.source, int(args.build_only[1]), Path(args.build_only[0]))
        return 0
    source = shared_traces_dir() / args.source
    if not source.is_file():
        raise SystemExit(f"{source}: not found (the shared traces are beside the checkout)")
    if args.max_ranks < 1 or (args.ranks and not all(n.isdigit() and int(n) > 0 for n in args.ranks.split(","))):
        raise SystemExit("rank counts must be at least 1")
    jobs = args.jobs or len(os.sched_getaffinity(0))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become the child subreaper (Linux only): the workers' CPU time would be lost")
    hta = args.command == "analyze" and has_hta(args.hta_python)
    counts = [int(n) for n in args.ranks.split(",")] if args.ranks else rank_counts(args.max_ranks)
    args.max_ranks = max(counts)
    hta_max = args.hta_max_ranks if args.hta_max_ranks is not None else args.max_ranks
    console = Console()
    table = Table(title=f"lagom {args.command} on 1..{args.max_ranks} copies of {args.source} as ranks "
                        f"({len(os.sched_getaffinity(0))} cores)")
    for col in ("ranks", "MB", "reader", "wall s", "CPU s", "peak MiB: main / worker", "total MiB", "same"):
        table.add_column(col, justify="left" if col == "reader" else "right")
    names = ["lagom, 1 job", f"lagom, {jobs} jobs", "HTA"]
    with tempfile.TemporaryDirectory(prefix="ranks-scaling-") as tmp:
        root = Path(tmp)
        copies = root / "copies"
        run_child([sys.executable, __file__, "--source", args.source, "--build-only", str(copies),
                   str(args.max_ranks)])
        files = sorted(copies.iterdir(), key=lambda p: int(p.stem.removeprefix("rank").split(".")[0]))
        for n, folder in folders(root, files, counts).items():
            size_mb = sum(f.stat().st_size for f in files[:n]) / 1e6
            lagom = [sys.executable, "-m", "lagom", args.command, str(folder), "--json"]
            runs: list[Run | None] = [fastest([*lagom, "--jobs", "1"], args.repeat),
                                      fastest([*lagom, "--jobs", str(jobs)], args.repeat)]
            same = runs[0] is not None and runs[1] is not None and runs[0].out == runs[1].out
            if hta:
                runs.append(run_child([args.hta_python, "-c", HTA_CHILD, str(folder)]) if n <= hta_max else None)
            for name, r in zip(names, runs):
                if r is None:
                    table.add_row(str(n), f"{size_mb:,.0f}", name, *["-"] * 4, "")
                    continue
                total = "" if r.total_mib is None else f"{r.total_mib:,.0f}"
                table.add_row(str(n), f"{size_mb:,.0f}", name, f"{r.wall_s:.1f}", f"{r.cpu_s:.1f}",
                              f"{r.main_mib:,.0f}" + ("" if r.others_mib is None else f" / {r.others_mib:,.0f}"),
                              total, ("yes" if same else "NO") if name.startswith("lagom, ") and
                              r is runs[1] else "", end_section=r is runs[-1])
            console.print(f"{n} ranks done", highlight=False, style="dim")
    console.print(table)
    if not hta and args.command == "analyze":
        console.print(f"HTA left out: {args.hta_python} has no hta (pip install -e '.[bench]')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
