"""How Lagom's cost grows with the trace: a shared trace's events repeated 1x, 4x and 11x.

    python3 bench/trace_scaling.py [TRACE] [--copies 1,4,11] [--tune]

Each copy of the trace's events is shifted past the previous one (its span plus a gap), its
correlation/External/flow ids offset and its ProfilerStep numbers continued, so the result
reads as one longer run of the same job. Every stage runs in a fresh process, so its peak
resident memory is its own: ``read`` (read_trace: parse, workload, execution graph), ``replay``
(the replay's static data built and one evaluation under the recorded settings), ``evaluate``
(one evaluation under another plan once that is built: the median of seven), ``analyze`` (the CLI's --json) and,
with ``--tune``, ``lagom tune``. Times are CPU seconds (this machine's other jobs move wall time
by +-30%). The last line is the growth from the second to the last size (time and peak memory)
against the growth in ops: linear means the same ratio (sorting adds a log factor: about 1.1x
over 4x to 11x). A fresh process per size flatters the smaller trace (its heap is smaller, so its
data sit closer in memory); the last line times one evaluation of both sizes side by side in one
process, interleaved.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = "a100_w16_sendrecv_3streams_rank0.json.gz"
_ID_ARGS = ("correlation", "External id", "Ev Idx", "Python id", "Python parent id")

_STAGE = r'''
import json, resource, sys, time
sys.path.insert(0, {root!r})
path, stage = {path!r}, {stage!r}
t0 = time.process_time()
if stage == "read":
    from traces.reader import read_trace
    ops = sum(len(w.compute_ops) + len(w.collectives) for w in read_trace(path))
elif stage in ("replay", "evaluate"):
    from traces.reader import read_trace
    from costmodel.analytic.evaluator import AnalyticEvaluator
    from costmodel.cluster import load_cluster
    from costmodel.replay.trace_evaluator import ReplayEvaluator
    from nccl_env.knobs import CommConfig
    from nccl_env.plan import Plan
    w = read_trace(path)[0]
    ev = ReplayEvaluator(AnalyticEvaluator(load_cluster("a100-nvswitch")), 8)
    t0 = time.process_time()
    ev.evaluate(w, Plan())
    ops = len(w.compute_ops) + len(w.collectives)
    if stage == "evaluate":  # steady state: the median of seven plans' evaluations
        times = []
        for channels in (2, 3, 4, 6, 8, 12, 16):
            t = time.process_time()
            ev.evaluate(w, Plan(default=CommConfig(channels=channels)))
            times.append(time.process_time() - t)
        t0 = time.process_time() - sorted(times)[3]
else:
    import subprocess
    args = ["analyze", path, "--json"] if stage == "analyze" else [
        "tune", path, "--cluster", "a100-nvswitch", "-o", {out!r}, "--json"]
    subprocess.run([sys.executable, "-m", "lagom", *args], check=True, capture_output=True, cwd={root!r})
    ops = 0
elapsed = time.process_time() - t0
own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
children = resource.getrusage(resource.RUSAGE_CHILDREN)
kids = children.ru_maxrss
if stage in ("analyze", "tune"):
    elapsed = children.ru_utime + children.ru_stime
print(json.dumps({{"s": elapsed, "peak_mib": max(own, kids) / 1024, "ops": ops}}))
'''


_SIDE_BY_SIDE = r'''
import json, statistics, sys, time
sys.path.insert(0, {root!r})
from traces.reader import read_trace
from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import load_cluster
from costmodel.replay.trace_evaluator import ReplayEvaluator
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan
loaded = [read_trace(p)[0] for p in {paths!r}]
evaluators = [ReplayEvaluator(AnalyticEvaluator(load_cluster("a100-nvswitch")), 8) for _ in loaded]
for w, ev in zip(loaded, evaluators):
    ev.evaluate(w, Plan())
times = [[] for _ in loaded]
for rep in range(3):
    for channels in (2, 3, 4, 6, 8, 12, 16):
        for k, (w, ev) in enumerate(zip(loaded, evaluators)):
            t = time.process_time()
            ev.evaluate(w, Plan(default=CommConfig(channels=channels)))
            times[k].append(time.process_time() - t)
print(json.dumps([statistics.median(t) for t in times]))
'''


def side_by_side(paths: list[Path]) -> list[float]:
    """One evaluation's CPU seconds per trace, all loaded in one process and timed interleaved:
    the same heap for every size (a fresh process flatters the smaller trace's memory locality)."""
    code = _SIDE_BY_SIDE.format(root=str(ROOT), paths=[str(p) for p in paths])
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def repeated(source: Path, copies: int, out: Path) -> None:
    """``copies`` runs of the trace's events, one after the other, written to ``out``."""
    doc = orjson.loads(gzip.decompress(source.read_bytes()) if source.name.endswith(".gz") else source.read_bytes())
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    start = min(e["ts"] for e in timed)
    end = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = end - start + 1000.0
    steps = sorted({int(e["name"].split("#")[1]) for e in events
                    if str(e.get("name", "")).startswith("ProfilerStep#")})
    step_count = (steps[-1] - steps[0] + 1) if steps else 0
    id_span = 1 + max([int(v) for e in events for k, v in (e.get("args") or {}).items()
                       if k in _ID_ARGS and isinstance(v, int)] + [int(e["id"]) for e in events
                                                                    if isinstance(e.get("id"), int)] + [0])
    out_events: list[dict] = []
    for c in range(copies):
        for e in events:
            if c and e.get("ph") == "M":
                continue  # metadata once
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + c * span
            if isinstance(e2.get("id"), int):
                e2["id"] = e2["id"] + c * id_span
            args = e2.get("args")
            if isinstance(args, dict) and c:
                e2["args"] = {k: (v + c * id_span if k in _ID_ARGS and isinstance(v, int) and v >= 0 else v)
                              for k, v in args.items()}
            name = e2.get("name")
            if c and isinstance(name, str) and name.startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(name.split('#')[1]) + c * step_count}"
            out_events.append(e2)
    doc["traceEvents"] = out_events
    with gzip.open(out, "wb", compresslevel=1) as f:
        f.write(orjson.dumps(doc))


