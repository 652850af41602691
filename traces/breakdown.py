"""Communication/computation overlap and temporal breakdown, with HTA 0.5 semantics.

These reproduce Holistic Trace Analysis 0.5's ``get_comm_comp_overlap`` and
``get_temporal_breakdown`` on a (trimmed, see :mod:`traces.steps`) Workload:

- GPU ops are the workload's compute/memory ops and its on-GPU collectives. They are
  classed by name as HTA does: communication ``^nccl.*Kernel``; memory ``^Memcpy``,
  ``^Memset``, ``^dma``; "other" for names HTA excludes from compute (``Memcpy`` or
  ``Sync`` anywhere, ``Memset`` at the start); compute is the rest. One deliberate
  difference: communication kernels that are not NCCL's (symmetric memory, custom
  all-reduce; ``CollectiveOp.nccl_tunable`` False) are communication here, where HTA
  counts them as compute.
- Times are whole microseconds: start rounded up, end rounded down (HTA rounds
  fractional timestamps this way; a sub-microsecond kernel can get a negative length).
- Intervals of a class are merged (touching intervals merge).
- Overlap % = time where merged communication and merged compute both run, divided
  by the merged communication time. None when there is no communication (HTA: NaN).
- Temporal breakdown over the span from the first GPU op's start to the last end:
  idle = span minus merged time of all GPU ops; compute = merged compute time;
  non-compute = the rest (communication, memory, other).

A workload with no GPU ops (a CPU-only trace, where HTA raises) gets a breakdown over
its CPU-side collectives instead, with ``basis`` saying so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from traces.workload import Workload

_COMM_RE = re.compile(r"^nccl.*Kernel")
_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")

COMMUNICATION, MEMORY, COMPUTATION, OTHER = "communication", "memory", "computation", "other"


@lru_cache(maxsize=1 << 16)  # kernel names repeat: classify each once
def kernel_class(name: str) -> str:
    """HTA's kernel type of a GPU op name."""
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


@dataclass(frozen=True)
class TemporalBreakdown:
    idle_us: float
    compute_us: float
    non_compute_us: float
    span_us: float
    basis: str  # "gpu" (HTA semantics) or "cpu-collectives" (no GPU ops in the trace)

    def _pct(self, value: float) -> float:
        return 100.0 * value / self.span_us if self.span_us > 0 else 0.0

    @property
    def idle_pct(self) -> float:
        return self._pct(self.idle_us)

    @property
    def compute_pct(self) -> float:
        return self._pct(self.compute_us)

    @property
    def non_compute_pct(self) -> float:
        return self._pct(self.non_compute_us)


def _gpu_intervals(workload: Workload) -> list[tuple[float, float, str]]:
    out: list[tuple[float, float, str]] = []
    for op in workload.compute_ops:
        out.append((math.ceil(op.start_us), math.floor(op.start_us + op.duration_us), kernel_class(op.name)))
    for coll in workload.collectives:
        if coll.on_gpu:
            kind = kernel_class(coll.name) if coll.nccl_tunable else COMMUNICATION
            out.append((math.ceil(coll.start_us), math.floor(coll.start_us + coll.duration_us), kind))
    return out


def merge_like_hta(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """HTA's ``merge_kernel_intervals``: sort by start; an interval opens a new group when it
    starts after every earlier end; a group spans its min start to its max end."""
    out: list[tuple[float, float]] = []
    max_end = -math.inf
    for start, end in sorted(intervals, key=lambda iv: iv[0]):
        if out and start <= max_end:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
        if end > max_end:
            max_end = end
    return out


def comm_comp_overlap_pct(workload: Workload) -> float | None:
    """Percent of merged communication time that overlaps merged compute time (HTA semantics)."""
    ivs = _gpu_intervals(workload)
    comm = merge_like_hta([(s, e) for s, e, k in ivs if k == COMMUNICATION])
    comp = merge_like_hta([(s, e) for s, e, k in ivs if k == COMPUTATION])
    comm_time = sum(e - s for s, e in comm)
    if not comm or comm_time == 0:
        return None
    # HTA's sweep: +1/-1 at communication starts/ends, +2/-2 at compute ones; time spent
    # with the running sum at 3 is overlap.
    marks = [(s, 1) for s, _ in comm] + [(e, -1) for _, e in comm]
    marks += [(s, 2) for s, _ in comp] + [(e, -2) for _, e in comp]
    marks.sort(key=lambda m: m[0])
    running = 0
    overlap = 0.0
    for i in range(len(marks) - 1):
        running += marks[i][1]
        if running == 3:
            overlap += marks[i + 1][0] - marks[i][0]
    return 100.0 * overlap / comm_time


def temporal_breakdown(workload: Workload) -> TemporalBreakdown | None:
    """Idle / compute / non-compute time over the GPU span (HTA semantics); None when empty."""
    ivs = _gpu_intervals(workload)
    if not ivs:
        return _cpu_collective_breakdown(workload)
    merged = merge_like_hta([(s, e) for s, e, _ in ivs])
    span = merged[-1][1] - merged[0][0]
    busy = sum(e - s for s, e in merged)
    comp = merge_like_hta([(s, e) for s, e, k in ivs if k == COMPUTATION])
    compute = sum(e - s for s, e in comp)
    idle = span - busy
    return TemporalBreakdown(idle, compute, span - compute - idle, span, "gpu")


def _cpu_collective_breakdown(workload: Workload) -> TemporalBreakdown | None:
    ivs = [(c.start_us, c.end_us) for c in workload.collectives]
    if not ivs:
        return None
    merged = merge_like_hta(ivs)
    span = max(e for _, e in merged) - merged[0][0]
    busy = sum(e - s for s, e in merged)
    return TemporalBreakdown(span - busy, 0.0, busy, span, "cpu-collectives")
