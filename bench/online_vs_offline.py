"""Online tuning against offline tuning, on the simulator's clock.

For each cell of the quick bench matrix (``--full``: also the 16-GPU, two-node cells,
where the two presets' plans differ), with NCCL 2.30 doors (``--nccl-version``): the
offline plan of each cluster is tuned as ``lagom bench`` tunes it (the calibrated
analytic model); then online tuning runs in process with ``--ranks`` simulated ranks
whose step times come from the simulator of the *measuring* cluster at ``--noise``
(independent per rank and epoch), through the same controller, decision protocol and
store code as ``lagom run --online``. Three online runs per cell:

- ``defaults``: seeded with NCCL's defaults (no file);
- ``same``: seeded with the measuring cluster's own offline plan;
- ``cross``: seeded with the other cluster's offline plan.

Every plan is judged on the measuring cluster's simulator without noise. Printed per
run: speedup over NCCL, its ratio to the measuring cluster's offline plan's speedup,
evaluations (measured plans) per signature, steps spent, kept/reverted; the summary:
the worst ratios (goal >= 0.98), the worst seeded evaluations per signature (goal <= 8;
the Lagom paper's 33 iterations for two collectives are 16.5 each), and how many results are slower than their seed
(goal 0).

    python3 bench/online_vs_offline.py [--full] [--ranks 4] [--noise 0.02] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import load_cluster  # noqa: E402
from lagom.args.knob_args import parse_nccl_version_arg  # noqa: E402
from lagom.online.agent import simulate_online  # noqa: E402
from lagom.online.controller import OnlineController, OnlineSettings  # noqa: E402
from lagom.orchestration import bench_matrix, tuning  # noqa: E402
from nccl_env.plan import Plan  # noqa: E402
from nccl_env.rules import NcclVersion  # noqa: E402
from traces.generate import PAPER_WORKLOADS  # noqa: E402
from tuner import LagomSearch  # noqa: E402

OTHER = {"low-bw": "high-bw", "high-bw": "low-bw"}


def offline_plans(spec: str, version: NcclVersion) -> dict[str, Plan]:
    plans = {}
    for preset in bench_matrix.CLUSTERS:
        cluster = tuning.with_nccl_version(tuning.calibrated_cluster(preset), version)
        workload = tuning.load_workload_arg(spec)
        plans[preset] = LagomSearch().tune(workload, tuning.make_evaluator("analytic", cluster),
                                           tuning.space_for(workload, cluster)).plan
    return plans


def run_cell(spec: str, preset: str, offline: dict[str, Plan], args: argparse.Namespace) -> list[dict]:
    cluster = tuning.with_nccl_version(load_cluster(preset), args.nccl_version)
    workload = tuning.load_workload_arg(spec)
    space = tuning.space_for(workload, cluster)
    judge = tuning.make_evaluator("sim", cluster, noise=0.0)
    nccl_us = judge.evaluate(workload, Plan()).iteration_us
    offline_speedup = nccl_us / judge.evaluate(workload, offline[preset]).iteration_us
    rows = []
    for seeded, seed in (("defaults", None), ("same", offline[preset]), ("cross", offline[OTHER[preset]])):
        started = time.perf_counter()
        controller = OnlineController(workload, space, seed, OnlineSettings(budget_steps=args.budget_steps))
        agents = simulate_online(controller, cluster, args.ranks, args.noise, seed=args.seed)
        speedup = nccl_us / judge.evaluate(workload, controller.final).iteration_us
        seed_speedup = nccl_us / judge.evaluate(workload, controller.seed).iteration_us
        rows.append({
            "cluster": preset, "workload": spec, "seed": seeded, "signatures": len(space.signatures),
            "speedup_vs_nccl": round(speedup, 4), "offline_speedup_vs_nccl": round(offline_speedup, 4),
            "ratio_to_offline": round(speedup / offline_speedup, 4), "seed_speedup_vs_nccl": round(seed_speedup, 4),
            "evaluations": controller.evaluations,
            "evaluations_per_signature": round(controller.evaluations / len(space.signatures), 2),
            "steps_spent": controller.steps_spent, "result": controller.result,
            "slower_than_seed": speedup < seed_speedup * (1 - 1e-9),
            "ranks_agree": all(a.epochs == agents[0].epochs for a in agents),
            "wall_s": round(time.perf_counter() - started, 2),
        })
    return rows


def summarize(rows: list[dict]) -> dict:
    seeded = [r for r in rows if r["seed"] != "defaults"]
    return {
        "min_ratio_defaults": min(r["ratio_to_offline"] for r in rows if r["seed"] == "defaults"),
        "min_ratio_same": min(r["ratio_to_offline"] for r in rows if r["seed"] == "same"),
        "min_ratio_cross": min(r["ratio_to_offline"] for r in rows if r["seed"] == "cross"),
        "max_evaluations_per_signature_seeded": max(r["evaluations_per_signature"] for r in seeded),
        "mean_evaluations_per_signature_seeded": round(
            sum(r["evaluations_per_signature"] for r in seeded) / len(seeded), 2
        ),
        "max_steps_spent": max(r["steps_spent"] for r in rows),
        "slower_than_seed": sum(r["slower_than_seed"] for r in rows),
        "ranks_disagree": sum(not r["ranks_agree"] for r in rows),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="also the 16-GPU (two-node) cells")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--noise", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-steps", type=int, default=OnlineSettings().budget_steps)
    parser.add_argument("--nccl-version", type=parse_nccl_version_arg, default=NcclVersion(2, 30, 3))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    specs = bench_matrix.matrix_specs(quick=True)
    if args.full:
        specs += [s for s in PAPER_WORKLOADS if s.endswith("16") or "dp=2" in s]
    rows: list[dict] = []
    for spec in specs:
        offline = offline_plans(spec, args.nccl_version)
        for preset in bench_matrix.CLUSTERS:
            for row in run_cell(spec, preset, offline, args):
                rows.append(row)
                if not args.json:
                    print(f"{row['cluster']:8} {row['workload']:34} seed {row['seed']:8} x{row['speedup_vs_nccl']:.4f} "
                          f"(offline x{row['offline_speedup_vs_nccl']:.4f}, ratio {row['ratio_to_offline']:.4f}, "
                          f"seed x{row['seed_speedup_vs_nccl']:.4f}) {row['evaluations']} evals "
                          f"({row['evaluations_per_signature']}/sig), {row['steps_spent']} steps, {row['result']}",
                          flush=True)
    summary = summarize(rows)
    if args.json:
        print(json.dumps({"cells": rows, "summary": summary}, indent=1))
    else:
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
