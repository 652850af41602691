"""Every rank at once, at scale: N ranks replayed jointly against N one-rank replays (issue 26).

    python3 bench/joint_scaling.py [--ranks 8,64] [--source NAME]

The folder holds N copies of one shared trace (default the 20 MB
a100_w16_sendrecv_3streams_rank0) rewritten as the distinct ranks of one job
(tests/kineto_builder.py ``write_rank_copies``). Each N runs in its own child process,
which reads the folder once (``traces.kineto.read_trace``) and then times, in CPU
seconds of the process:

- one rank: each rank replayed alone under the trace's own settings (the command's
  ``ReplayEvaluator.evaluate``, which holds the last few ranks' replay data, so each
  rank's are built for it), N times;
- joint build: ``lagom.orchestration.joint_run.JointEvaluator(...)``: every rank's replay data and
  graph edges, the ranks matched and aligned (``traces.rank_join``), built once;
- joint: what ``lagom simulate DIR`` then does per plan, ``JointEvaluator.joint``: each
  rank's durations under the plan from the evaluator's mechanism, every rank scheduled at
  once and each rank's figures; and a further plan (as ``lagom tune DIR`` asks many: the
  data already built), the median of five, in ms per rank,

and prints the reading's time, both replays' and the child's peak resident memory
(``ru_maxrss``). The machine's load average is printed with them: on a shared machine
CPU seconds are the figure to compare, wall seconds move with the load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from analyze_vs_hta import shared_traces_dir  # noqa: E402
from kineto_builder import write_rank_copies  # noqa: E402

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[2])
from lagom.orchestration.joint_run import JointEvaluator
from lagom.orchestration.trace_context import resolve_cluster
from lagom.orchestration.tuning import make_evaluator
from nccl_env.plan import Plan
from traces.reader import read_trace

t = time.process_time()
workloads = read_trace(sys.argv[1])
read_s = time.process_time() - t
low = min(workloads, key=lambda w: w.rank)
evaluator = make_evaluator("sim", resolve_cluster(low, True, None).cluster, workload=low)
t = time.process_time()
alone = [evaluator.evaluate(w, Plan()).iteration_us for w in workloads]
alone_s = time.process_time() - t
t = time.process_time()
jev = JointEvaluator(evaluator, workloads)
build_s = time.process_time() - t
t = time.process_time()
joint = jev.joint(Plan())
joint_s = time.process_time() - t
times = []
for _ in range(5):
    t = time.process_time()
    again = jev.joint(Plan())
    times.append(time.process_time() - t)
again_s = sorted(times)[2]
peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"ranks": len(workloads), "ops_per_rank": len(jev.data.data[low.rank].static.op_ids),
                  "read_s": read_s, "alone_s": alone_s, "build_s": build_s, "joint_s": joint_s,
                  "again_s": again_s, "peak_mib": peak_mib,
                  "job_step_us": joint.timing.iteration_us, "alone_step_us": max(alone)}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="8,64", help="rank counts, comma-separated (default 8,64)")
    parser.add_argument("--source", default="a100_w16_sendrecv_3streams_rank0.json.gz", help="the shared trace copied")
    parser.add_argument("--json", action="store_true", help="one JSON list of the rows (bench/figures.py reads it)")
    args = parser.parse_args()
    source = shared_traces_dir() / args.source
    say = (lambda *a, **k: None) if args.json else print
    say(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    say(f"{'ranks':>5} {'ops/rank':>8} {'read s':>7} {'N one-rank s':>12} {'build s':>7} {'joint s':>8} "
        f"{'again ms/rank':>13} {'wall s':>7} {'peak MiB':>8} {'load':>5}")
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        with tempfile.TemporaryDirectory(prefix="joint-") as tmp:
            write_rank_copies(source, n, Path(tmp))
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", CHILD, tmp, str(REPO_ROOT)], capture_output=True, text=True,
                                  check=False)
            wall = time.perf_counter() - started
            if done.returncode != 0:
                print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
                return 1
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r.update(wall_s=wall, again_ms_per_rank=r["again_s"] * 1e3 / r["ranks"], load=os.getloadavg()[0])
            rows.append(r)
            say(f"{r['ranks']:>5} {r['ops_per_rank']:>8} {r['read_s']:7.1f} {r['alone_s']:12.1f} "
                f"{r['build_s']:7.1f} {r['joint_s']:8.1f} {r['again_ms_per_rank']:13.2f} {wall:7.1f} "
                f"{r['peak_mib']:8.0f} {r['load']:5.1f}")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
