"""`lagom bench [--quick] [--json] [--plot FILE.png]`: the tuner's regression matrix.

The paper's eight workloads (FSDP, TP, EP) on 8 and 16 GPUs of the ``low-bw`` and
``high-bw`` presets at the preset's NCCL, and the FSDP and TP ones on one node of the
NVLink presets (``a100-nvswitch``, ``h100-nvswitch``) at NCCL 2.30.7 without the tuner
plugin, where a process group may also take symmetric kernels or the copy engines (the
JSON's ``lagom_paths`` says which Lagom chose). Every method tunes with ``--evaluator`` (default: the analytic
model, calibrated once per cluster against the simulator and cached by preset
content in Lagom's cache folder, $LAGOM_CACHE_DIR), and every plan is judged on the
simulator with noise off. Per cell: Lagom's speedup over NCCL's default, AutoCCL and
Optuna TPE given Lagom's evaluation count; the gap to exhaustive search where the
space is small enough; the gap to the lower bound max(compute alone, communication
alone at its best); Lagom's evaluations. Then per cluster the geometric means, the
headroom (NCCL's time over the lower bound: the most any plan could gain) and the
fit of evaluations against the number of signatures.

--quick runs the smallest FSDP, TP and EP job per A40 cluster and the first FSDP and TP
job on h100-nvswitch (under 3 minutes). --check
makes the command exit 1 when Lagom misses what it owes in a cell: never behind NCCL's
default, within 0.5% of the optimum where exhaustive search runs, not behind Optuna at
equal budget (each with 0.5% for noise), and with --quick the regression floors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from costmodel.cluster import load_cluster
from lagom.args.common_args import add_cluster, add_evaluator, add_json, add_nccl_version
from lagom.args.knob_args import parse_nccl_version_arg
from lagom.files.output_paths import OutputFormat, check_output, save_figure
from lagom.orchestration import bench_matrix, tuning
from lagom.reports.console import stdout_console
from nccl_env.errors import LagomError

# What --check asserts per cell (and tests/test_bench_quick.py): what Lagom owes, each with
# 0.5% for noise. The geomean targets once set here (x1.10 over NCCL, x1.05 over AutoCCL)
# lie above the brute-force optimum of the search space on both clusters
# (bench/optimum_ceiling.py, docs/tuner.md), so no search could meet them.
MIN_SPEEDUP_VS_NCCL_ANY_CELL = 0.995  # never behind NCCL's default
MAX_GAP_TO_EXHAUSTIVE = 0.005  # within 0.5% of the optimum wherever exhaustive search runs
MIN_SPEEDUP_VS_OPTUNA_ANY_CELL = 0.995  # at least Optuna TPE given the same number of evaluations

# Regression floors of the --quick subset in CI (tests/test_bench_quick.py): the geomeans
# it measured when they were set (2026-11-30, after AllToAll was modelled on NCCL's p2p
# path: low-bw x1.075 / x1.059, high-bw x1.121 / x1.067 over NCCL / AutoCCL) less about
# 1%. They guard against regressions of the --quick set, and --check asserts them there.
# h100-nvswitch (its FSDP and TP cells at NCCL 2.30.7 without the plugin, paths on offer): x1.046 / x1.130
# measured 2026-12-01. Issue 23 (a channel's FIFO keeps one slice in L2, not a chunk: NCCL's default
# costs the A40 GEMMs less, so there is less to win) moved the A40 ones to low-bw x1.029 / x1.067,
# high-bw x1.096 / x1.061; the floors follow, less about 1%. Issue 23's hop latency per protocol
# (an LL128 or Simple ring step costs NCCL's hwLat for it, not LL's) and the symmetric kernels'
# launch-and-hop fixed cost moved h100-nvswitch to x1.065 over NCCL (up from x1.046) and x1.040
# over AutoCCL (down from x1.130): in the TP cell both now put the AllReduce group on the
# symmetric kernels (x1.000 between them, x1.086 over NCCL), in the FSDP cell AutoCCL's descent
# lands nearer (x1.109 -> x1.082); the A40 cells moved by under 0.6%. The h100 floor follows.
# Issue 30: the h100-nvswitch preset names NCCL 2.30.7 (was 2.18.3), so the analytic model AutoCCL
# descends on is calibrated against the simulator on the release the cells run (it was calibrated
# on 2.18.3 for 2.30.7 cells): AutoCCL's FSDP cell lands nearer, x1.082 -> x1.040, geomean
# x1.040 -> x1.020 over AutoCCL; Lagom's cells are unchanged (x1.044, x1.086 over NCCL).
# Issue 30's fidelity pass: an LL128 kernel pays NCCL's LL128 base latency beyond the launch figure (+5.6 us,
# tuning.cc baseLat 14.0 against 6.6-8.4): Lagom's and NCCL's cells move by under 0.02%, AutoCCL's descent
# lands elsewhere (low-bw TP cell x1.037 -> x1.016, high-bw EP cell x1.037 -> x1.057 over AutoCCL), geomean
# low-bw x1.060 -> x1.053, high-bw x1.067 -> x1.074 (measured 2026-12-03). The low-bw floor follows, less 1%.
# Issue 30's merge: h100-nvswitch declares NVLink SHARP, so NCCL's default AllReduce / AllGather /
# ReduceScatter of 2 MiB and more on its 8 GPUs is NVLS on 16 channels (16 SMs, the switch reduces), a
# stronger baseline than the 24-32-channel ring: Lagom's cells x1.044 -> x1.030 (FSDP), x1.086 -> x1.009
# (TP), geomean x1.065 -> x1.019 over NCCL, x1.056 over AutoCCL (measured 2026-12-03). The floor follows.
QUICK_FLOOR_GEOMEAN_VS_NCCL = {"low-bw": 1.02, "high-bw": 1.085, "h100-nvswitch": 1.01}
QUICK_FLOOR_GEOMEAN_VS_AUTOCCL = {"low-bw": 1.04, "high-bw": 1.05, "h100-nvswitch": 1.015}

PLOT_SUFFIXES = (".png", ".pdf", ".svg")  # formats matplotlib's Agg backend writes


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="regression matrix: tune with the model, judge on the simulator",
                            description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="the CI subset (3 workloads x 2 A40 clusters, 2 on h100-nvswitch)")
    add_evaluator(parser, tuning.DEFAULT_EVALUATOR, "what lagom tune uses; plans are judged on sim")
    add_cluster(parser, "repeatable; default: " + ", ".join(bench_matrix.ALL_CLUSTERS), repeatable=True)
    parser.add_argument("--exhaustive-max-points", type=int, default=None, metavar="N",
                        help="run exhaustive search where the space has at most this many points (default "
                             + ", ".join(f"{k} {v}" for k, v in bench_matrix.EXHAUSTIVE_MAX_POINTS.items())
                             + "; 0 = never)")
    add_nccl_version(parser, "default: the preset's (the NVLink presets' cells: 2.30.7)")
    add_json(parser)
    parser.add_argument("--plot", metavar="FILE.png", default=None, help="bar chart of speedups per cell")
    parser.add_argument("--force", action="store_true", help="overwrite --plot even if it is not a plot Lagom wrote")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.set_defaults(func=run)


def check_targets(summary: dict, results: list[bench_matrix.CellResult], quick: bool = False) -> list[str]:
    """What Lagom owes and did not deliver, one line each (empty when all hold); ``quick``
    adds the regression floors of the --quick set."""
    missed = []
    for r in results:
        where = f"{r.cluster} {r.workload}"
        if r.speedup_vs_nccl < MIN_SPEEDUP_VS_NCCL_ANY_CELL:
            missed.append(f"{where}: behind NCCL's default "
                          f"(x{r.speedup_vs_nccl:.3f} < x{MIN_SPEEDUP_VS_NCCL_ANY_CELL})")
        gap = r.gap_to_exhaustive
        if gap is not None and gap > MAX_GAP_TO_EXHAUSTIVE:
            missed.append(f"{where}: {gap:.2%} above the exhaustive optimum (at most {MAX_GAP_TO_EXHAUSTIVE:.1%})")
        if r.speedup_vs_optuna < MIN_SPEEDUP_VS_OPTUNA_ANY_CELL:
            missed.append(f"{where}: behind Optuna at equal budget (x{r.speedup_vs_optuna:.3f})")
    if quick:
        for name, c in summary["clusters"].items():
            for versus, floors in (("nccl", QUICK_FLOOR_GEOMEAN_VS_NCCL), ("autoccl", QUICK_FLOOR_GEOMEAN_VS_AUTOCCL)):
                value = c[f"geomean_speedup_vs_{versus}"]
                if name in floors and value < floors[name]:
                    missed.append(f"{name}: geomean over {versus} x{value:.3f} under the regression floor "
                                  f"x{floors[name]}")
    return missed


def _check_plot_path(value: str, force: bool) -> None:
    """Refuse a --plot file matplotlib cannot write before the matrix runs, not after."""
    if Path(value).suffix.lower() not in PLOT_SUFFIXES:
        raise LagomError(f"--plot {value}: the name must end in one of {', '.join(PLOT_SUFFIXES)}")
    check_output("--plot", value, OutputFormat.PLOT, force=force)


def run(args: argparse.Namespace) -> int:
    points = args.exhaustive_max_points
    if points is not None and not 0 <= points <= tuning.MAX_BUDGET:  # every point is an evaluation, kept
        raise LagomError(f"--exhaustive-max-points {points}: must be between 0 and {tuning.MAX_BUDGET}")
    if args.plot:
        _check_plot_path(args.plot, args.force)
    err = Console(stderr=True)
    evaluator = args.evaluator or tuning.DEFAULT_EVALUATOR
    clusters = tuple(args.cluster) if args.cluster else None
    for name in clusters or ():
        load_cluster(name)  # a bad name or file: one line before the matrix runs
    version = parse_nccl_version_arg(args.nccl_version)
    cells = bench_matrix.matrix_cells(args.quick, clusters, version)
    total = len(cells)
    done = [0]

    def on_cell(cell: bench_matrix.CellResult) -> None:
        done[0] += 1
        paths = "".join(f", group {g} on {p}" for g, p in cell.lagom_paths.items())
        err.print(f"[{done[0]}/{total}] {cell.cluster} {cell.workload}: x{cell.speedup_vs_nccl:.3f} vs NCCL, "
                  f"x{cell.speedup_vs_autoccl:.3f} vs AutoCCL, {cell.lagom_evaluations} evaluations{paths}",
                  highlight=False, soft_wrap=True)

    results = bench_matrix.run_matrix(cells, evaluator, args.exhaustive_max_points, on_cell=on_cell,
                                      log=lambda m: err.print(m))
    summary = bench_matrix.summarize(results)
    missed = check_targets(summary, results, quick=args.quick)
    summary["evaluator"] = evaluator
    summary["nccl_version"] = str(version) if version else "preset"
    summary["missed_targets"] = missed
    if args.plot:
        _plot(results, args.plot)
        err.print(f"plot written to {args.plot}", highlight=False, soft_wrap=True)
    if args.json:
        print(json.dumps({"cells": [r.to_dict() for r in results], "summary": summary}, indent=2))
    else:
        _print(results, summary, evaluator)
    return 1 if (args.check and missed) else 0


def _print(results: list[bench_matrix.CellResult], summary: dict, evaluator: str) -> None:
    out = stdout_console()
    for cluster in dict.fromkeys(r.cluster for r in results):
        table = Table(title=f"{cluster}: tuned with {evaluator}, judged on the simulator (noise 0)",
                      box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0), title_justify="left")
        for col in ("workload", "NCCL ms", "Lagom ms", "/NCCL", "/AutoCCL", "/Optuna", "vs opt", "of room", "evals"):
            table.add_column(col, justify="left" if col == "workload" else "right", no_wrap=True)
        for r in (r for r in results if r.cluster == cluster):
            gap, share = r.gap_to_exhaustive, r.optimum_headroom_captured
            table.add_row(r.workload, f"{r.nccl_us / 1e3:,.1f}", f"{r.lagom_us / 1e3:,.1f}",
                          f"x{r.speedup_vs_nccl:.3f}", f"x{r.speedup_vs_autoccl:.3f}", f"x{r.speedup_vs_optuna:.3f}",
                          "-" if gap is None else f"{gap:+.1%}", "-" if share is None else f"{share:.0%}",
                          str(r.lagom_evaluations))
        out.print(table)
    out.print("/X: Lagom's speedup over X; vs opt: above the exhaustive optimum; of room: the share of NCCL's gap "
              "to that optimum Lagom closed (--json has signatures and the gap to the lower bound)", highlight=False)
    for name, c in summary["clusters"].items():
        ranges = ", ".join(f"{kind} x{lo:.3f}-x{hi:.3f}"
                           for kind, (lo, hi) in c["speedup_vs_nccl_range_by_strategy"].items())
        out.print(f"{name}: geomean x{c['geomean_speedup_vs_nccl']:.3f} vs NCCL, "
                  f"x{c['geomean_speedup_vs_autoccl']:.3f} vs AutoCCL, "
                  f"x{c['geomean_speedup_vs_optuna']:.3f} vs Optuna; "
                  f"worst cell x{c['min_speedup_vs_nccl']:.3f}; "
                  f"headroom (NCCL / lower bound) x{c['geomean_headroom_vs_nccl']:.3f}; per strategy {ranges}",
                  highlight=False)
    s = summary["evaluations_slope"]
    if s["slope"] is not None:
        out.print(f"evaluations ~ {s['slope']:.2f} x signatures + {s['intercept']:.1f} ({s['points']} cells)")
    for line in summary["missed_targets"]:
        out.print(f"[red]missed:[/red] {line}")
    if not summary["missed_targets"]:
        out.print("all checks hold")


def _plot(results: list[bench_matrix.CellResult], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.cluster}\n{r.workload}" for r in results]
    xs = range(len(results))
    fig, ax = plt.subplots(figsize=(max(6, len(results) * 0.45), 5))
    width = 0.27
    ax.bar([x - width for x in xs], [r.speedup_vs_nccl for r in results], width, label="vs NCCL default")
    ax.bar(list(xs), [r.speedup_vs_autoccl for r in results], width, label="vs AutoCCL")
    ax.bar([x + width for x in xs], [r.speedup_vs_optuna for r in results], width, label="vs Optuna (equal budget)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    values = [v for r in results for v in (r.speedup_vs_nccl, r.speedup_vs_autoccl, r.speedup_vs_optuna)]
    ax.set_ylim(min(0.95, min(values) - 0.02), max(values) + 0.03)
    ax.set_ylabel("Lagom speedup (simulator, noise 0)")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.legend(fontsize=7)
    fig.tight_layout()
    try:
        save_figure(fig, path, "--plot", dpi=120)
    finally:
        plt.close(fig)
