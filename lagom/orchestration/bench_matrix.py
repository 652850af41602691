"""The regression matrix behind ``lagom bench``: tune with the model, judge on the simulator.

Two sets of cells: the paper's eight workloads on 8 and 16 GPUs of the A40 presets
(``low-bw``, ``high-bw``) at the preset's NCCL (2.18.3), and the FSDP and TP workloads on
one node (8 GPUs) of the NVLink presets (``a100-nvswitch``, ``h100-nvswitch``) at
:data:`PATHS_NCCL_VERSION`, where a process group may also move its collectives on
symmetric kernels or the copy engines (``tuner.space`` path units). Those run without
Lagom's tuner plugin (channels per group, chunk and threads per process, algorithm per
collective type: ``deliver(..., use_plugin=False)``), which keeps their spaces small enough
for ``bench/optimum_ceiling.py`` to judge every point, and is also the setting under which
NCCL keeps its own EFFICIENCY re-selection.

For each cell (a workload on a cluster preset): every method tunes with the tuning
evaluator (the analytic model calibrated against the preset, or the simulator), then
every plan is judged on the simulator with noise off. Optuna gets exactly the number
of evaluations Lagom used; exhaustive runs where the space is small enough. The lower
bound is max(compute alone, communication alone at its best): compute alone is the
judge's uncontended compute time; communication alone is the workload without its
compute ops, tuned for its own time (AutoCCL's objective, which is right there) on the
judge.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import numpy as np

from costmodel.cluster import ClusterSpec, load_cluster
from costmodel.evaluator import Evaluator
from lagom.orchestration import tuning
from nccl_env.delivery import group_paths
from nccl_env.plan import Plan
from nccl_env.rules import NcclVersion
from traces.workload import Workload
from tuner import AutoCCL, Exhaustive, LagomSearch, OptunaTPE

CLUSTERS = ("low-bw", "high-bw")
NVLINK_CLUSTERS = ("a100-nvswitch", "h100-nvswitch")
ALL_CLUSTERS = CLUSTERS + NVLINK_CLUSTERS
PATHS_NCCL_VERSION = NcclVersion(2, 30, 7)  # copy engines across nodes from 2.30.6; a 2.30 release (nccl_releases)
NVLINK_KINDS = ("fsdp", "tp")  # where a path applies: the FSDP gathers and the TP all-reduces of one node
# ground truth only where the space is this small: the analytic model evaluates a point in
# about a millisecond, the simulator in tens of milliseconds
EXHAUSTIVE_MAX_POINTS = {"analytic": 4000, "sim": 2000}
# --quick: one FSDP, one TP and one EP workload per cluster, on 8 GPUs (CI regression, < 3 minutes)
QUICK_KINDS = ("fsdp", "tp", "ep")


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: a workload on a preset, at an NCCL version, with or without the plugin."""

    cluster: str
    workload: str
    nccl_version: NcclVersion | None  # None: the preset's
    use_plugin: bool = True


@dataclass
class CellResult:
    cluster: str
    workload: str
    strategy: str  # fsdp | tp | ep
    signatures: int
    units: int
    nccl_us: float  # every *_us is the judge's (simulator, noise 0) iteration time
    lagom_us: float
    autoccl_us: float
    optuna_us: float
    exhaustive_us: float | None
    lower_bound_us: float
    lagom_evaluations: int
    autoccl_evaluations: int
    tune_s: float  # wall time of Lagom's search
    nccl_version: str = ""
    lagom_paths: dict[str, str] = field(default_factory=dict)  # group -> path Lagom put it on (none: NCCL's kernels)

    @property
    def speedup_vs_nccl(self) -> float:
        return self.nccl_us / self.lagom_us

    @property
    def speedup_vs_autoccl(self) -> float:
        return self.autoccl_us / self.lagom_us

    @property
    def speedup_vs_optuna(self) -> float:
        return self.optuna_us / self.lagom_us

    @property
    def gap_to_exhaustive(self) -> float | None:
        return None if self.exhaustive_us is None else self.lagom_us / self.exhaustive_us - 1

    @property
    def optimum_headroom_captured(self) -> float | None:
        """The share of the optimum's gain over NCCL's default that Lagom got (1 = all of it),
        where exhaustive search ran and the optimum beats NCCL."""
        if self.exhaustive_us is None or self.exhaustive_us >= self.nccl_us:
            return None
        return (self.nccl_us - self.lagom_us) / (self.nccl_us - self.exhaustive_us)

    @property
    def gap_to_lower_bound(self) -> float:
        return self.lagom_us / self.lower_bound_us - 1

    @property
    def headroom_vs_nccl(self) -> float:
        """The most any plan could gain over NCCL's default here: nccl / lower bound."""
        return self.nccl_us / self.lower_bound_us

    def to_dict(self) -> dict:
        out = asdict(self)
        for key in ("speedup_vs_nccl", "speedup_vs_autoccl", "speedup_vs_optuna", "gap_to_exhaustive",
                    "gap_to_lower_bound",
                    "headroom_vs_nccl", "optimum_headroom_captured"):
            value = getattr(self, key)
            out[key] = None if value is None else round(value, 4)
        return out


