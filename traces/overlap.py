"""Overlap windows: maximal sets of ops that run concurrently with a collective.

A window is a connected component of the "runs at the same time as" relation over
the workload's collectives and compute ops, restricted to components that hold at
least one collective. Tuning decisions couple only inside a window (and through the
cascade to later ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.workload import Workload


@dataclass(frozen=True)
class OverlapWindow:
    start_us: float
    end_us: float
    collective_ids: tuple[int, ...]
    compute_ids: tuple[int, ...]

    @property
    def duration_us(self) -> float:
        return self.end_us - self.start_us


def overlap_windows(workload: Workload, include_memory_ops: bool = False) -> list[OverlapWindow]:
    """Windows in time order. Ops that merely touch (end == start) do not overlap."""
    spans: list[tuple[float, float, int, bool]] = [
        (c.start_us, c.end_us, c.op_id, True) for c in workload.collectives
    ]
    spans += [
        (k.start_us, k.end_us, k.op_id, False)
        for k in workload.compute_ops
        if include_memory_ops or not k.is_memory_op
    ]
    spans.sort(key=lambda s: (s[0], s[1]))
    windows: list[OverlapWindow] = []
    group: list[tuple[float, float, int, bool]] = []
    group_end = float("-inf")

    def close() -> None:
        colls = tuple(s[2] for s in group if s[3])
        comps = tuple(s[2] for s in group if not s[3])
        if colls:
            windows.append(OverlapWindow(group[0][0], group_end, colls, comps))

    for span in spans:
        if group and span[0] >= group_end:
            close()
            group = []
            group_end = float("-inf")
        group.append(span)
        group_end = max(group_end, span[1])
    if group:
        close()
    return windows