def measure(path: Path, stage: str, tmp: Path) -> dict:
    code = _STAGE.format(root=str(ROOT), path=str(path), stage=stage, out=str(tmp / "tune.yaml"))
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    args = sys.argv[1:]
    positional = [a for a in args if not a.startswith("--") and not a[0].isdigit()]
    source = Path(positional[0]) if positional else ROOT.parent / "shared" / "traces" / DEFAULT_TRACE
    if not source.is_file():
        print(f"{source}: no such trace (give one: python3 bench/trace_scaling.py TRACE)", file=sys.stderr)
        return 2
    copies = [1, 4, 11]
    if "--copies" in args:
        copies = [int(x) for x in args[args.index("--copies") + 1].split(",")]
    stages = ["read", "replay", "evaluate", "analyze", *(["tune"] if "--tune" in args else [])]
    print(f"{source.name}: its events repeated {copies} times; each stage in a fresh process")
    print(f"{'copies':>6} {'ops':>8} {'MB':>6} " + " ".join(f"{s + ' CPU s':>12} {s + ' MiB':>12}" for s in stages))
    rows = []
    paths: list[Path] = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for n in copies:
            path = tmp / f"x{n}.json.gz"
            t0 = time.perf_counter()
            repeated(source, n, path)
            made_s = time.perf_counter() - t0
            raw_mb = len(gzip.decompress(path.read_bytes())) / 1e6
            result = {s: measure(path, s, tmp) for s in stages}
            ops = result["read"]["ops"]
            rows.append((n, ops, result))
            print(f"{n:>6} {ops:>8} {raw_mb:>6.0f} " + " ".join(
                f"{result[s]['s']:>12.2f} {result[s]['peak_mib']:>12.0f}" for s in stages)
                + f"   (written in {made_s:.1f} s)", flush=True)
            paths.append(path)
        if len(rows) >= 2:
            (n0, ops0, r0), (n1, ops1, r1) = rows[-2], rows[-1]
            growth = ops1 / ops0
            parts = [f"{s}: time x{r1[s]['s'] / r0[s]['s']:.2f}, peak x{r1[s]['peak_mib'] / r0[s]['peak_mib']:.2f}"
                     for s in stages]
            print(f"from {n0}x to {n1}x ({growth:.2f}x the ops): " + "; ".join(parts))
            both = side_by_side(paths[-2:])
            print(f"one evaluation, both sizes in one process side by side: {both[0] * 1e3:.1f} ms -> "
                  f"{both[1] * 1e3:.1f} ms CPU, x{both[1] / both[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
