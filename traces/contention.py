"""Contention seen in a trace: how much slower compute kernels ran while a collective ran.

A compute kernel (memcpy/memset excluded) that overlapped an on-GPU collective ran
under that collective's contention for SMs and memory bandwidth. Kernels are matched
by name and launch shape (grid, block): for a shape that ran both with no overlapping
collective (the reference) and overlapped, each overlapped run's slowdown is its
duration divided by the median reference duration. The report gives, per collective
type (the type that overlapped the kernel longest), the median slowdown and the
number of (overlapped kernel, reference) pairs behind it; ``"all"`` pools them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from traces.intervals import CoverIndex, union
from traces.workload import ComputeOp, Workload


@dataclass(frozen=True)
class ContentionFigure:
    collective: str  # a CollectiveType value, or "all"
    median_slowdown: float  # overlapped duration / median uncontended duration
    pairs: int  # overlapped kernels with a reference behind the median


@dataclass(frozen=True)
class ContentionReport:
    rank: int
    figures: list[ContentionFigure]  # "all" first, then per collective type, when any pairs exist
    kernel_shapes: int  # distinct (name, grid, block) with both overlapped and reference runs

    def figure(self, collective: str) -> ContentionFigure | None:
        return next((f for f in self.figures if f.collective == collective), None)


_Key = tuple[str, tuple | None, tuple | None]


def _key(op: ComputeOp) -> _Key:
    return (op.name, op.grid, op.block)


def _classify(workload: Workload) -> tuple[dict[_Key, list[float]], list[tuple[ComputeOp, str]]]:
    """Reference durations per kernel shape, and the overlapped kernels with their dominant collective
    (the type that covers it longest; the first such type on a tie)."""
    by_type: dict[str, CoverIndex] = {}
    for ctype in {c.collective.value for c in workload.collectives if c.on_gpu}:
        spans = union((c.start_us, c.end_us) for c in workload.collectives if c.on_gpu and c.collective.value == ctype)
        by_type[ctype] = CoverIndex(spans)
    kernels = [op for op in workload.compute_ops if not op.is_memory_op]
    starts = np.array([op.start_us for op in kernels], dtype=np.float64)
    ends = np.array([op.end_us for op in kernels], dtype=np.float64)
    best = np.zeros(len(kernels), dtype=np.float64)
    best_type = np.full(len(kernels), -1, dtype=np.int64)
    types = list(by_type)
    for t, cover in enumerate(by_type.values()):
        amount = cover.covered_many(starts, ends)
        more = amount > best
        best = np.where(more, amount, best)
        best_type[more] = t
    reference: dict[_Key, list[float]] = {}
    overlapped: list[tuple[ComputeOp, str]] = []
    for op, t in zip(kernels, best_type.tolist()):
        if t < 0:
            reference.setdefault(_key(op), []).append(op.duration_us)
        else:
            overlapped.append((op, types[t]))
    return reference, overlapped


def measured_slowdowns(workload: Workload) -> dict[int, float]:
    """Compute op id -> the slowdown the trace measured for its kernel shape beside a collective:
    the median, over the shape's overlapped runs, of their duration over the shape's median run
    alone (at least 1), for every overlapped kernel whose shape also ran alone; the per-shape
    figure behind :func:`contention_report`'s medians (the replay's uncontended time divides by it)."""
    reference, overlapped = _classify(workload)
    medians = {k: statistics.median(v) for k, v in reference.items()}
    ratios: dict[_Key, list[float]] = {}
    for op, _ in overlapped:
        ref = medians.get(_key(op), 0.0)
        if ref > 0:
            ratios.setdefault(_key(op), []).append(op.duration_us / ref)
    per_shape = {k: max(1.0, statistics.median(v)) for k, v in ratios.items()}
    return {op.op_id: per_shape[_key(op)] for op, _ in overlapped if _key(op) in per_shape}


def contention_report(workload: Workload) -> ContentionReport:
    reference, overlapped = _classify(workload)
    medians = {k: statistics.median(v) for k, v in reference.items()}
    ratios: dict[str, list[float]] = {}
    shapes = set()
    for op, ctype in overlapped:
        ref = medians.get(_key(op))
        if ref is None or ref <= 0:
            continue
        shapes.add(_key(op))
        ratios.setdefault(ctype, []).append(op.duration_us / ref)
    figures = []
    pooled = [r for rs in ratios.values() for r in rs]
    if pooled:
        figures.append(ContentionFigure("all", statistics.median(pooled), len(pooled)))
    for ctype in sorted(ratios):
        figures.append(ContentionFigure(ctype, statistics.median(ratios[ctype]), len(ratios[ctype])))
    return ContentionReport(workload.rank, figures, len(shapes))