def strategy_of(spec: str) -> str:
    return spec.split(":", 1)[0]


def matrix_specs(quick: bool) -> list[str]:
    """The paper's eight workloads on 8 and 16 GPUs (``traces.generate.PAPER_WORKLOADS``)."""
    from traces.generate import PAPER_WORKLOADS, parse_spec

    specs = list(PAPER_WORKLOADS)
    if not quick:
        return specs
    # per kind the smallest job (fewest GPUs), the first listed among equals
    return [min((s for s in specs if strategy_of(s) == kind), key=lambda s: parse_spec(s).gpus) for kind in QUICK_KINDS]


def nvlink_specs(quick: bool) -> list[str]:
    """The paper's FSDP and TP workloads on one node (8 GPUs); --quick: the first of each kind."""
    from traces.generate import PAPER_WORKLOADS, parse_spec

    specs = [s for s in PAPER_WORKLOADS if strategy_of(s) in NVLINK_KINDS and parse_spec(s).gpus <= 8]
    if not quick:
        return specs
    return [next(s for s in specs if strategy_of(s) == kind) for kind in NVLINK_KINDS]


def matrix_cells(quick: bool, clusters: tuple[str, ...] | None = None, nccl_version: NcclVersion | None = None,
                 ) -> list[Cell]:
    """The matrix: the A40 presets' cells at the preset's NCCL (or ``nccl_version``), and the
    NVLink presets' at :data:`PATHS_NCCL_VERSION` (or ``nccl_version``) without the plugin;
    --quick keeps h100-nvswitch of the two."""
    wanted = clusters or (CLUSTERS + (("h100-nvswitch",) if quick else NVLINK_CLUSTERS))
    cells = []
    for preset in wanted:
        if preset in NVLINK_CLUSTERS:
            cells += [Cell(preset, spec, nccl_version or PATHS_NCCL_VERSION, use_plugin=False)
                      for spec in nvlink_specs(quick)]
        else:
            cells += [Cell(preset, spec, nccl_version) for spec in matrix_specs(quick)]
    return cells


# ---- one cell ---------------------------------------------------------------------------


def comm_only(workload: Workload) -> Workload:
    """The workload without compute: collectives keep their streams and their mutual order."""
    ids = {c.op_id for c in workload.collectives}
    return replace(
        workload,
        compute_ops=[],
        dependencies=[d for d in workload.dependencies if d.before in ids and d.after in ids],
        source=f"{workload.source} (communication only)",
    )


