"""Per-workload data an evaluator builds once and reuses for every plan.

Both evaluators keep plan-independent data per generated workload (op order, dependencies,
compute shapes). :class:`WorkloadCache`, one per evaluator instance (it lives as long as the
evaluator), holds it keyed by the workload object: its id, checked through a weak reference
(an id can be reused once the workload is gone) and the workload's op and dependency counts
(a workload grown in place is rebuilt). Do not mutate a workload between evaluations
otherwise; build a new one. (A trace's replay data: :class:`costmodel.replay.data.ReplayData`.)

A workload is validated when its data is built (:func:`costmodel.evaluator.check_workload`),
and each call's plan and scale by :meth:`WorkloadCache.for_evaluation`, so each evaluator
refuses the same inputs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from costmodel.evaluator import DurationScale, check_generated, check_plan, check_workload
from costmodel.replay.anchor import check_scale
from traces.workload import Workload

if TYPE_CHECKING:
    from costmodel.cluster import ClusterSpec
    from nccl_env.plan import Plan

T = TypeVar("T")


def _size(workload: Workload) -> int:
    return len(workload.compute_ops) + len(workload.collectives) + len(workload.dependencies)


class WorkloadCache(Generic[T]):
    """``build(workload)`` once per workload, for the last ``max_workloads`` workloads."""

    def __init__(self, build: Callable[[Workload], T], max_workloads: int) -> None:
        self._build = build
        self._max = max_workloads
        self._entries: dict[int, tuple[weakref.ref, int, T]] = {}

    def get(self, workload: Workload) -> T:
        key = id(workload)
        size = _size(workload)
        hit = self._entries.get(key)
        if hit is not None and hit[0]() is workload and hit[1] == size:
            return hit[2]
        check_workload(workload)
        data = self._build(workload)
        if len(self._entries) >= self._max:
            self._entries = {k: v for k, v in self._entries.items() if v[0]() is not None}
            if len(self._entries) >= self._max:
                self._entries.pop(next(iter(self._entries)))  # the oldest
        self._entries[key] = (weakref.ref(workload), size, data)
        return data

    def for_evaluation(self, workload: Workload, plan: Plan, scale: DurationScale | None, cluster: ClusterSpec) -> T:
        """``get(workload)`` after the checks both evaluators make on each call (LagomError, one line):
        ``plan`` runs on ``cluster``, ``workload`` is generated (a trace is replayed), ``scale`` is identity."""
        check_plan(plan, cluster)
        check_generated(workload)
        check_scale(workload, scale)
        return self.get(workload)

    def values(self) -> list[T]:
        """The data of every workload held now."""
        return [entry[2] for entry in self._entries.values()]
