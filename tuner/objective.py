"""One evaluated point and the measures searches read off it, asked for by ask/tell.

:class:`Objective` wraps (workload, space, and optionally an evaluator): it turns a
Point into a Plan, has each distinct point measured once (a cache answers repeats for
free), and counts the measurements it spent. :class:`Measured` exposes what the
searches use: the iteration time Z, compute busy Y, and per unit its collectives'
total time x and exposed (not overlapped by compute) time.

Ask/tell: a search is written once as a generator (:data:`Search`) that *yields* the
Plan it wants measured and is *sent* back its Timing; :meth:`Objective.ask` is the one
place that yields. Who answers is the clock: offline, :func:`answer_with` answers from
an evaluator at once (``Objective.measure`` does this for one point); online, the
running job's steps answer (``lagom.online``), one plan per few steps.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TypeVar

from costmodel.evaluator import Evaluator, Timing
from nccl_env.plan import Plan
from traces.intervals import CoverIndex, union
from traces.workload import Workload
from tuner.space import Point, SearchSpace, Unit


class BudgetExhausted(Exception):
    """Raised by :meth:`Objective.ask` when the evaluation budget is spent."""


T = TypeVar("T")
# A search (or part of one): yields the Plan to measure, is sent its Timing, returns T.
Search = Generator[Plan, Timing, T]


def answer_with(search: Search[T], evaluator: Evaluator, workload: Workload) -> T:
    """Run ``search`` to its end, answering every plan it asks for with ``evaluator`` (offline)."""
    try:
        plan = next(search)
        while True:
            plan = search.send(evaluator.evaluate(workload, plan))
    except StopIteration as done:
        return done.value


# Per-op timings an Objective keeps, at most (the most recently used points'): a replay's Timing holds
# three float64 arrays over every op (start, end, uncontended time), so a 10^6-op trace's is 24 MB and
# 170 evaluations held 4 GB. An older point keeps its figures and its units' collective times, and is
# timed again if a search asks for it again (not charged to the budget: the point was measured).
FULL_TIMINGS_BYTES = 256 << 20
TIMING_BYTES_PER_OP = 32  # three float64 arrays per op, and room for the small per-op dicts


def timing_bytes(workload: Workload) -> int:
    """The memory one Timing of ``workload`` is counted as (:data:`TIMING_BYTES_PER_OP` per op)."""
    return TIMING_BYTES_PER_OP * (len(workload.compute_ops) + len(workload.collectives)) + 1024


@dataclass
class Measured:
    point: Point
    timing: Timing
    workload: Workload
    _exposed: dict[int, float] | None = None  # computed on first use: only Lagom's hidden test needs it
    # a slim one (Objective._slim): no per-op timing; its units' figures by id(unit), taken from the full one
    unit_comm: dict[int, float] | None = None
    unit_exposed: dict[int, float] | None = None

    @property
    def is_slim(self) -> bool:
        return self.unit_comm is not None

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
        evaluator: Evaluator | None,
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
        self.retimed = 0  # points timed again after their per-op timing was dropped (not in evaluations)
        self._cache: dict[Point, Measured] = {}
        self._full: OrderedDict[Point, None] = OrderedDict()  # points whose cached Measured is full, LRU first
        self._max_full = max(2, FULL_TIMINGS_BYTES // timing_bytes(workload))

    def remaining(self) -> int | None:
        return None if self.budget is None else self.budget - self.evaluations

    def ask(self, point: Point) -> Search[Measured]:
        """Measure a point: from the cache, else by yielding its plan (one evaluation)."""
        hit = self._cache.get(point)
        if hit is not None and not hit.is_slim:
            self._full.move_to_end(point)
            return hit
        if hit is not None:  # measured before, its per-op timing dropped: timed again, not charged
            timing = yield self.space.plan(point)
            self.retimed += 1
        else:
            timing = yield from self.ask_plan(self.space.plan(point))
        measured = Measured(point, timing, self.workload)
        self._keep(measured)
        return measured

    def _keep(self, measured: Measured) -> None:
        """Cache ``measured``; past :data:`FULL_TIMINGS_BYTES` of per-op timings the least recently used
        full one is replaced by its slim copy (a search holding the full one keeps it)."""
        self._cache[measured.point] = measured
        self._full[measured.point] = None
        while len(self._full) > self._max_full:
            oldest, _ = self._full.popitem(last=False)
            self._cache[oldest] = self._slim(self._cache[oldest])

    def _slim(self, measured: Measured) -> Measured:
        """``measured`` without its per-op timing: its figures, its steps, and every unit's collective
        (and, where computed, exposed) time, which is all a search reads off a point it is not holding."""
        t = measured.timing
        units = [*self.space.resource_units, *self.space.subspace_units, *self.space.path_units]
        comm = {id(u): measured.comm_time_us(self.space.unit_collective_ids(u)) for u in units}
        exposed = ({id(u): measured.exposed_us(self.space.unit_collective_ids(u)) for u in units}
                   if measured._exposed is not None else None)
        summary = Timing(t.iteration_us, t.compute_us, t.comm_us, t.exposed_comm_us, t.compute_uncontended_us,
                         steps=t.steps)
        return Measured(measured.point, summary, measured.workload, unit_comm=comm, unit_exposed=exposed)

    def ask_plan(self, plan: Plan) -> Search[Timing]:
        """Measure a plan that need not be a point of the space (e.g. NCCL's default): one evaluation."""
        if self.budget is not None and self.evaluations >= self.budget:
            raise BudgetExhausted
        timing = yield plan
        self.evaluations += 1
        if self.progress is not None:
            self.progress(self.evaluations)
        return timing

    def measure(self, point: Point) -> Measured:
        """:meth:`ask` answered by this objective's evaluator at once."""
        return answer_with(self.ask(point), self.evaluator_or_raise(), self.workload)

    def cached(self) -> list[Measured]:
        """Every point measured so far, in the order measured (older ones slim: no per-op timing; ask() a
        point again for its full Measured)."""
        return list(self._cache.values())

    def evaluate_plan(self, plan: Plan) -> Timing:
        """:meth:`ask_plan` answered by this objective's evaluator at once."""
        return answer_with(self.ask_plan(plan), self.evaluator_or_raise(), self.workload)

    def evaluator_or_raise(self) -> Evaluator:
        """The evaluator that answers offline (TypeError for an objective answered by ask/tell)."""
        if self.evaluator is None:
            raise TypeError("this objective has no evaluator: its plans are answered by ask/tell")
        return self.evaluator

    def unit_comm_us(self, measured: Measured, unit: Unit) -> float:
        if measured.unit_comm is not None:
            return measured.unit_comm[id(unit)]
        return measured.comm_time_us(self.space.unit_collective_ids(unit))

    def unit_exposed_us(self, measured: Measured, unit: Unit) -> float:
        if measured.unit_exposed is not None:
            return measured.unit_exposed[id(unit)]
        if measured.is_slim:
            raise RuntimeError("a slim Measured has no exposed time: ask() its point for the full one")
        return measured.exposed_us(self.space.unit_collective_ids(unit))
