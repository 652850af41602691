"""Lagom's priority-based search (docs/reference.md §1; the step rule is ours, see docs/tuner.md).

Every resource unit (a signature, or the signatures that must share a knob) starts at
the lowest rung of each of its axes with priority H = 0.01. Repeatedly the unfinished
unit with the smallest H is served: it proposes one step, which is measured with one
evaluation of the whole iteration.

Step rule (the paper raises NC, NT and C together by a step scaled with the last
relative improvement, with an inconsistent sign; ours):

1. A serve *probes* each of the unit's axes moved up by ``stride`` rungs (stride
   starts at 2, about x2 channels or x2 chunk bytes), one evaluation per axis.
2. A probe *helps* when it shortened the unit's own collective time x_j (by more than
   the tolerance) and the iteration Z. The helping probe with the shortest Z is
   taken: H_j = (Y' - Y) / (x_j_old - x_j_new), compute time added per communication
   time saved; cheap savings are served first.
3. When no probe helps, the stride drops to 1; when no stride-1 probe helps either,
   the unit is finished. It is also finished when, after a step, its collectives are
   hidden (exposed time under 1% of x_j): more resources could only slow compute.

Each unit climbs once and is frozen, so evaluations grow linearly with the number of
units. In communication-bound windows Z falls whenever x_j falls, so the climb is
per-collective minimisation; in compute-bound windows the Z test stops the climb
where contention starts to cost more than it saves.

A short *polish* follows: every resource coordinate one rung down or up, and the
trades (channels one rung down with chunk one rung up, and the reverse) between
units that share signatures; a move is kept when it shortens Z, or when it only takes
resources away and Z is no longer (a sideways step off a plateau: at equal
predicted time fewer channels and smaller chunks contend less); rounds repeat while
something was kept, at most four.

Then each subspace unit (algorithm/protocol scope) tries the other pairs at the
polished resources, one evaluation each, keeping a switch only if Z falls: that is the
knob-only plan.

Paths (symmetric kernels, copy engines: ``SearchSpace.path_units``, one per process group)
join last, served by the climb's own rule: every path unit starts at H = 0.01; a serve
probes each of the unit's paths at the current point (one evaluation each); a probe helps
when it shortens Z; the helping probe with the shortest Z is taken and the unit's
H = (Y' - Y) / (x_old - x_new) recorded, and the unit is finished either way (a group
takes one path). Serving them on the knob-only plan compares a path with NCCL's kernels
at the resources the climb gave them, so the result is never slower than the knob-only
plan. When a path was taken, the polish runs again, with each path unit's other paths as
moves too (the SMs a path frees change what the other collectives should take).

Finally the guard: NCCL's default plan is evaluated too, and returned instead if it is
not slower.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.evaluator import Timing
from nccl_env.errors import LagomError
from nccl_env.knob_table import CHANNELS, CHUNK
from nccl_env.plan import Plan
from tuner.method import SearchMethod
from tuner.objective import BudgetExhausted, Measured, Objective, Search, answer_with
from tuner.result import Step, TuningResult
from tuner.space import Point, SearchSpace, Unit

INITIAL_PRIORITY = 0.01  # the paper's H_j at the start (Algorithm 1)
HIDDEN_FRACTION = 0.01  # a unit is hidden when its exposed time is under 1% of its time


@dataclass
class _UnitState:
    unit: Unit
    priority: float = INITIAL_PRIORITY
    stride: int = 2
    finished: str | None = None


@dataclass
class _Walk:
    """The search's state between measurements: kept when the budget ends a phase midway."""

    current: Measured
    states: list[_UnitState]
    steps: list[Step] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # units in the order they were finished
    knob_only: Measured | None = None  # the walk's point before paths joined


