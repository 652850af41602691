"""Interval arithmetic on (start, end) pairs in microseconds: union, intersection, coverage.

Small pure functions shared by the trace analyses. Intervals are half-open in spirit:
intervals that merely touch are merged by :func:`union` (as HTA does) and contribute
nothing to an intersection.
"""

from __future__ import annotations

import functools
from bisect import bisect_right
from collections.abc import Iterable

import numpy as np

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


def intersection(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """The intervals where two disjoint sorted interval lists both hold (two-pointer sweep)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


class CoverIndex:
    """A disjoint sorted interval list with fast "how much of [s, e] does it cover" queries."""

    def __init__(self, disjoint: list[Interval]) -> None:
        self._starts = [s for s, _ in disjoint]
        self._spans = disjoint

    @functools.cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The spans' starts and ends as arrays, for :meth:`covered_many` only (the tuner's objective
        builds an index per evaluation and asks :meth:`covered`)."""
        return (np.asarray(self._starts, dtype=np.float64),
                np.asarray([e for _, e in self._spans], dtype=np.float64))

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

    def covered_many(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """:meth:`covered` of every ``[starts[i], ends[i]]`` at once, each the same number: an
        interval that meets one span is one subtraction over the arrays, one that meets several
        (rare: spans are disjoint) is summed one piece after the other as :meth:`covered` does."""
        out = np.zeros(len(starts), dtype=np.float64)
        if not self._spans or not len(starts):
            return out
        s_arr, e_arr = self._arrays
        first = np.maximum(np.searchsorted(s_arr, starts, side="right") - 1, 0)
        visited = np.searchsorted(s_arr, ends, side="left") - first  # spans[first:...] starting before the end
        real = ends > starts
        one = np.flatnonzero(real & (visited == 1))
        i = first[one]
        piece = np.minimum(e_arr[i], ends[one]) - np.maximum(s_arr[i], starts[one])
        out[one] = np.where(piece > 0, piece, 0.0)
        for k in np.flatnonzero(real & (visited > 1)).tolist():
            out[k] = self.covered(float(starts[k]), float(ends[k]))
        return out
