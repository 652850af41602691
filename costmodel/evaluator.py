"""The Evaluator protocol and the Timing it returns.

Anything that turns (workload, plan) into a Timing is an Evaluator: the analytic
cost model (fast, what the tuner believes), the simulator (the virtual cluster that
stands in for GPUs here), and later live measurements. The tuner sees only this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nccl_env.plan import Plan
from traces.workload import Workload


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
    """

    iteration_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    compute_uncontended_us: float
    ops: Mapping[int, OpTiming] = field(default_factory=dict)
    steps: list[StepTiming] = field(default_factory=list)

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
