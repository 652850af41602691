"""Replay accuracy on the shared traces: each complete profiler step replayed with the
trace's own settings (both evaluators share the replay; the analytic one is used)
against what the trace measured, and how long ``lagom tune`` takes on the largest.

    python3 bench/replay_accuracy.py [TRACE_DIR] [--no-tune]

Columns: steps, median and worst per-step error of step time, total collective time
error, exposed communication error (% and us per step), and a structural check: the
same replay with every op's own launch latency and queue gap replaced by the trace's
medians (how much of the fidelity the graph's dependencies carry by themselves), and the
ops those medians leave unexplained: an op is late when it started more than ``LATE_US``
after ``max(call + median latency, ready + median gap)``, ``ready`` the end of its stream
predecessor and its producers (count, and their summed excess in ms).
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.replay.schedule import fidelity, replay, replay_static  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402
from traces.kineto import read_trace  # noqa: E402
from traces.workload import CollectiveOp, ComputeOp, Workload  # noqa: E402

LARGEST = "a100_w16_sendrecv_3streams_rank0.json.gz"
LATE_US = 100.0  # well above the traces' median queue gaps (a few us): a wait, not launch jitter


def late_ops(w: Workload) -> dict[int, float]:
    """Op id -> how much later than the graph with median delays explains it started (late ops only)."""
    g = w.exec_graph
    assert g is not None
    ops: dict[int, ComputeOp | CollectiveOp] = {o.op_id: o for o in w.compute_ops}
    ops.update((o.op_id, o) for o in w.collectives)
    producers: dict[int, list[int]] = {}
    for d in w.dependencies:
        producers.setdefault(d.after, []).append(d.before)
    for sw in g.stream_waits:
        producers.setdefault(sw.consumer, []).append(sw.producer)
    prev_end: dict[int, float] = {}  # stream -> latest end so far
    late: dict[int, float] = {}
    for op in sorted(ops.values(), key=lambda o: (o.start_us, o.op_id)):
        ends = [ops[p].end_us for p in producers.get(op.op_id, ()) if p in ops]
        if op.stream in prev_end:
            ends.append(prev_end[op.stream])
        bounds = [max(ends) + g.median_gap_us] if ends else []
        if op.op_id in g.launches:
            bounds.append(g.launches[op.op_id].call_us + g.median_latency_us)
        prev_end[op.stream] = max(prev_end.get(op.stream, op.end_us), op.end_us)
        if bounds and op.start_us - max(bounds) > LATE_US:
            late[op.op_id] = op.start_us - max(bounds)
    return late


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    folder = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "shared" / "traces"
    if not folder.is_dir():
        folder = Path("/work/shared/traces")
    load_cluster("a100-nvswitch")
    print(f"{'trace':38} {'steps':>5} {'median%':>8} {'worst%':>7} {'coll%':>7} {'exp%':>7} {'exp us/st':>10} "
          f"{'generic%':>9} {'late ops':>8} {'late ms':>8}")
    for path in sorted(folder.glob("*.json.gz")):
        try:
            w = read_trace(path)[0]
        except LagomError:
            continue
        if w.exec_graph is None or len(w.exec_graph.steps) < 2:
            continue
        st = replay_static(w)
        fid = fidelity(replay(w, st.measured_dur))
        g = replace(w, exec_graph=w.exec_graph.with_median_delays())
        gen = fidelity(replay(g, replay_static(g).measured_dur))
        assert fid is not None and gen is not None
        late = late_ops(w)
        print(f"{path.name[:38]:38} {fid.steps:>5} {fid.median_step_error_pct:>8.2f} {fid.max_step_error_pct:>7.2f} "
              f"{fid.comm_error_pct:>7.2f} {fid.exposed_error_pct:>7.2f} {fid.exposed_error_us_per_step:>10.1f} "
              f"{gen.median_step_error_pct:>9.2f} {len(late):>8} {sum(late.values()) / 1000:>8.1f}")
    if "--no-tune" not in sys.argv and (folder / LARGEST).exists():
        started = time.process_time()
        t0 = time.perf_counter()
        cmd = [sys.executable, "-m", "lagom", "tune", str(folder / LARGEST), "--cluster", "a100-nvswitch",
               "-o", "/tmp/replay_accuracy_tune.yaml", "--json"]
        subprocess.run(cmd, check=True, capture_output=True)
        wall = time.perf_counter() - t0
        import resource

        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"lagom tune {LARGEST}: {wall:.1f} s wall, {cpu.ru_utime + cpu.ru_stime:.1f} s CPU "
              f"(calibration cached; {time.process_time() - started:.1f} s here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
