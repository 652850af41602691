"""Speed of the analytic Evaluator against the simulator, side by side on one workload.

Both evaluate the same sequence of plans, the way a tuner does: NCCL's default, then
one signature's setting changed at a time (random channels, chunk, threads).

* cold: fresh evaluators, so every new setting is met for the first time (the
  workload's static data is built by a first, untimed evaluation, as a tuner's first
  call does);
* warm: the same sequence again on the same evaluators (a search revisiting settings).

CPU time (time.process_time), best of --repeats, so other processes on the machine
disturb the ratio less.

    python3 bench/evaluator_speed.py                          # fsdp:llama3-8b:gpus=16 on low-bw
    python3 bench/evaluator_speed.py --workload tp:phi2:tp=8,dp=2 --evals 100
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.analytic.evaluator import AnalyticEvaluator  # noqa: E402
from costmodel.calibration.accuracy import random_config, signatures_of  # noqa: E402
from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.sim.simulator import Simulator  # noqa: E402
from nccl_env.plan import Plan  # noqa: E402
from traces.generate import generate_workload  # noqa: E402


def plans(workload, cluster, count: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    sigs = signatures_of(workload, cluster)
    out = [Plan()]
    for i in range(count - 1):
        sig = sigs[i % len(sigs)]
        out.append(out[-1].with_entry(sig, random_config(rng, sig)))
    return out


def per_eval_ms(make, workload, plan_list, repeats: int) -> tuple[float, float]:
    """(cold, warm) CPU milliseconds per evaluation, best of ``repeats``."""
    cold = warm = float("inf")
    for _ in range(repeats):
        evaluator = make()
        evaluator.evaluate(workload, Plan())  # static data, as a tuner's first call
        t0 = time.process_time()
        for p in plan_list:
            evaluator.evaluate(workload, p)
        t1 = time.process_time()
        for p in plan_list:
            evaluator.evaluate(workload, p)
        t2 = time.process_time()
        cold = min(cold, (t1 - t0) / len(plan_list) * 1e3)
        warm = min(warm, (t2 - t1) / len(plan_list) * 1e3)
    return cold, warm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="fsdp:llama3-8b:gpus=16")
    parser.add_argument("--cluster", default="low-bw")
    parser.add_argument("--evals", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    cluster = load_cluster(args.cluster)
    workload = generate_workload(args.workload)
    n_ops = len(workload.compute_ops) + len(workload.collectives)
    plan_list = plans(workload, cluster, args.evals, seed=0)
    t0 = time.process_time()
    AnalyticEvaluator(cluster).evaluate(workload, Plan())
    first_ms = (time.process_time() - t0) * 1e3
    a_cold, a_warm = per_eval_ms(lambda: AnalyticEvaluator(cluster), workload, plan_list, args.repeats)
    s_cold, s_warm = per_eval_ms(lambda: Simulator(cluster, noise=0.0), workload, plan_list, args.repeats)
    print(f"workload {args.workload} on {args.cluster}: {n_ops} ops, "
          f"{len(signatures_of(workload, cluster))} signatures, {args.evals} plans (one setting changed each)")
    print(f"{'':10s} {'cold ms/eval':>13s} {'warm ms/eval':>13s}")
    print(f"{'simulator':10s} {s_cold:13.3f} {s_warm:13.3f}")
    print(f"{'analytic':10s} {a_cold:13.3f} {a_warm:13.3f}   (first evaluation, static data: {first_ms:.1f} ms)")
    print(f"{'speedup':10s} {s_cold / a_cold:12.1f}x {s_warm / a_warm:12.1f}x   (target >= 10x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
