"""Baseline: AutoCCL (NSDI'25), coordinate descent on each collective's own time.

Inside each algorithm/protocol subspace, AutoCCL tunes (channels, threads, chunk) by
coordinate descent, and its objective is the collective's *own* time, measured while
the job runs (so under whatever interference the compute causes). It never looks at
the iteration time: that is the difference Lagom exploits.

Here: start from NCCL's default resources; for each subspace candidate (NCCL's own
choice, then the k-th pair of every subspace unit), sweep one axis at a time over its
whole ladder, setting that axis to the same rung in every unit in one evaluation,
so that a single evaluation measures every unit's time under interference; after
the sweep each unit keeps the rung where its own collective time x_j was smallest.
Rounds repeat until no unit moves (at most ``rounds``). Each unit finally keeps the
subspace in which its own time was smallest.

Paths (symmetric kernels, copy engines; AutoCCL predates them) are treated as AutoCCL
treats subspaces: after the pair candidates, candidate k puts every path unit on its k-th
path and descends the same way; each path unit keeps the path under which its own
collectives were fastest. Its objective never sees the SMs a path frees, so it takes a
path only where the path also makes the collectives themselves faster.
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_env.errors import LagomError
from nccl_env.knob_table import REPORT_ORDER
from tuner.method import SearchMethod
from tuner.objective import BudgetExhausted, Measured, Objective, Search, answer_with
from tuner.result import Step, TuningResult
from tuner.space import Point, SearchSpace

AXIS_ORDER = tuple(k.field for k in REPORT_ORDER)  # AutoCCL's order: NC, NT, C (the rows' prefixes)


@dataclass
class AutoCCL(SearchMethod):
    name = "autoccl"
    rounds: int = 2  # coordinate-descent rounds per subspace candidate

    def search(self, obj: Objective) -> TuningResult:
        return answer_with(self.ask_tell(obj), obj.evaluator_or_raise(), obj.workload)

    def ask_tell(self, obj: Objective) -> Search[TuningResult]:
        """The whole search as ask/tell (see :mod:`tuner.objective`)."""
        space = obj.space
        start = space.point_near(lambda s: space.defaults[s])
        n_candidates = 1 + max((len(space.unit_pairs(u)) for u in space.subspace_units), default=0)
        n_paths = max((len(space.path_options[u.index]) for u in space.path_units), default=0)
        finals: list[Point] = []
        steps: list[Step] = []
        try:
            for k in range(n_candidates + n_paths):
                point = start
                for unit in space.subspace_units:
                    options = space.unit_pairs(unit)
                    point = point.with_pair(unit.index, options[k - 1] if 0 < k <= len(options) else None)
                for unit in space.path_units:
                    paths = space.path_options[unit.index]
                    j = k - n_candidates
                    point = point.with_path(unit.index, paths[j] if 0 <= j < len(paths) else None)
                descended = yield from self._descend(point, space, obj, steps)
                finals.append((yield from obj.ask(descended)).point)
        except BudgetExhausted:
            pass
        # each resource unit and each subspace unit keeps the candidate where its own time was least
        seen = {m.point: m for m in obj.cached()}
        measured = [seen[p] for p in finals if p in seen] or list(seen.values())
        if not measured:
            raise LagomError("autoccl search: the budget allowed no evaluation")
        point = self._combine(space, obj, measured)
        final: Measured
        try:
            final = yield from obj.ask(point)
        except BudgetExhausted:  # the best measured point, its full timing (a cached point is not charged)
            final = yield from obj.ask(min(measured, key=lambda m: m.iteration_us).point)
        return TuningResult(
            self.name, space.plan(final.point), final.timing, obj.evaluations, point=final.point, steps=steps
        )

    @staticmethod
    def _combine(space: SearchSpace, obj: Objective, measured: list[Measured]) -> Point:
        """Each unit's values from the candidate where that unit's own time was least."""
        levels = {}
        for unit in space.resource_units:
            best = min(measured, key=lambda m: obj.unit_comm_us(m, unit))
            for axis in unit.axes:
                levels[(unit.index, axis)] = best.point.level(unit.index, axis)
        point = measured[0].point.with_levels(levels)
        for unit in space.subspace_units:
            best = min(measured, key=lambda m: obj.unit_comm_us(m, unit))
            point = point.with_pair(unit.index, best.point.pair(unit.index))
        for unit in space.path_units:
            best = min(measured, key=lambda m: obj.unit_comm_us(m, unit))
            point = point.with_path(unit.index, best.point.path(unit.index))
        return point

    def _descend(self, point: Point, space: SearchSpace, obj: Objective, steps: list[Step]) -> Search[Point]:
        units = [u for u in space.resource_units]
        for _ in range(self.rounds):
            moved = False
            for axis in AXIS_ORDER:
                owners = [u for u in units if axis in u.axes]
                if not owners:
                    continue
                sweep = []
                for rung in range(len(space.axes[axis].values)):
                    candidate = point.with_levels({(u.index, axis): rung for u in owners})
                    sweep.append((rung, (yield from obj.ask(candidate))))
                changes = {}
                for unit in owners:
                    rung, m = min(sweep, key=lambda rm: obj.unit_comm_us(rm[1], unit))
                    if rung != point.level(unit.index, axis):
                        changes[(unit.index, axis)] = rung
                        values = space.axes[axis].values
                        steps.append(Step(unit.key, f"{axis} {values[point.level(unit.index, axis)]}->{values[rung]}",
                                          obj.unit_comm_us(m, unit), m.compute_us, m.iteration_us, None, "accepted"))
                if changes:
                    moved = True
                    point = point.with_levels(changes)
            if not moved:
                break
        return point
