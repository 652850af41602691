"""Replay accuracy on the shared traces: each complete profiler step (the GPU's period)
replayed with the trace's own settings (both evaluators share the replay; the analytic
one is used) against what the trace measured, and how long ``lagom tune`` takes on the
largest.

    python3 bench/replay_accuracy.py [TRACE_DIR] [--no-tune] [--json]

Columns: steps, median and worst per-step error of step time, total collective time
error, exposed communication error (% and us per step); then two structural checks. An
op is *unexplained* when it started more than 100 us after ``max(call + median latency,
ready + median gap)`` (its causes in the graph, with the trace's median delays):
"explained%" replays every other op with the median latency and gap (what the graph's
dependencies carry by themselves) and those ops with their own; "unexpl." is the GPU
idle those ops waited, ms per step (wall time), and "all-median%" the error when they
take the medians too (how far such idle moves the steps once the replay can move them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.replay.fidelity import fidelity
from costmodel.replay.schedule import as_measured, replay, replay_static  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402
from traces.reader import read_trace  # noqa: E402
from traces.workload import Workload  # noqa: E402

LARGEST = "a100_w16_sendrecv_3streams_rank0.json.gz"


def explained_graph(w: Workload) -> Workload:
    """Median launch latency and queue gap for every op the graph explains; own delays for the rest."""
    g = w.exec_graph
    assert g is not None
    st = replay_static(w)
    late = {st.op_ids[k] for k in st.unexplained}
    medians = g.with_median_delays()
    return replace(w, exec_graph=replace(
        medians, launches={o: (g.launches[o] if o in late else la) for o, la in medians.launches.items()},
        gaps={o: (g.gaps[o] if o in late else v) for o, v in medians.gaps.items()}))


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    folder = Path(args[0]) if args else Path(__file__).resolve().parents[2] / "shared" / "traces"
    if not folder.is_dir():
        folder = Path("/work/shared/traces")
    load_cluster("a100-nvswitch")
    as_json = "--json" in sys.argv
    rows = []
    say = (lambda *a, **k: None) if as_json else print
    say(f"{'trace':38} {'steps':>5} {'median%':>8} {'worst%':>7} {'coll%':>7} {'exp%':>7} {'exp us/st':>10} "
          f"{'explained%':>10} {'unexpl. ms/st':>13} {'all-median%':>11}")
    for path in sorted(folder.glob("*.json.gz")):
        try:
            w = read_trace(path)[0]
        except LagomError:
            continue
        if w.exec_graph is None or len(w.exec_graph.steps) < 2:
            continue
        st = replay_static(w)
        own = replay(st, st.measured_dur)
        fid = fidelity(own)
        e = explained_graph(w)
        explained = fidelity(as_measured(e))
        g = replace(w, exec_graph=w.exec_graph.with_median_delays())
        generic = fidelity(as_measured(g))
        assert fid is not None and explained is not None and generic is not None
        rows.append({"trace": path.name, "steps": fid.steps, "median_step_error_pct": fid.median_step_error_pct,
                     "max_step_error_pct": fid.max_step_error_pct, "comm_error_pct": fid.comm_error_pct,
                     "exposed_error_pct": fid.exposed_error_pct,
                     "exposed_error_us_per_step": fid.exposed_error_us_per_step,
                     "explained_median_step_error_pct": explained.median_step_error_pct,
                     "unexplained_idle_ms_per_step": fid.unexplained_idle_us_per_step / 1000,
                     "all_median_step_error_pct": generic.median_step_error_pct,
                     # what the trace measured, the scale of the errors above (docs/replay.md's table)
                     "measured_step_ms": sum(s.measured_iteration_us for s in own.steps) / len(own.steps) / 1000,
                     "measured_comm_ms_per_step": sum(s.measured_comm_us for s in own.steps) / len(own.steps) / 1000})
        say(f"{path.name[:38]:38} {fid.steps:>5} {fid.median_step_error_pct:>8.2f} {fid.max_step_error_pct:>7.2f} "
              f"{fid.comm_error_pct:>7.2f} {fid.exposed_error_pct:>7.2f} {fid.exposed_error_us_per_step:>10.1f} "
              f"{explained.median_step_error_pct:>10.2f} {fid.unexplained_idle_us_per_step / 1000:>13.1f} "
              f"{generic.median_step_error_pct:>11.2f}")
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
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
