"""`lagom analyze` against Holistic Trace Analysis 0.5 on the same traces, side by side.

    python3 bench/analyze_vs_hta.py [--size-mb 200] [--source a100_w16_sendrecv_3streams_rank0.json.gz]

For every trace of ../shared/traces that HTA handles, plus one large trace built by
replicating a real trace's profiler steps until it is at least --size-mb MB of
uncompressed JSON (written to a temporary directory, one event per line as Kineto
writes it), each tool runs in its own child process:

- Lagom: ``python -m lagom analyze TRACE --json`` (parse, trim, every analysis, report);
- HTA: ``TraceAnalysis(trace_dir=DIR)`` then ``get_comm_comp_overlap()`` and
  ``get_temporal_breakdown()`` (parse, trim, the two analyses).

Wall time is the child's from start to exit (interpreter start and imports included),
CPU time its user + system time (steadier than wall time on a loaded machine);
peak memory is the child's own ``ru_maxrss`` (``os.wait4``). Linux carries the
parent's high-water mark into a spawned child's ``ru_maxrss``, so the large trace is
built in a child too and this process stays small (its own peak is printed). The table prints both and
the ratios, and the overlap % each tool found (they should agree). Needs the ``bench``
extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    for parent in REPO_ROOT.parents:
        if (parent / "shared" / "traces").is_dir():
            return parent / "shared" / "traces"
    return REPO_ROOT.parent / "shared" / "traces"


# Files HTA 0.5 handles (it raises IndexError on the CPU-only and no-distributedInfo ones).
HTA_FILES = [
    "a100_w2_allreduce_broadcast.json.gz",
    "w128_sendrecv_rank0.json.gz",
    "w128_sendrecv_rank1.json.gz",
    "a100_w16_sendrecv_3streams_rank0.json.gz",
    "mi250_rocm_minitoy.json.gz",
]

HTA_CHILD = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
t = TraceAnalysis(trace_dir=sys.argv[1])
o = t.get_comm_comp_overlap(visualize=False)
b = t.get_temporal_breakdown(visualize=False)
print(json.dumps({"overlap": [None if v != v else float(v) for v in o["comp_comm_overlap_pctg"]],
                  "idle": [float(v) for v in b["idle_time_pctg"]]}))
"""


