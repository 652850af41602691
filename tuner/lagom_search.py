"""Lagom's priority-based search (REFERENCE.md section 1; the step rule is ours, see docs/tuner.md).

Every resource unit (a signature, or the signatures that must share a knob) starts at
the lowest rung of each of its axes with priority H = 0.01. Repeatedly the unfinished
unit with the smallest H is served: it proposes one step, which is measured with one
evaluation of the whole iteration.

Step rule (the paper scales its step by the last relative improvement with an
inconsistent sign; we use a shrinking pattern step instead):

1. *Joint steps*: all of the unit's axes move up together by ``stride`` rungs
   (stride starts at 2, i.e. about x2 channels and x2 chunk bytes per step).
2. A step is *accepted* when it shortened the unit's own collective time x_j and did
   not lengthen the iteration Z (both beyond a relative tolerance). On acceptance
   H_j = (Y' - Y) / (x_j_old - x_j_new): compute time added per communication time
   saved; cheap savings are served first.
3. A rejected step is undone. A rejected joint step of stride 2 is retried with
   stride 1; a rejected stride-1 joint step switches the unit to *single-axis steps*
   (one rung of one axis at a time, channels, then chunk, then threads); an axis
   whose single step is rejected is dropped; a unit with no axis left is finished.
4. A unit is also finished when, after an accepted step, its collectives are hidden
   (exposed time under 1% of x_j): more resources could only slow compute.

So each unit climbs once and is frozen: evaluations grow linearly with the number
of units. In communication-bound windows Z falls whenever x_j falls, so the climb is
per-collective minimisation; in compute-bound windows the Z check stops the climb
where contention starts to cost more than it saves.

Then each subspace unit (algorithm/protocol scope) tries the other pairs at the
climbed resources, one evaluation each, keeping a switch only if Z falls. Finally the
guard: NCCL's default plan is evaluated too, and returned instead if it is not slower.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from costmodel.evaluator import Evaluator
from nccl_env.plan import Plan
from traces.workload import Workload
from tuner.method import SearchMethod
from tuner.objective import BudgetExhausted, Measured, Objective
from tuner.result import Step, TuningResult
from tuner.space import SearchSpace, Unit

INITIAL_PRIORITY = 0.01  # the paper's H_j at the start (Algorithm 1)
HIDDEN_FRACTION = 0.01  # a unit is hidden when its exposed time is under 1% of its time


@dataclass
class _UnitState:
    unit: Unit
    priority: float = INITIAL_PRIORITY
    stride: int = 2
    single_axes: list[str] | None = None  # None while taking joint steps
    finished: str | None = None
    climb_end: str = ""
    descend_axes: list[str] | None = None  # set once the climb ended: axes still to try one rung down
    served: int = 0
    history: list[str] = field(default_factory=list)


class LagomSearch(SearchMethod):
    """Priority-based co-tuning of collectives with the compute they overlap."""

    name = "lagom"

    def __init__(self, initial_stride: int = 2, tolerance: float = 0.001, probe_subspaces: bool = True, guard: bool = True) -> None:
        self.initial_stride = max(1, initial_stride)
        self.tolerance = tolerance
        self.probe_subspaces = probe_subspaces
        self.guard = guard

    def tune(
        self,
        workload: Workload,
        evaluator: Evaluator,
        space: SearchSpace,
        budget: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> TuningResult:
        obj = Objective(workload, evaluator, space, budget, progress)
        baseline = obj.evaluate_plan(Plan()) if self.guard else None
        steps: list[Step] = []
        order: list[str] = []
        current = obj.measure(space.minimum_point())
        states = [_UnitState(u, stride=self.initial_stride) for u in space.resource_units]
        tol = self.tolerance
        try:
            while True:
                open_states = [s for s in states if s.finished is None]
                if not open_states:
                    break
                state = min(open_states, key=lambda s: (s.priority, s.unit.index))
                state.served += 1
                if state.descend_axes is not None:
                    current = self._descend_step(state, current, obj, steps, order)
                    continue
                move = self._propose(state, current, space)
                if move is None:
                    self._end_climb(state, "at the top of its ladders", order, steps, current, obj)
                    continue
                candidate = obj.measure(current.point.with_levels(move))
                x_old = obj.unit_comm_us(current, state.unit)
                x_new = obj.unit_comm_us(candidate, state.unit)
                change = _describe(move, current, space)
                helped = x_new < x_old * (1 - tol) and candidate.iteration_us < current.iteration_us
                if helped:
                    saved = x_old - x_new
                    state.priority = (candidate.compute_us - current.compute_us) / saved
                    current = candidate
                    steps.append(Step(state.unit.key, change, x_new, candidate.compute_us, candidate.iteration_us, state.priority, "accepted"))
                    if obj.unit_exposed_us(current, state.unit) < HIDDEN_FRACTION * max(x_new, 1e-9):
                        self._end_climb(state, "communication hidden", order, steps, current, obj)
                    continue
                steps.append(Step(state.unit.key, change, x_new, candidate.compute_us, candidate.iteration_us, None, "rejected"))
                if state.single_axes is None:
                    if state.stride > 1:
                        state.stride = 1
                    elif len(state.unit.axes) > 1:
                        state.single_axes = list(state.unit.axes)
                    else:
                        self._end_climb(state, "step stopped helping", order, steps, current, obj)
                else:
                    state.single_axes.pop(0)
                    if not state.single_axes:
                        self._end_climb(state, "step stopped helping", order, steps, current, obj)
            if self.probe_subspaces:
                current = self._probe_subspaces(space, obj, current, steps)
        except BudgetExhausted:
            for state in states:
                if state.finished is None:
                    self._finish(state, "budget spent", order, steps, current, obj)
        result = TuningResult(
            method=self.name,
            plan=space.plan(current.point),
            timing=current.timing,
            evaluations=obj.evaluations,
            point=current.point,
            baseline=baseline,
            steps=steps,
            order=order,
            notes=list(space.notes),
        )
        if baseline is not None and baseline.iteration_us <= current.iteration_us:
            result.plan = Plan()
            result.timing = baseline
            result.point = None
            result.notes.append("guard: NCCL's default was not slower than the searched plan; kept NCCL's default")
        return result

    # -- helpers ---------------------------------------------------------------------
    def _propose(self, state: _UnitState, current: Measured, space: SearchSpace) -> dict | None:
        """The next move of a unit: {(unit index, axis): new rung}, or None when none can move."""
        point = current.point
        index = state.unit.index
        while True:
            axes = state.unit.axes if state.single_axes is None else state.single_axes[:1]
            stride = state.stride if state.single_axes is None else 1
            move = {}
            for axis in axes:
                top = len(space.axes[axis].values) - 1
                rung = point.level(index, axis)
                if rung < top:
                    move[(index, axis)] = min(top, rung + stride)
            if move:
                return move
            if state.single_axes is None:
                return None
            state.single_axes.pop(0)  # this axis is already at its top
            if not state.single_axes:
                return None

    def _end_climb(self, state: _UnitState, why: str, order: list[str], steps: list[Step], current: Measured, obj: Objective) -> None:
        """The climb is over; the unit next tries giving back one rung per axis."""
        state.climb_end = why
        state.descend_axes = [a for a in state.unit.axes if current.point.level(state.unit.index, a) > 0]
        if not state.descend_axes:
            self._finish(state, why, order, steps, current, obj)

    def _descend_step(self, state: _UnitState, current: Measured, obj: Objective, steps: list[Step], order: list[str]) -> Measured:
        """One rung down on the first axis left: kept only if the iteration gets shorter."""
        axis = state.descend_axes[0]
        index = state.unit.index
        rung = current.point.level(index, axis)
        move = {(index, axis): rung - 1}
        candidate = obj.measure(current.point.with_levels(move))
        change = _describe(move, current, obj.space)
        x_new = obj.unit_comm_us(candidate, state.unit)
        if candidate.iteration_us < current.iteration_us * (1 - self.tolerance):
            steps.append(Step(state.unit.key, change, x_new, candidate.compute_us, candidate.iteration_us, state.priority, "accepted"))
            current = candidate
            if rung - 1 == 0:
                state.descend_axes.pop(0)
        else:
            steps.append(Step(state.unit.key, change, x_new, candidate.compute_us, candidate.iteration_us, None, "rejected"))
            state.descend_axes.pop(0)
        if not state.descend_axes:
            self._finish(state, state.climb_end, order, steps, current, obj)
        return current

    def _finish(self, state: _UnitState, why: str, order: list[str], steps: list[Step], current: Measured, obj: Objective) -> None:
        state.finished = why
        order.append(state.unit.key)
        steps.append(Step(state.unit.key, "-", obj.unit_comm_us(current, state.unit), current.compute_us, current.iteration_us, state.priority, f"finished: {why}"))

    def _probe_subspaces(self, space: SearchSpace, obj: Objective, current: Measured, steps: list[Step]) -> Measured:
        for unit in space.subspace_units:
            for pair in space.unit_pairs(unit):
                if current.point.pair(unit.index) == pair:
                    continue
                candidate = obj.measure(current.point.with_pair(unit.index, pair))
                better = candidate.iteration_us < current.iteration_us * (1 - self.tolerance)
                label = f"{pair[0].nccl_name}/{pair[1].nccl_name}"
                x = obj.unit_comm_us(candidate, unit)
                steps.append(Step(unit.key, f"subspace -> {label}", x, candidate.compute_us, candidate.iteration_us, None, "accepted" if better else "rejected"))
                if better:
                    current = candidate
        return current


def _describe(move: dict, current: Measured, space: SearchSpace) -> str:
    parts = []
    for (unit, axis), rung in sorted(move.items()):
        values = space.axes[axis].values
        parts.append(f"{axis} {values[current.point.level(unit, axis)]}->{values[rung]}")
    return ", ".join(parts)
