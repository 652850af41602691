"""Interval arithmetic on (start, end) pairs in microseconds: union, measure, intersection.

Small pure functions shared by the trace analyses. Intervals are half-open in spirit:
intervals that merely touch are merged by :func:`union` (as HTA does) and contribute
nothing to an intersection.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Disjoint, sorted intervals covering the input (touching intervals merge)."""
    items = sorted(intervals)
    out: list[Interval] = []
    for start, end in items:
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def measure(disjoint: Iterable[Interval]) -> float:
    """Total length of disjoint intervals."""
    return sum(end - start for start, end in disjoint)


def intersection_measure(a: list[Interval], b: list[Interval]) -> float:
    """Length of the intersection of two disjoint sorted interval lists (two-pointer sweep)."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class CoverIndex:
    """A disjoint sorted interval list with fast "how much of [s, e] does it cover" queries."""

    def __init__(self, disjoint: list[Interval]) -> None:
        self._starts = [s for s, _ in disjoint]
        self._spans = disjoint
        prefix = [0.0]
        for s, e in disjoint:
            prefix.append(prefix[-1] + (e - s))
        self._prefix = prefix

    def covered(self, start: float, end: float) -> float:
        """Length of [start, end] covered by the intervals."""
        if end <= start or not self._spans:
            return 0.0
        spans = self._spans
        # First interval that could intersect: the last one starting at or before `start`.
        i = max(0, bisect_right(self._starts, start) - 1)
        total = 0.0
        n = len(spans)
        while i < n and spans[i][0] < end:
            lo = max(spans[i][0], start)
            hi = min(spans[i][1], end)
            if hi > lo:
                total += hi - lo
            i += 1
        return total
