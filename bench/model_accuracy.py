"""Accuracy of the analytic cost model against the simulator, side by side.

For each cluster: calibrate the analytic model on the simulator (``sim:PRESET``,
default 1% noise, at most --budget measurements of tiny workloads), then compare,
at zero simulator noise, on workloads and settings calibration never saw:

* MAPE of iteration, compute-busy and communication-busy time over generated
  workloads (paper models and custom shapes) x (NCCL default + random settings);
* ranking: for --windows random overlap windows, the candidate setting the model
  likes best, timed by the simulator, against the simulator's own best.

Three models are compared: the hardware defaults (no calibration), a start point with
every parameter off by a random factor in [1 - p, 1 + p] (--perturb), and the model
calibrated from that start. On the simulator the defaults are already close, because
the simulator is built from the same public NCCL and datasheet constants; the
perturbed start shows what calibration recovers when they are not.

    python3 bench/model_accuracy.py                 # low-bw and high-bw, full
    python3 bench/model_accuracy.py --quick         # fewer plans and windows
    python3 bench/model_accuracy.py --json          # the rows as JSON (no times)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.analytic.evaluator import AnalyticEvaluator  # noqa: E402
from costmodel.analytic.params import default_params, param_spec  # noqa: E402
from costmodel.calibration import accuracy  # noqa: E402
from costmodel.calibration.backend import SimBackend  # noqa: E402
from costmodel.calibration.calibrate import calibrate  # noqa: E402
from costmodel.cluster import load_cluster  # noqa: E402
from costmodel.sim.simulator import Simulator  # noqa: E402
from nccl_env.plan import Plan  # noqa: E402
from traces.generate import generate_workload  # noqa: E402

# Held-out workloads: none of them is measured by calibration (which times tiny
# one-kernel, one-collective workloads). Two are custom shapes no paper used.
WORKLOADS = {
    8: [
        "fsdp:phi2:gpus=8",
        "tp:phi2:tp=8,dp=1",
        "ep:olmoe:ep=8",
        "fsdp:hidden=3072,layers=12,ffn=8192,heads=24,vocab=32000:gpus=8",
    ],
    16: [
        "fsdp:llama3-8b:gpus=16",
        "tp:mpt-7b:tp=8,dp=2",
        "fsdp:hidden=5120,layers=8,ffn=13824,heads=40,vocab=32000:gpus=16",
    ],
}
QUICK_WORKLOADS = {8: WORKLOADS[8][:1] + WORKLOADS[8][2:], 16: WORKLOADS[16][2:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", default="low-bw,high-bw")
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--plans", type=int, default=5, help="random settings per workload (plus NCCL's default)")
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=16, help="settings tried per window")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--perturb", type=float, default=0.3, help="start point: parameters x U(1-p, 1+p)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON (no times)")
    args = parser.parse_args(argv)
    if args.quick:
        args.plans, args.windows, args.candidates = 2, 8, 10
    say = (lambda *a: None) if args.json else print
    rows: list[dict] = []
    say(f"{'cluster':8s} {'model':12s} {'iter MAPE':>10s} {'comp MAPE':>10s} {'coll MAPE':>10s} "
          f"{'max iter':>9s} {'rank gap mean':>14s} {'max':>6s} {'<=2%':>6s}")
    for name in args.clusters.split(","):
        preset = load_cluster(name)
        start_rng = random.Random(args.seed)
        start = {k: min(param_spec(k).upper, max(param_spec(k).lower,
                                                 v * start_rng.uniform(1 - args.perturb, 1 + args.perturb)))
                 for k, v in default_params(preset).items()}
        t0 = time.perf_counter()
        fitted = calibrate(SimBackend(preset, noise=0.01, seed=args.seed), budget=args.budget, seed=args.seed,
                           start=start)
        calib_s = time.perf_counter() - t0
        truth = Simulator(preset, noise=0.0)
        rng = random.Random(args.seed)
        specs = (QUICK_WORKLOADS if args.quick else WORKLOADS)
        workloads = [generate_workload(s) for n, group in specs.items() if n <= preset.world_size for s in group]
        cases = []
        for w in workloads:
            cases.append((w, Plan()))
            cases += [(w, accuracy.random_plan(rng, w, preset)) for _ in range(args.plans)]
        windows = []
        for w in workloads:
            windows += [(w, win) for win in accuracy.compute_bound_windows(w)]
        rng.shuffle(windows)
        windows = windows[: args.windows]
        models = (("defaults", AnalyticEvaluator(preset)), ("start", AnalyticEvaluator(preset, start)),
                  ("calibrated", AnalyticEvaluator(fitted.cluster)))
        for label, model in models:
            stats = accuracy.compare_timings(model, truth, cases)
            gaps = []
            for w, win in windows:
                sub = accuracy.window_workload(w, win)
                sig = accuracy.signatures_of(sub, preset)[0]
                gaps.append(accuracy.ranking_gap(model, truth, sub, preset,
                                                 accuracy.candidate_configs(rng, sig, args.candidates)).gap_pct)
            within = sum(g <= 2.0 for g in gaps)
            rows.append({"cluster": name, "model": label, "iteration_mape_pct": round(stats["iteration"].mape_pct, 4),
                         "compute_mape_pct": round(stats["compute"].mape_pct, 4),
                         "collective_mape_pct": round(stats["collective"].mape_pct, 4),
                         "iteration_max_pct": round(stats["iteration"].max_pct, 4),
                         "ranking_gap_mean_pct": round(sum(gaps) / max(1, len(gaps)), 4),
                         "ranking_gap_max_pct": round(max(gaps, default=0), 4), "windows_within_2pct": within,
                         "windows": len(gaps)})
            say(f"{name:8s} {label:12s} {stats['iteration'].mape_pct:9.2f}% {stats['compute'].mape_pct:9.2f}% "
                  f"{stats['collective'].mape_pct:9.2f}% {stats['iteration'].max_pct:8.2f}% "
                  f"{sum(gaps) / max(1, len(gaps)):13.2f}% {max(gaps, default=0):5.2f}% {within:3d}/{len(gaps)}")
        say(f"{'':8s} calibration: {fitted.report.measurements} measurements (1% noise), fit MAPE "
              f"{fitted.report.default_mape_pct:.2f}% at the start -> {fitted.report.mape_pct:.2f}%, {calib_s:.1f} s; "
              f"{len(cases)} held-out cases on {len(workloads)} workloads, {len(windows)} windows")
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