class LagomSearch(SearchMethod):
    """Priority-based co-tuning of collectives with the compute they overlap.

    ``climb=False`` skips the priority climb (a start point that is already a tuned
    plan, e.g. online from an offline file, is refined by the polish alone);
    ``repeat_kept_moves`` makes the polish try a kept move again at once (a start
    several rungs off its optimum gets there in fewer measurements).
    """

    name = "lagom"

    def __init__(self, initial_stride: int = 2, tolerance: float = 0.001, polish_rounds: int = 4,
                 probe_subspaces: bool = True, guard: bool = True, climb: bool = True,
                 repeat_kept_moves: bool = False, probe_paths: bool = True) -> None:
        self.initial_stride = max(1, initial_stride)
        self.polish_rounds = polish_rounds
        self.tolerance = tolerance
        self.probe_subspaces = probe_subspaces
        self.guard = guard
        self.climb = climb
        self.repeat_kept_moves = repeat_kept_moves
        self.probe_paths = probe_paths

    def search(self, obj: Objective) -> TuningResult:
        return answer_with(self.ask_tell(obj), obj.evaluator_or_raise(), obj.workload)

    def ask_tell(self, obj: Objective, start: Point | None = None) -> Search[TuningResult]:
        """The whole search as ask/tell (see :mod:`tuner.objective`): from ``start``
        (default: every axis at its lowest rung), climb, polish, probe subspaces, guard."""
        space = obj.space
        baseline: Timing | None = None
        try:
            baseline = (yield from obj.ask_plan(Plan())) if self.guard else None
            current = yield from obj.ask(start if start is not None else space.minimum_point())
        except BudgetExhausted:
            # A budget of one (with the guard) pays for NCCL's default only: return it.
            if baseline is None:
                raise LagomError("lagom search: the budget allowed no evaluation") from None
            return TuningResult(
                self.name,
                Plan(),
                baseline,
                obj.evaluations,
                baseline=baseline,
                notes=[*space.notes, f"budget {obj.budget}: only NCCL's default was evaluated; kept it"],
            )
        walk = _Walk(current, [_UnitState(u, stride=self.initial_stride) for u in space.resource_units])
        try:
            if self.climb:
                yield from self._climb(space, obj, walk)
            if self.polish_rounds:
                yield from self._polish(space, obj, walk)
            if self.probe_subspaces:
                yield from self._probe_subspaces(space, obj, walk)
            if self.probe_paths and space.path_units:
                walk.knob_only = walk.current
                taken = yield from self._serve_paths(space, obj, walk)
                if taken and self.polish_rounds:
                    yield from self._polish(space, obj, walk, with_paths=True)
        except BudgetExhausted:
            for state in walk.states:
                if state.finished is None:
                    self._finish(state, "budget spent", walk, obj)
        return self._result(space, obj, walk, baseline)

    def _climb(self, space: SearchSpace, obj: Objective, walk: _Walk) -> Search[None]:
        """Serve the open unit with the least priority H until every unit is finished."""
        tol = self.tolerance
        while True:
            open_states = [s for s in walk.states if s.finished is None]
            if not open_states:
                return
            state = min(open_states, key=lambda s: (s.priority, s.unit.index))
            current = walk.current
            moves = self._moves(state, current, space)
            if not moves:
                self._finish(state, "at the top of its ladders", walk, obj)
                continue
            x_old = obj.unit_comm_us(current, state.unit)
            probes = []
            for move in moves:
                candidate = yield from obj.ask(current.point.with_levels(move))
                x_new = obj.unit_comm_us(candidate, state.unit)
                helped = x_new < x_old * (1 - tol) and candidate.iteration_us < current.iteration_us
                probes.append((candidate.iteration_us, helped, move, candidate, x_new))
            helping = [p for p in probes if p[1]]
            for _, helped, move, candidate, x_new in probes:
                if not helped:
                    walk.steps.append(_probe_step(state, move, current, candidate, x_new, space, "rejected"))
            if helping:
                _, _, move, candidate, x_new = min(helping, key=lambda p: p[0])
                state.priority = (candidate.compute_us - current.compute_us) / (x_old - x_new)
                walk.steps.append(_probe_step(state, move, current, candidate, x_new, space, "accepted"))
                walk.current = candidate
                if obj.unit_exposed_us(candidate, state.unit) < HIDDEN_FRACTION * max(x_new, 1e-9):
                    self._finish(state, "communication hidden", walk, obj)
            elif state.stride > 1:
                state.stride = 1
            else:
                self._finish(state, "step stopped helping", walk, obj)

    def _result(self, space: SearchSpace, obj: Objective, walk: _Walk, baseline: Timing | None) -> TuningResult:
        """The walk's point, or NCCL's default when the guard found it not slower."""
        current = walk.current
        result = TuningResult(
            method=self.name,
            plan=space.plan(current.point),
            timing=current.timing,
            evaluations=obj.evaluations,
            point=current.point,
            baseline=baseline,
            steps=walk.steps,
            order=walk.order,
            notes=list(space.notes),
        )
        if walk.knob_only is not None and walk.knob_only.point != current.point:
            chosen = [(u.key, current.point.path(u.index)) for u in space.path_units]
            taken = [f"{key} -> {path.value}" for key, path in chosen if path is not None]
            result.notes.append(f"paths: {', '.join(taken) or 'none'}; the knob-only plan predicted "
                                f"{walk.knob_only.iteration_us:,.0f} us, this one {current.iteration_us:,.0f} us")
        if baseline is not None and baseline.iteration_us <= current.iteration_us:
            result.plan = Plan()
            result.timing = baseline
            result.point = None
            result.notes.append("guard: NCCL's default was not slower than the searched plan; kept NCCL's default")
        return result

    # -- helpers ---------------------------------------------------------------------
    def _moves(self, state: _UnitState, current: Measured, space: SearchSpace) -> list[dict]:
        """One candidate per axis of the unit not at its top: that axis up by the stride."""
        moves = []
        for axis in state.unit.axes:
            top = len(space.axes[axis].values) - 1
            rung = current.point.level(state.unit.index, axis)
            if rung < top:
                moves.append({(state.unit.index, axis): min(top, rung + state.stride)})
        return moves

    def _finish(self, state: _UnitState, why: str, walk: _Walk, obj: Objective) -> None:
        state.finished = why
        walk.order.append(state.unit.key)
        current = walk.current
        walk.steps.append(Step(state.unit.key, "-", obj.unit_comm_us(current, state.unit), current.compute_us,
                               current.iteration_us, state.priority, f"finished: {why}"))

    def _serve_paths(self, space: SearchSpace, obj: Objective, walk: _Walk) -> Search[bool]:
        """Path units by the climb's rule (module docstring): least H first, one serve each."""
        states = [_UnitState(u) for u in space.path_units]
        taken = False
        while True:
            open_states = [st for st in states if st.finished is None]
            if not open_states:
                return taken
            state = min(open_states, key=lambda st: (st.priority, st.unit.index))
            current = walk.current
            x_old = obj.unit_comm_us(current, state.unit)
            probes = []
            for path in space.path_options[state.unit.index]:
                if current.point.path(state.unit.index) == path:
                    continue
                candidate = yield from obj.ask(current.point.with_path(state.unit.index, path))
                helped = candidate.iteration_us < current.iteration_us * (1 - self.tolerance)
                probes.append((candidate, helped, path))
                walk.steps.append(Step(state.unit.key, f"path -> {path.value}", obj.unit_comm_us(candidate, state.unit),
                                       candidate.compute_us, candidate.iteration_us, None,
                                       "helps" if helped else "rejected"))
            helping = [p for p in probes if p[1]]
            if helping:
                candidate, _, path = min(helping, key=lambda p: p[0].iteration_us)
                x_new = obj.unit_comm_us(candidate, state.unit)
                dy = candidate.compute_us - current.compute_us
                state.priority = dy / (x_old - x_new) if x_old != x_new else dy
                walk.steps.append(Step(state.unit.key, f"path -> {path.value}", x_new, candidate.compute_us,
                                       candidate.iteration_us, state.priority, "accepted"))
                walk.current = candidate
                taken = True
                self._finish(state, f"path {path.value}", walk, obj)
            else:
                self._finish(state, "NCCL's kernels kept", walk, obj)

    def _polish(self, space: SearchSpace, obj: Objective, walk: _Walk, with_paths: bool = False) -> Search[None]:
        """Local search around the climbed point: every resource coordinate one rung up or
        down, and the trade moves (channels one rung down, chunk one rung up, and the
        reverse) for units that share signatures; first improvement of Z wins; rounds
        repeat while something was kept. Channels and chunk both buy bandwidth, at
        different compute costs: the climb moves them together, this finds the mix.

        A move that only lowers rungs is also kept when Z does not grow: iteration time
        is flat over wide plateaus (e.g. while another stream is the critical path), and
        the better valley can lie below one; each such step takes resources away, so
        the walk cannot cycle. ``with_paths``: each path unit's other paths are moves too
        (kept only when Z falls)."""
        coords = [(u.index, a) for u in space.resource_units for a in u.axes]
        sigs = {u.index: set(u.signatures) for u in space.resource_units}
        keys = {u.index: u.key for u in space.resource_units}
        trades = [
            (c1, c2) for c1 in coords for c2 in coords
            if c1[1] == CHANNELS.field and c2[1] == CHUNK.field and sigs[c1[0]] & sigs[c2[0]]
        ]
        moves = [{c: d} for c in coords for d in (-1, 1)]
        moves += [{c1: -1, c2: 1} for c1, c2 in trades] + [{c1: 1, c2: -1} for c1, c2 in trades]
        for _ in range(self.polish_rounds):
            improved = False
            for move in moves:
                kept = True
                while kept:  # once unless repeat_kept_moves: then again while the same move keeps helping
                    kept = False
                    current = walk.current
                    levels = {}
                    for (unit, axis), delta in move.items():
                        rung = current.point.level(unit, axis) + delta
                        if not 0 <= rung < len(space.axes[axis].values):
                            break
                        levels[(unit, axis)] = rung
                    else:
                        candidate = yield from obj.ask(current.point.with_levels(levels))
                        better = candidate.iteration_us < current.iteration_us * (1 - self.tolerance)
                        sideways = all(d < 0 for d in move.values()) and candidate.iteration_us <= current.iteration_us
                        if better or sideways:
                            label = " + ".join(sorted({keys[u] for u, _ in levels}))
                            walk.steps.append(
                                Step(
                                    label,
                                    _describe(levels, current, space),
                                    candidate.comm_us_total(),
                                    candidate.compute_us,
                                    candidate.iteration_us,
                                    None,
                                    "accepted (polish)" if better else "accepted (polish, fewer resources)",
                                )
                            )
                            walk.current = candidate
                            improved = True
                            kept = self.repeat_kept_moves
            if with_paths:
                improved = (yield from self._polish_paths(space, obj, walk)) or improved
            if not improved:
                break

    def _polish_paths(self, space: SearchSpace, obj: Objective, walk: _Walk) -> Search[bool]:
        """Each path unit's other paths (NCCL's kernels among them), kept when Z falls."""
        improved = False
        for path_unit in space.path_units:
            for path in (None, *space.path_options[path_unit.index]):
                current = walk.current
                if current.point.path(path_unit.index) == path:
                    continue
                candidate = yield from obj.ask(current.point.with_path(path_unit.index, path))
                if candidate.iteration_us < current.iteration_us * (1 - self.tolerance):
                    walk.steps.append(Step(path_unit.key, f"path -> {path.value if path else 'sm'}",
                                           obj.unit_comm_us(candidate, path_unit), candidate.compute_us,
                                           candidate.iteration_us, None, "accepted (polish)"))
                    walk.current = candidate
                    improved = True
        return improved

    def _probe_subspaces(self, space: SearchSpace, obj: Objective, walk: _Walk) -> Search[None]:
        for unit in space.subspace_units:
            for pair in space.unit_pairs(unit):
                current = walk.current
                if current.point.pair(unit.index) == pair:
                    continue
                candidate = yield from obj.ask(current.point.with_pair(unit.index, pair))
                better = candidate.iteration_us < current.iteration_us * (1 - self.tolerance)
                label = f"{pair[0].nccl_name}/{pair[1].nccl_name}"
                x = obj.unit_comm_us(candidate, unit)
                verdict = "accepted" if better else "rejected"
                walk.steps.append(Step(unit.key, f"subspace -> {label}", x, candidate.compute_us,
                                       candidate.iteration_us, None, verdict))
                if better:
                    walk.current = candidate


def _probe_step(state: _UnitState, move: dict, current: Measured, candidate: Measured, x_new: float,
                space: SearchSpace, outcome: str) -> Step:
    """A climb probe as the walk records it (H only on an accepted one: the unit's new priority)."""
    priority = state.priority if outcome == "accepted" else None
    return Step(state.unit.key, _describe(move, current, space), x_new, candidate.compute_us,
                candidate.iteration_us, priority, outcome)


def _describe(move: dict, current: Measured, space: SearchSpace) -> str:
    parts = []
    for (unit, axis), rung in sorted(move.items()):
        values = space.axes[axis].values
        parts.append(f"{axis} {values[current.point.level(unit, axis)]}->{values[rung]}")
    return ", ".join(parts)
