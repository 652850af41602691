"""Speed of the analytic Evaluator against the simulator, side by side on one workload.

Both evaluate the same sequence of plans, the way a tuner does: NCCL's default,
then one signature changed at a time. The analytic model is given its first
(cold) evaluation separately, since it builds the workload's static data once.

    python3 bench/evaluator_speed.py                          # fsdp:llama3-8b:gpus=16 on low-bw
    python3 bench/evaluator_speed.py --workload tp:phi2:tp=8,dp=2 --evals 200
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.accuracy import random_config, signatures_of  # noqa: E402
from costmodel.analytic import AnalyticEvaluator  # noqa: E402
from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.sim import Simulator  # noqa: E402
from nccl_env.plan import Plan  # noqa: E402
from traces.generate import generate_workload  # noqa: E402


def plans(workload, cluster, count: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    sigs = signatures_of(workload, cluster)
    out = [Plan()]
    for i in range(count - 1):
        out.append(out[-1].with_entry(sigs[i % len(sigs)], random_config(rng, sigs[i % len(sigs)])))
    return out


def per_eval_ms(evaluator, workload, plan_list) -> float:
    t0 = time.perf_counter()
    for p in plan_list:
        evaluator.evaluate(workload, p)
    return (time.perf_counter() - t0) / len(plan_list) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="fsdp:llama3-8b:gpus=16")
    parser.add_argument("--cluster", default="low-bw")
    parser.add_argument("--evals", type=int, default=100)
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    workload = generate_workload(args.workload)
    n_ops = len(workload.compute_ops) + len(workload.collectives)
    plan_list = plans(workload, cluster, args.evals, seed=0)
    analytic = AnalyticEvaluator(cluster)
    t0 = time.perf_counter()
    analytic.evaluate(workload, plan_list[0])
    cold_ms = (time.perf_counter() - t0) * 1e3
    a_ms = per_eval_ms(analytic, workload, plan_list)
    s_ms = per_eval_ms(Simulator(cluster, noise=0.0), workload, plan_list)
    print(f"workload {args.workload} on {args.cluster}: {n_ops} ops, "
          f"{len(signatures_of(workload, cluster))} signatures, {args.evals} plans")
    print(f"simulator   {s_ms:8.2f} ms / evaluation")
    print(f"analytic    {a_ms:8.2f} ms / evaluation (first, cold: {cold_ms:.2f} ms)")
    print(f"speedup     {s_ms / a_ms:8.1f} x  (target >= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
