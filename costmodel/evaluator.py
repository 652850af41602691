"""The Evaluator protocol and the Timing it returns.

Anything that turns (workload, plan) into a Timing is an Evaluator: the analytic
cost model (fast, what the tuner believes), the simulator (the virtual cluster that
stands in for GPUs here), and later live measurements. The tuner sees only this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from costmodel.nccl_algorithms import algorithm_refusal, offered_algorithms
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM
from nccl_env.knobs import Algorithm, CommConfig
from nccl_env.plan import Plan, Signature
from traces.workload import Workload
from traces.workload_io import workload_problem

if TYPE_CHECKING:
    from costmodel.cluster import ClusterSpec
    from costmodel.replay.data import ReplayData

# The algorithms the evaluators model on every cluster (costmodel.analytic.collective_model,
# costmodel.sim.collective); NVLS and NVLSTree where a cluster's switches reduce (intra_node.nvls),
# PAT from NCCL 2.23 with one GPU per node (costmodel.nccl_algorithms); CollNet is not modelled.
MODELLED_ALGORITHMS = (Algorithm.RING, Algorithm.TREE)


class LazyOpValues(Mapping):
    """op id -> value from two parallel sequences, made into a dict on first access (an evaluator
    fills ``Timing.uncontended_us`` on every evaluation; few readers ever look)."""

    def __init__(self, op_ids: Sequence[int], values: Sequence[float] | np.ndarray) -> None:
        self._op_ids, self._values = op_ids, values
        self._map: dict[int, float] | None = None

    def _all(self) -> dict[int, float]:
        if self._map is None:
            values = self._values.tolist() if isinstance(self._values, np.ndarray) else self._values
            self._map = dict(zip(self._op_ids, values))
        return self._map

    def __getitem__(self, op_id: int) -> float:
        return self._all()[op_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())



class LazyOpTimings(Mapping):
    """``Timing.ops`` from an evaluator's start and end lists: op id -> OpTiming, each made when
    asked (a search reads a few collectives' times per evaluation, not every op's). ``fill``, when
    given, completes the lists before the first look (the analytic model's jump timeline)."""

    __slots__ = ("_index", "_starts", "_ends", "_fill")

    def __init__(self, index: Mapping[int, int], starts: Sequence[float], ends: Sequence[float],
                 fill: Callable[[], None] | None = None) -> None:
        self._index, self._starts, self._ends, self._fill = index, starts, ends, fill

    def __getitem__(self, op_id: int) -> OpTiming:
        if self._fill is not None:
            self._fill()
            self._fill = None
        k = self._index[op_id]
        return OpTiming(self._starts[k], self._ends[k] - self._starts[k])

    def __iter__(self) -> Iterator[int]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, op_id: object) -> bool:
        return op_id in self._index

    def __repr__(self) -> str:
        return f"<{len(self)} op timings>"

@dataclass
class OpTiming:
    start_us: float
    duration_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class StepTiming:
    """One profiler step of a replayed trace, replayed and as the trace measured it (us)."""

    name: str
    iteration_us: float
    comm_us: float
    exposed_comm_us: float
    measured_iteration_us: float
    measured_comm_us: float
    measured_exposed_comm_us: float
    compute_us: float = 0.0  # merged compute kernel time of the step's ops
    measured_compute_us: float = 0.0
    critical_comm_us: float = 0.0  # collective time on the critical path: the most faster collectives can save
    measured_critical_comm_us: float = 0.0
    unexplained_idle_us: float = 0.0  # GPU idle in the trace that the graph shows no cause for (docs/replay.md)

    def to_dict(self) -> dict:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class Timing:
    """One evaluated iteration.

    iteration_us (Z): first op start to last op end.
    compute_us (Y): time the compute stream(s) were busy (union of compute op spans).
    comm_us (X): time the communication stream(s) were busy (union of collective spans).
    exposed_comm_us: communication time not overlapped by any compute op.
    compute_uncontended_us: what compute_us would be with no collective running.
    ops: op_id -> OpTiming for every op of the workload.
    steps: a replayed trace's complete profiler steps (costmodel.replay); then the
    figures above are per step, the mean over them. Empty for other workloads.
    replay: a replay's data (the trace's graph as the replay holds it), None for other workloads.
    compute_slowdown = compute_us / compute_uncontended_us: the one definition of the
    compute slowdown every command prints (docs/tuner.md, "The figures").
    """

    iteration_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    compute_uncontended_us: float
    ops: Mapping[int, OpTiming] = field(default_factory=dict)
    steps: list[StepTiming] = field(default_factory=list)
    uncontended_us: Mapping[int, float] = field(default_factory=dict)  # compute op id -> its time with no
    # collective beside it (every evaluator of Lagom's fills it; an op not in it: its own duration_us)
    replay: ReplayData | None = field(default=None, compare=False, repr=False)

    @property
    def compute_slowdown(self) -> float:
        """compute_us / compute_uncontended_us (1.0 = contention cost nothing)."""
        if self.compute_uncontended_us <= 0:
            return 1.0
        return self.compute_us / self.compute_uncontended_us