def run_child(argv: list[str]) -> tuple[float, float, float, bytes]:
    """(wall seconds, CPU seconds, peak RSS MiB, stdout) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.DEVNULL, env=env, cwd=REPO_ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        data = out.read()
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}): {' '.join(argv)}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, data  # ru_maxrss is KiB on Linux


def run_lagom(trace: Path) -> tuple[float, float, float, float | None]:
    wall, cpu, rss, out = run_child([sys.executable, "-m", "lagom", "analyze", str(trace), "--json"])
    return wall, cpu, rss, orjson.loads(out)["ranks"][0]["comm_comp_overlap_pct"]


def run_hta(trace: Path) -> tuple[float, float, float, float | None]:
    with tempfile.TemporaryDirectory() as d:  # HTA takes a directory
        os.symlink(trace, Path(d) / trace.name)
        wall, cpu, rss, out = run_child([sys.executable, "-c", HTA_CHILD, d])
    return wall, cpu, rss, orjson.loads(out.strip().splitlines()[-1])["overlap"][0]


def build_large_trace(source: Path, target: Path, min_bytes: int) -> tuple[int, int]:
    """Replicate ``source``'s events (its profiler steps and everything in them) back to back,
    shifting times and renumbering correlation / External id / flow ids / ProfilerStep numbers,
    until the file holds at least ``min_bytes``. Returns (copies, bytes written)."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()))
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    period = int(t1 - t0) + 1000
    once = [e for e in events if e.get("ph") in ("M", "i") or e.get("cat") == "Trace"]
    repeated = [e for e in events if not (e.get("ph") in ("M", "i") or e.get("cat") == "Trace")]
    id_step = 10**9
    header = orjson.dumps(doc)[:-1] + b', "traceEvents": [\n'
    written = 0
    copies = 0
    with open(target, "wb") as fh:
        fh.write(header)
        written += len(header)
        lines = [orjson.dumps(e) for e in once]
        fh.write(b",\n".join(lines))
        written += sum(len(x) + 2 for x in lines)
        while written < min_bytes:
            shift = copies * period
            lines = []
            for e in repeated:
                e = dict(e)
                if "ts" in e:
                    e["ts"] = e["ts"] + shift
                if "id" in e and isinstance(e["id"], int):
                    e["id"] = e["id"] + copies * id_step
                args = e.get("args")
                if isinstance(args, dict):
                    args = dict(args)
                    for key in ("correlation", "External id", "Ev Idx"):
                        if isinstance(args.get(key), int) and args[key] > 0:
                            args[key] = args[key] + copies * id_step
                    e["args"] = args
                name = e.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name[13:]) + copies * 1000}"
                lines.append(orjson.dumps(e))
            chunk = b",\n" + b",\n".join(lines)
            fh.write(chunk)
            written += len(chunk)
            copies += 1
        fh.write(b"\n]}\n")
    return copies, target.stat().st_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=float, default=200.0, help="size of the replicated trace (MB, uncompressed)")
    parser.add_argument("--source", default="a100_w16_sendrecv_3streams_rank0.json.gz",
                        help="shared trace to replicate")
    parser.add_argument("--skip-small", action="store_true", help="only the large trace")
    parser.add_argument("--build-only", metavar="PATH", help=argparse.SUPPRESS)  # child mode: write the large trace
    args = parser.parse_args()
    if args.build_only:
        copies, size = build_large_trace(shared_traces_dir() / args.source, Path(args.build_only),
                                         int(args.size_mb * 1e6))
        print(copies, size)
        return 0
    console = Console(stderr=True)
    traces_dir = shared_traces_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [] if args.skip_small else [(name.removesuffix(".json.gz"), traces_dir / name) for name in HTA_FILES]
        big = Path(tmp) / f"replicated_{Path(args.source).name.removesuffix('.json.gz')}.json"
        _, _, _, out = run_child([sys.executable, __file__, "--build-only", str(big), "--source", args.source,
                               "--size-mb", str(args.size_mb)])
        copies, size = (int(x) for x in out.split())
        cases.append((f"{args.source.removesuffix('.json.gz')} x{copies} ({size / 1e6:.0f} MB)", big))
        for label, path in cases:
            console.print(f"[dim]running {label} ...[/]")
            lagom = run_lagom(path)
            hta = run_hta(path)
            rows.append((label, path.stat().st_size, lagom, hta))

    table = Table(title="lagom analyze vs Holistic Trace Analysis 0.5 (each in its own process)")
    for col in ("trace", "file MB", "lagom wall s", "HTA wall s", "wall speed-up", "lagom CPU s", "HTA CPU s",
                "CPU speed-up", "lagom MiB", "HTA MiB", "HTA/lagom mem", "overlap % lagom", "overlap % HTA"):
        table.add_column(col, justify="left" if col == "trace" else "right")
    for label, nbytes, (lw, lc, lm, lo), (hw, hc, hm, ho) in rows:
        table.add_row(label, f"{nbytes / 1e6:.1f}", f"{lw:.2f}", f"{hw:.2f}", f"{hw / lw:.1f}x", f"{lc:.2f}",
                      f"{hc:.2f}", f"{hc / lc:.1f}x", f"{lm:.0f}", f"{hm:.0f}", f"{hm / lm:.1f}x",
                      "n/a" if lo is None else f"{lo:.2f}", "n/a" if ho is None else f"{ho:.2f}")
    Console(width=200).print(table)
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(f"(this process peaked at {own:.0f} MiB, a floor for the children's figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
