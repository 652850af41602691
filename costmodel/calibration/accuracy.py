"""How well one Evaluator predicts another: error of the times, and quality of the ranking.

Used by ``tests/test_model_accuracy.py`` and ``bench/model_accuracy.py`` to judge the
analytic model against the simulator on workloads and settings calibration never
saw. Plain functions over Evaluators (anything with ``evaluate(workload, plan)``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import Evaluator, Timing
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Plan, Signature
from traces.overlap import OverlapWindow, overlap_windows
from traces.workload import Workload

_KIB = 1024
CHANNEL_CHOICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
CHUNK_CHOICES = tuple(k * _KIB for k in (64, 128, 256, 512, 684, 1024, 1366, 2048, 4096, 8192))
THREAD_CHOICES = (128, 256, 512)


def random_config(rng: random.Random, signature: Signature, vary_protocol: float = 0.2) -> CommConfig:
    """A random resource setting; algorithm and protocol usually left to NCCL (None)."""
    proto = None
    algo = None
    if rng.random() < vary_protocol and signature.collective is not CollectiveType.ALLTOALL:
        algo = Algorithm.RING
        proto = rng.choice([Protocol.SIMPLE, Protocol.LL, Protocol.LL128])
    return CommConfig(algo, proto, rng.choice(CHANNEL_CHOICES), rng.choice(THREAD_CHOICES), rng.choice(CHUNK_CHOICES))


def signatures_of(workload: Workload, cluster: ClusterSpec) -> list[Signature]:
    return sorted({workload.signature(c, cluster.gpus_per_node) for c in workload.collectives})


def random_plan(rng: random.Random, workload: Workload, cluster: ClusterSpec) -> Plan:
    """Every signature of the workload gets its own random setting."""
    return Plan({s: random_config(rng, s) for s in signatures_of(workload, cluster)})


def uniform_plan(workload: Workload, cluster: ClusterSpec, config: CommConfig) -> Plan:
    return Plan({s: config for s in signatures_of(workload, cluster)})


@dataclass
class ErrorStats:
    """Absolute percentage errors of one quantity over many (workload, plan) pairs."""

    name: str
    errors_pct: list[float] = field(default_factory=list)

    @property
    def mape_pct(self) -> float:
        return sum(self.errors_pct) / len(self.errors_pct) if self.errors_pct else 0.0

    @property
    def max_pct(self) -> float:
        return max(self.errors_pct) if self.errors_pct else 0.0


def _ape(pred: float, truth: float) -> float:
    return abs(pred - truth) / truth * 100.0 if truth > 0 else 0.0


def compare_timings(model: Evaluator, truth: Evaluator, cases: list[tuple[Workload, Plan]]) -> dict[str, ErrorStats]:
    """MAPE of iteration, compute-busy and communication-busy time."""
    stats = {k: ErrorStats(k) for k in ("iteration", "compute", "collective")}
    for workload, plan in cases:
        m: Timing = model.evaluate(workload, plan)
        t: Timing = truth.evaluate(workload, plan)
        stats["iteration"].errors_pct.append(_ape(m.iteration_us, t.iteration_us))
        stats["compute"].errors_pct.append(_ape(m.compute_us, t.compute_us))
        stats["collective"].errors_pct.append(_ape(m.comm_us, t.comm_us))
    return stats


def window_workload(workload: Workload, window: OverlapWindow) -> Workload:
    """The ops of one overlap window as a workload of their own (dependencies among them kept)."""
    keep = set(window.compute_ids) | set(window.collective_ids)
    return Workload(
        rank=workload.rank, world_size=workload.world_size, streams=list(workload.streams),
        compute_ops=[o for o in workload.compute_ops if o.op_id in keep],
        collectives=[o for o in workload.collectives if o.op_id in keep],
        groups=dict(workload.groups),
        dependencies=[d for d in workload.dependencies if d.before in keep and d.after in keep],
        source=f"{workload.source}#window@{window.start_us:.0f}us", device_name=workload.device_name,
        sm_count=workload.sm_count, gpus_per_node=workload.gpus_per_node,
    )


def compute_bound_windows(workload: Workload, min_compute_ops: int = 1) -> list[OverlapWindow]:
    """Windows that hold both compute and at least one collective."""
    return [w for w in overlap_windows(workload) if len(w.compute_ids) >= min_compute_ops and w.collective_ids]


@dataclass
class RankingResult:
    window: str
    candidates: int
    model_best_on_truth_us: float  # truth's time of the model's favourite
    truth_best_us: float

    @property
    def gap_pct(self) -> float:
        return (self.model_best_on_truth_us / self.truth_best_us - 1.0) * 100.0


def ranking_gap(model: Evaluator, truth: Evaluator, workload: Workload, cluster: ClusterSpec,
                configs: list[CommConfig]) -> RankingResult:
    """Apply each candidate setting to every collective of ``workload``; how far is the model's
    favourite from the truth's best, judged by the truth?"""
    plans = [uniform_plan(workload, cluster, c) for c in configs]
    model_times = [model.evaluate(workload, p).iteration_us for p in plans]
    truth_times = [truth.evaluate(workload, p).iteration_us for p in plans]
    pick = min(range(len(plans)), key=model_times.__getitem__)
    return RankingResult(workload.source, len(plans), truth_times[pick], min(truth_times))


def candidate_configs(rng: random.Random, signature: Signature, count: int) -> list[CommConfig]:
    """NCCL's default (all None) plus ``count - 1`` random resource settings."""
    return [CommConfig()] + [random_config(rng, signature, vary_protocol=0.0) for _ in range(count - 1)]
