"""Baseline and ground truth: every point of the space, for spaces small enough.

The space is the product over units of their rungs (over subspace units of their pairs
plus "NCCL decides", over path units of their paths plus NCCL's kernels); that is
exponential in the number of units, so this refuses (LagomError) spaces larger than
``max_points``. Use it on small windows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from nccl_env.errors import LagomError
from tuner.method import SearchMethod
from tuner.objective import BudgetExhausted, Objective
from tuner.result import TuningResult
from tuner.space import Point, SearchSpace


@dataclass
class Exhaustive(SearchMethod):
    name = "exhaustive"
    max_points: int = 5000  # larger spaces are refused

    def search(self, obj: Objective) -> TuningResult:
        space = obj.space
        size = space.size()
        if size > self.max_points:
            raise LagomError(f"exhaustive search: the space has {size} points, more than the limit {self.max_points}")
        best = None
        try:
            for point in all_points(space):
                measured = obj.measure(point)
                if best is None or measured.iteration_us < best.iteration_us:
                    best = measured
        except BudgetExhausted:
            pass
        if best is None:
            raise LagomError("exhaustive search: the budget allowed no evaluation")
        return TuningResult(self.name, space.plan(best.point), best.timing, obj.evaluations, point=best.point)


def all_points(space: SearchSpace):
    """Every point: rungs x pairs (and NCCL decides) x paths (and NCCL's kernels)."""
    keys = [(u.index, a) for u in space.resource_units for a in u.axes]
    ranges = [range(len(space.axes[a].values)) for _, a in keys]
    sub = [(u.index, (None, *space.unit_pairs(u))) for u in space.subspace_units]
    routes = [(u.index, (None, *space.path_options[u.index])) for u in space.path_units]
    for rungs in itertools.product(*ranges):
        levels = tuple(sorted((u, a, r) for (u, a), r in zip(keys, rungs)))
        for pairs in itertools.product(*(options for _, options in sub)):
            chosen = tuple((u, p) for (u, _), p in zip(sub, pairs))
            for paths in itertools.product(*(options for _, options in routes)):
                yield Point(levels, chosen, tuple((u, p) for (u, _), p in zip(routes, paths)))