def run_cell(
    spec: str,
    preset: str,
    tune_cluster: ClusterSpec,
    make_tune_evaluator: Callable[[], Evaluator],
    judge: Evaluator,
    exhaustive_max_points: int = 0,
    use_plugin: bool = True,
) -> CellResult:
    workload = tuning.load_workload_arg(spec)
    space = tuning.space_for(workload, tune_cluster, use_plugin=use_plugin)

    def judged(plan: Plan) -> float:
        return judge.evaluate(workload, plan).iteration_us

    started = time.perf_counter()
    lagom = LagomSearch().tune(workload, make_tune_evaluator(), space)
    tune_s = time.perf_counter() - started
    autoccl = AutoCCL().tune(workload, make_tune_evaluator(), space)
    optuna = OptunaTPE().tune(workload, make_tune_evaluator(), space, budget=lagom.evaluations)
    exhaustive_us = None
    plans = [lagom.plan, autoccl.plan, optuna.plan]
    if space.size() <= exhaustive_max_points:
        exhaustive = Exhaustive(exhaustive_max_points).tune(workload, make_tune_evaluator(), space)
        exhaustive_us = judged(exhaustive.plan)
        plans.append(exhaustive.plan)
    nccl = judge.evaluate(workload, Plan())
    comm = comm_only(workload)
    comm_best = AutoCCL(rounds=1).tune(comm, judge, tuning.space_for(comm, tune_cluster, use_plugin)).timing.comm_us
    # a bound must hold for every plan we judge: take their communication alone too
    comm_best = min([comm_best, *(judge.evaluate(comm, p).comm_us for p in [Plan(), *plans])])
    return CellResult(
        cluster=preset,
        workload=spec,
        strategy=strategy_of(spec),
        signatures=len(space.signatures),
        units=len(space.resource_units),
        nccl_us=nccl.iteration_us,
        lagom_us=judged(lagom.plan),
        autoccl_us=judged(autoccl.plan),
        optuna_us=judged(optuna.plan),
        exhaustive_us=exhaustive_us,
        lower_bound_us=max(nccl.compute_uncontended_us, comm_best),
        lagom_evaluations=lagom.evaluations,
        autoccl_evaluations=autoccl.evaluations,
        tune_s=tune_s,
        nccl_version=str(space.nccl_version),
        lagom_paths={g: p.value for g, p in group_paths(lagom.plan).items()},
    )


def run_matrix(
    cells: list[Cell],
    evaluator: str = "analytic",
    exhaustive_max_points: int | None = None,
    on_cell: Callable[[CellResult], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[CellResult]:
    if exhaustive_max_points is None:
        exhaustive_max_points = EXHAUSTIVE_MAX_POINTS[evaluator]
    results = []
    for cell in cells:
        judge_cluster = tuning.with_nccl_version(load_cluster(cell.cluster), cell.nccl_version)
        judge = tuning.make_evaluator("sim", judge_cluster, noise=0.0)
        # analytic on a preset: calibrated against its simulator (cached); a cluster file is taken as it is
        tune_cluster = tuning.tuning_cluster(judge_cluster, cell.cluster, evaluator, log=log)
        result = run_cell(cell.workload, cell.cluster, tune_cluster,
                          partial(tuning.make_evaluator, evaluator, tune_cluster), judge, exhaustive_max_points,
                          cell.use_plugin)
        results.append(result)
        if on_cell:
            on_cell(result)
    return results


# ---- summary ----------------------------------------------------------------------------


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(results: list[CellResult]) -> dict:
    """Per cluster: geometric-mean speedups, worst cell, exhaustive gaps; overall evaluation slope."""
    out: dict = {"clusters": {}}
    for preset in sorted({r.cluster for r in results}):
        cells = [r for r in results if r.cluster == preset]
        gaps = [r.gap_to_exhaustive for r in cells if r.gap_to_exhaustive is not None]
        per_strategy = {}
        for kind in sorted({r.strategy for r in cells}):
            speedups = [r.speedup_vs_nccl for r in cells if r.strategy == kind]
            per_strategy[kind] = [round(min(speedups), 4), round(max(speedups), 4)]
        out["clusters"][preset] = {
            "cells": len(cells),
            "geomean_speedup_vs_nccl": round(geomean([r.speedup_vs_nccl for r in cells]), 4),
            "geomean_speedup_vs_autoccl": round(geomean([r.speedup_vs_autoccl for r in cells]), 4),
            "geomean_speedup_vs_optuna": round(geomean([r.speedup_vs_optuna for r in cells]), 4),
            "min_speedup_vs_nccl": round(min(r.speedup_vs_nccl for r in cells), 4),
            "geomean_headroom_vs_nccl": round(geomean([r.headroom_vs_nccl for r in cells]), 4),
            "max_gap_to_exhaustive": None if not gaps else round(max(gaps), 4),
            "speedup_vs_nccl_range_by_strategy": per_strategy,
        }
    out["evaluations_slope"] = evaluations_slope(results)
    return out


def evaluations_slope(results: list[CellResult]) -> dict:
    """Least-squares fit of Lagom's evaluations against the number of signatures."""
    xs = [r.signatures for r in results]
    ys = [r.lagom_evaluations for r in results]
    if len(set(xs)) < 2:
        return {"slope": None, "intercept": None, "points": len(xs)}
    slope, intercept = np.polyfit(xs, ys, 1)
    return {"slope": round(float(slope), 3), "intercept": round(float(intercept), 3), "points": len(xs)}
