"""How fast the simulator evaluates the paper's workloads (target: <= 50 ms for
FSDP Llama-3-8B on 16 GPUs, the largest generated workload, so a search of a few hundred
evaluations judged on the simulator takes seconds).

    python3 bench/simulate_speed.py [--cluster low-bw] [--repeats 20] [--all]

Prints, per workload: ops, the cold first evaluation (builds the per-workload cache),
the median warm evaluation with NCCL's defaults, the median with a changing plan (what a
search does: every call a different channel count) in wall-clock and CPU time (CPU time
is what this process spent, whatever else the machine runs), and the ratio to the 50 ms
budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.sim.simulator import Simulator  # noqa: E402
from nccl_env import CommConfig, Plan  # noqa: E402
from traces.generate import PAPER_WORKLOADS, generate_workload  # noqa: E402

BUDGET_MS = 50.0
TARGET = "fsdp:llama3-8b:gpus=16"


def measure(spec: str, cluster_name: str, repeats: int) -> dict:
    cluster = load_cluster(cluster_name)
    workload = generate_workload(spec)
    sim = Simulator(cluster)
    t0 = time.perf_counter()
    sim.evaluate(workload, Plan())
    cold = (time.perf_counter() - t0) * 1e3
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sim.evaluate(workload, Plan())
        warm.append((time.perf_counter() - t0) * 1e3)
    searching = []
    cpu = []
    for k in range(repeats):
        plan = Plan(default=CommConfig(channels=1 + k % 16, chunk_bytes=(256 << 10) << (k % 4)))
        t0, c0 = time.perf_counter(), time.process_time()
        sim.evaluate(workload, plan)
        searching.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return {
        "spec": spec,
        "ops": len(workload.compute_ops) + len(workload.collectives),
        "cold_ms": cold,
        "warm_ms": statistics.median(warm),
        "search_ms": statistics.median(searching),
        "search_cpu_ms": statistics.median(cpu),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="low-bw")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--all", action="store_true", help="all 16 paper workloads, not only the target")
    args = parser.parse_args()
    specs = list(dict.fromkeys([TARGET, *(PAPER_WORKLOADS if args.all else [])]))
    print(f"cluster {args.cluster}, {args.repeats} repeats, budget {BUDGET_MS:.0f} ms per evaluation")
    print(f"{'workload':42s} {'ops':>5s} {'cold ms':>8s} {'warm ms':>8s} {'search ms':>9s} {'cpu ms':>7s} "
          f"{'budget/search':>13s} {'evals/s':>8s}")
    for spec in specs:
        r = measure(spec, args.cluster, args.repeats)
        print(f"{r['spec']:42s} {r['ops']:5d} {r['cold_ms']:8.1f} {r['warm_ms']:8.1f} {r['search_ms']:9.1f} "
              f"{r['search_cpu_ms']:7.1f} {BUDGET_MS / r['search_ms']:12.1f}x {1e3 / r['search_ms']:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
