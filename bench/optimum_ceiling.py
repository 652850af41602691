"""How far the bench targets are reachable at all: the true optimum of each cell, by brute force.

For each cell of ``lagom bench``'s matrix on one cluster, every point of the search
space (the doors of the cell's NCCL, 1,980-38,016 points) is judged on the simulator
with noise off, split over worker processes. Lagom's plan is tuned exactly as
``lagom bench`` tunes it (the calibrated analytic model) and judged on the same
simulator. Prints per cell NCCL's default, Lagom and the optimum, side by side from one
run, and the geometric means: the optimum's speedup over NCCL is the most any method
searching this space could report.

On the NVLink presets (NCCL 2.30.7 without the plugin) the space has paths too
(symmetric kernels, copy engines: ``tuner.space`` path units). The same pass then also
keeps the best point on NCCL's kernels alone (every path unit at None): the old space's
optimum, beside the extended one; and Lagom's knob-only plan (its search without the
path phase) is judged beside its full plan.

    python3 bench/optimum_ceiling.py --cluster low-bw [--only fsdp: --only tp:] [--workers 2] [--json]
    python3 bench/optimum_ceiling.py --cluster h100-nvswitch  # FSDP and TP on one node, with paths

Cost on two cores: the 8-GPU FSDP and TP cells (1,980-3,300 points) take seconds, the
8-GPU EP cells (36,300) and the 16-GPU TP cells (33,000) 3-5 minutes each, the 16-GPU EP
cells (363,000: two data-parallel groups, the process chunk and threads, the AllToAll
step) 24 minutes for ep:olmoe-1b-7b:ep=8,gpus=16 on high-bw (1,446 s), about twice that
for the DeepSeek ones (each simulation takes twice as long). The NVLink cells (10,164-38,016
points with their paths) take 1-5 minutes each.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

from costmodel.cluster import load_cluster  # noqa: E402
from lagom.orchestration import bench_matrix, tuning  # noqa: E402
from nccl_env.delivery import group_paths  # noqa: E402
from nccl_env.plan import Plan  # noqa: E402
from tuner import AutoCCL, LagomSearch  # noqa: E402
from tuner.exhaustive import all_points  # noqa: E402

_WORKER: dict = {}


def cell_cluster(preset: str):
    """The preset at the NCCL its bench cells run (2.30.7 on the NVLink presets) and whether they
    use the tuner plugin (not on the NVLink presets)."""
    cluster = load_cluster(preset)
    if preset in bench_matrix.NVLINK_CLUSTERS:
        return tuning.with_nccl_version(cluster, bench_matrix.PATHS_NCCL_VERSION), False
    return cluster, True


def _init_worker(preset: str, spec: str) -> None:
    cluster, use_plugin = cell_cluster(preset)
    workload = tuning.load_workload_arg(spec)
    _WORKER.update(
        sim=tuning.make_evaluator("sim", cluster, noise=0.0),
        workload=workload,
        space=tuning.space_for(workload, cluster, use_plugin),
    )


def _best_of_slice(args: tuple[int, int]) -> tuple[float, float, int]:
    """(best iteration us, best on NCCL's kernels alone, points judged) over every ``parts``-th point."""
    part, parts = args
    sim, workload, space = _WORKER["sim"], _WORKER["workload"], _WORKER["space"]
    best_us, best_sm_us, judged = math.inf, math.inf, 0
    for index, point in enumerate(all_points(space)):
        if index % parts != part:
            continue
        us = sim.evaluate(workload, space.plan(point)).iteration_us
        judged += 1
        best_us = min(best_us, us)
        if all(path is None for _, path in point.paths):
            best_sm_us = min(best_sm_us, us)
    return best_us, best_sm_us, judged


def optimum_us(preset: str, spec: str, workers: int, on_slice) -> tuple[float, float, int]:
    """The simulator's best iteration time over the whole space, its best on NCCL's kernels
    alone (the space without paths), and the space's size."""
    parts = workers * 8  # small slices: steady progress, balanced workers
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (preset, spec)) as pool:
        best, best_sm, total = math.inf, math.inf, 0
        for best_us, best_sm_us, judged in pool.imap_unordered(_best_of_slice, [(p, parts) for p in range(parts)]):
            best, best_sm, total = min(best, best_us), min(best_sm, best_sm_us), total + judged
            on_slice(judged)
    return best, best_sm, total


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="low-bw", choices=bench_matrix.ALL_CLUSTERS)
    parser.add_argument("--only", action="append", default=[], metavar="PREFIX",
                        help="run the cells whose spec starts with PREFIX (repeatable; default: all 16)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    prefixes = args.only
    all_specs = [c.workload for c in bench_matrix.matrix_cells(False, (args.cluster,))]
    specs = [s for s in all_specs if not prefixes or any(s.startswith(p) for p in prefixes)]
    if not specs:
        print(f"--only {' '.join(prefixes)}: no cell of the matrix starts with that", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    judge_cluster, use_plugin = cell_cluster(args.cluster)
    judge = tuning.make_evaluator("sim", judge_cluster, noise=0.0)
    calibrated = tuning.calibrated_cluster(args.cluster, log=lambda m: err.print(m, highlight=False))
    tune_cluster = tuning.with_nccl_version(calibrated, judge_cluster.nccl_version)
    rows = []
    for spec in specs:
        workload = tuning.load_workload_arg(spec)
        space = tuning.space_for(workload, tune_cluster, use_plugin)
        lagom = LagomSearch().tune(workload, tuning.make_evaluator("analytic", tune_cluster), space)
        knobs = LagomSearch(probe_paths=False).tune(workload, tuning.make_evaluator("analytic", tune_cluster), space)
        autoccl = AutoCCL().tune(workload, tuning.make_evaluator("analytic", tune_cluster), space)
        started = time.perf_counter()
        with Progress(TextColumn(f"[bold]{spec}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True) as bar:
            task = bar.add_task("points", total=space.size())
            best_us, best_sm_us, points = optimum_us(args.cluster, spec, args.workers,
                                                     lambda n, t=task: bar.advance(t, n))
        nccl_us = judge.evaluate(workload, Plan()).iteration_us
        row: dict[str, Any] = {
            "workload": spec,
            "points": points,
            "nccl_us": round(nccl_us, 1),
            "lagom_us": round(judge.evaluate(workload, lagom.plan).iteration_us, 1),
            "lagom_knob_only_us": round(judge.evaluate(workload, knobs.plan).iteration_us, 1),
            "autoccl_us": round(judge.evaluate(workload, autoccl.plan).iteration_us, 1),
            "optimum_us": round(best_us, 1),
            "optimum_without_paths_us": round(best_sm_us, 1),
            "lagom_paths": {g: p.value for g, p in group_paths(lagom.plan).items()},
            "seconds": round(time.perf_counter() - started, 1),
        }
        rows.append(row)
        err.print(f"{spec}: NCCL {row['nccl_us']:,.0f} us, Lagom {row['lagom_us']:,.0f} us (knob-only "
                  f"{row['lagom_knob_only_us']:,.0f}), optimum {row['optimum_us']:,.0f} us (without paths "
                  f"{row['optimum_without_paths_us']:,.0f}) over {points:,} points in {row['seconds']:.0f} s",
                  highlight=False)
    summary = {
        "cluster": args.cluster,
        "nccl_version": str(judge_cluster.nccl_version),
        "tuner_plugin": use_plugin,
        "geomean_lagom_vs_nccl": round(geomean([r["nccl_us"] / r["lagom_us"] for r in rows]), 4),
        "geomean_optimum_vs_nccl": round(geomean([r["nccl_us"] / r["optimum_us"] for r in rows]), 4),
        "geomean_optimum_without_paths_vs_nccl": round(geomean([r["nccl_us"] / r["optimum_without_paths_us"]
                                                                for r in rows]), 4),
        "geomean_optimum_vs_autoccl": round(geomean([r["autoccl_us"] / r["optimum_us"] for r in rows]), 4),
        "max_gap_lagom_to_optimum": round(max(r["lagom_us"] / r["optimum_us"] - 1 for r in rows), 4),
        "cells": rows,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    table = Table(title=f"optimum by brute force on the simulator, {args.cluster} (NCCL {judge_cluster.nccl_version} "
                        f"doors{'' if use_plugin else ', no tuner plugin'})")
    for col in ("workload", "points", "Lagom vs NCCL", "knob-only", "optimum vs NCCL", "without paths",
                "optimum vs AutoCCL", "Lagom above optimum", "paths"):
        table.add_column(col, justify="left" if col in ("workload", "paths") else "right")
    for r in rows:
        table.add_row(r["workload"], f"{r['points']:,}", f"{r['nccl_us'] / r['lagom_us']:.3f}",
                      f"{r['nccl_us'] / r['lagom_knob_only_us']:.3f}", f"{r['nccl_us'] / r['optimum_us']:.3f}",
                      f"{r['nccl_us'] / r['optimum_without_paths_us']:.3f}", f"{r['autoccl_us'] / r['optimum_us']:.3f}",
                      f"{r['lagom_us'] / r['optimum_us'] - 1:+.2%}",
                      ", ".join(f"{g}:{p}" for g, p in r["lagom_paths"].items()) or "-")
    table.add_row("geomean", "", f"{summary['geomean_lagom_vs_nccl']:.3f}", "",
                  f"{summary['geomean_optimum_vs_nccl']:.3f}",
                  f"{summary['geomean_optimum_without_paths_vs_nccl']:.3f}",
                  f"{summary['geomean_optimum_vs_autoccl']:.3f}", f"max {summary['max_gap_lagom_to_optimum']:+.2%}", "")
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
