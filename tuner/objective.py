"""One evaluated point and the measures searches read off it.

:class:`Objective` wraps (workload, evaluator, space): it turns a Point into a Plan,
asks the evaluator once per distinct point (a cache answers repeats for free), and
counts the evaluations it spent. :class:`Measured` exposes what the searches use:
the iteration time Z, compute busy Y, and per unit its collectives' total time x and
exposed (not overlapped by compute) time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.evaluator import Evaluator, Timing
from nccl_env.plan import Plan
from traces.intervals import CoverIndex, union
from traces.workload import Workload
from tuner.space import Point, SearchSpace, Unit


class BudgetExhausted(Exception):
    """Raised by :meth:`Objective.measure` when the evaluation budget is spent."""


@dataclass
class Measured:
    point: Point
    timing: Timing
    workload: Workload
    _exposed: dict[int, float] | None = None  # computed on first use: only Lagom's hidden test needs it

    @property
    def iteration_us(self) -> float:
        return self.timing.iteration_us

    @property
    def compute_us(self) -> float:
        return self.timing.compute_us

    def comm_us_total(self) -> float:
        return self.timing.comm_us

    def comm_time_us(self, op_ids: tuple[int, ...]) -> float:
        ops = self.timing.ops
        return sum(ops[i].duration_us for i in op_ids if i in ops)

    def exposed_us(self, op_ids: tuple[int, ...]) -> float:
        if self._exposed is None:
            self._exposed = exposed_by_op(self.workload, self.timing)
        return sum(self._exposed.get(i, 0.0) for i in op_ids)


def exposed_by_op(workload: Workload, timing: Timing) -> dict[int, float]:
    """Per collective: the part of its span not covered by any compute op's span."""
    compute = CoverIndex(union(
        (t.start_us, t.end_us)
        for op in workload.compute_ops
        if not op.is_memory_op and (t := timing.ops.get(op.op_id)) is not None
    ))
    out: dict[int, float] = {}
    for coll in workload.collectives:
        t = timing.ops.get(coll.op_id)
        if t is not None:
            out[coll.op_id] = max(0.0, t.duration_us - compute.covered(t.start_us, t.end_us))
    return out


class Objective:
    """Evaluate points of ``space`` for ``workload`` with ``evaluator``, with a cache and a budget."""

    def __init__(
        self,
        workload: Workload,
        evaluator: Evaluator,
        space: SearchSpace,
        budget: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.workload = workload
        self.evaluator = evaluator
        self.space = space
        self.budget = budget
        self.progress = progress
        self.evaluations = 0
        self._cache: dict[Point, Measured] = {}

    def remaining(self) -> int | None:
        return None if self.budget is None else self.budget - self.evaluations

    def measure(self, point: Point) -> Measured:
        hit = self._cache.get(point)
        if hit is not None:
            return hit
        timing = self._evaluate(self.space.plan(point))
        measured = Measured(point, timing, self.workload)
        self._cache[point] = measured
        return measured

    def cached(self) -> list[Measured]:
        """Every point measured so far, in the order measured."""
        return list(self._cache.values())

    def evaluate_plan(self, plan: Plan) -> Timing:
        """Evaluate a plan that is not a point of the space (e.g. NCCL's default)."""
        return self._evaluate(plan)

    def _evaluate(self, plan: Plan) -> Timing:
        if self.budget is not None and self.evaluations >= self.budget:
            raise BudgetExhausted
        timing = self.evaluator.evaluate(self.workload, plan)
        self.evaluations += 1
        if self.progress is not None:
            self.progress(self.evaluations)
        return timing

    def unit_comm_us(self, measured: Measured, unit: Unit) -> float:
        return measured.comm_time_us(self.space.unit_collective_ids(unit))

    def unit_exposed_us(self, measured: Measured, unit: Unit) -> float:
        return measured.exposed_us(self.space.unit_collective_ids(unit))