@runtime_checkable
class Evaluator(Protocol):
    """evaluate(workload, plan) -> Timing, and a count of evaluations served."""

    evaluations: int

    def evaluate(self, workload: Workload, plan: Plan) -> Timing: ...


@dataclass(frozen=True)
class DurationScale:
    """A what-if on a trace's measured times (costmodel.replay): every collective (``comm``) or
    compute kernel (``compute``) takes F times as long, or the CPU's own time between calls
    (``cpu``) is F times as long."""

    comm: float = 1.0
    compute: float = 1.0
    cpu: float = 1.0

    @property
    def is_identity(self) -> bool:
        return self.comm == 1.0 and self.compute == 1.0 and self.cpu == 1.0


@runtime_checkable
class TraceEvaluator(Evaluator, Protocol):
    """An Evaluator that also replays a trace under a what-if scale (both of Lagom's do)."""

    def evaluate(self, workload: Workload, plan: Plan, scale: DurationScale | None = None) -> Timing: ...


def check_workload(workload: Workload) -> None:
    """Raise LagomError (one line) for a workload no evaluator can time: duplicate op ids,
    a dependency on a missing op, a dependency cycle, ... (``traces.workload_io.workload_problem``)."""
    problem = workload_problem(workload)
    if problem is not None:
        raise LagomError(f"workload {workload.source or '(unnamed)'}: {problem}")


def check_generated(workload: Workload) -> None:
    """Raise LagomError (one line) for a workload read from a trace: a trace is replayed
    (costmodel.replay.trace_evaluator.ReplayEvaluator, over this evaluator's mechanism), not simulated."""
    if workload.exec_graph is not None:
        raise LagomError(f"{workload.source or 'workload'}: a trace is replayed from its measured times "
                         f"(costmodel.replay.trace_evaluator.ReplayEvaluator over this evaluator), not timed as "
                         f"a generated workload")


def check_plan(plan: Plan, cluster: ClusterSpec | None = None) -> None:
    """Raise LagomError (one line) for a plan asking for an algorithm the evaluators do not run on
    ``cluster`` (None: ring and tree only), or one NCCL would not run for a signature of the plan
    (NVLS on several nodes, PAT with several GPUs per node: :func:`costmodel.nccl_algorithms.algorithm_refusal`)."""
    check_config(plan.default, "default", cluster)
    for signature, config in plan.entries.items():
        check_config(config, signature.label(), cluster, signature)


def check_config(config: CommConfig, where: str, cluster: ClusterSpec | None = None,
                 signature: Signature | None = None) -> None:
    """Raise LagomError (one line, starting with ``where``) for an algorithm the evaluators do not run
    on ``cluster`` (None: ring and tree only) or, when given, for ``signature``."""
    algo = ALGORITHM.get(config)
    if algo is None:
        return
    if signature is None:
        why = algorithm_refusal(cluster, algo)
    else:
        why = algorithm_refusal(cluster, algo, signature.collective, signature.ranks, signature.nodes)
    if why is not None:
        offered = offered_algorithms(cluster) if cluster is not None else MODELLED_ALGORITHMS
        names = [a.nccl_name for a in sorted(offered, key=lambda a: (a is not Algorithm.RING, a))]
        listed = f"{', '.join(names[:-1])} and {names[-1]}"
        raise LagomError(f"{where}: {ALGORITHM.field}={algo.nccl_name}: {why}; the evaluators model {listed} here")
