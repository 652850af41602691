"""What unit a trace's times are in, from what they imply (issue 32).

The Chrome trace format writes ``ts`` and ``dur`` in microseconds whatever
``displayTimeUnit`` says: the key only sets the viewer's display ("ms" or "ns"), and
Kineto built with ``DISPLAY_TRACE_IN_NS`` writes "ns" over times still in microseconds
(libkineto ``output_json.cpp``: ``fmtTs`` formats nanoseconds as "us.fraction";
``handleTraceStart`` writes the display unit). Other writers put nanoseconds in ``ts``
under the same "ns". Read as microseconds, such a trace is 1,000 times too slow: a
10.7-second step, collectives moving 24 MB/s on an NVSwitch. So "ns" is a hint that the
times confirm or not: where the trace says "ns" and its times read as microseconds
are implausible (below), they are read as nanoseconds, with a warning; any trace whose
times are implausible in the unit read gets a warning naming the figure.

Plausible (judgments with a wide margin, not measured bounds):

- the median GPU compute kernel lasts under :data:`MAX_MEDIAN_KERNEL_US` where the trace
  says "ns" (a training step's median kernel is tens of microseconds; a GEMM of 8192^3 in
  bf16 on an A100 is 3.5 ms, at 312 TFLOP/s: NVIDIA A100 datasheet), and under
  :data:`WARN_MEDIAN_KERNEL_US` for a warning where it does not (a small synthetic trace of
  a few long kernels is not wrong);
- the fastest collective of :data:`RATE_MIN_BYTES` or more moves its bytes at between
  :data:`MIN_RATE_MB_S` (below 1 Gb Ethernet's 125 MB/s for an all-reduce's algorithm
  bandwidth, about half its bus bandwidth) and :data:`MAX_RATE_MB_S` (ten times
  NVLink 5's 1.8 TB/s per GPU: NVIDIA Blackwell datasheet).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from traces.kineto_comm import CommInfo
from traces.kineto_events import CommCall, GpuOp, to_int

NS_PER_US = 1e3
MAX_MEDIAN_KERNEL_US = 1e3  # a median kernel over a millisecond: implausible under "ns" (above)
WARN_MEDIAN_KERNEL_US = 1e5  # over 100 ms: implausible in any trace (above)
RATE_MIN_BYTES = 1 << 20  # collectives this large or larger are rated (smaller ones are latency)
MIN_RATE_MB_S = 10.0  # bytes per microsecond = MB/s; slower than any fabric a GPU job runs on
MAX_RATE_MB_S = 18e6  # 18 TB/s: ten times NVLink 5's 1.8 TB/s per GPU


@dataclass(frozen=True)
class TimeEvidence:
    """What a trace's times imply, read as microseconds."""

    median_kernel_us: float | None  # the median GPU compute kernel
    fastest_rate_mb_s: float | None  # the fastest collective of RATE_MIN_BYTES or more (bytes/us)
    rated: int  # collectives rated

    def scaled(self, factor: float) -> TimeEvidence:
        """The same times multiplied by ``factor``."""
        return TimeEvidence(None if self.median_kernel_us is None else self.median_kernel_us * factor,
                            None if self.fastest_rate_mb_s is None else self.fastest_rate_mb_s / factor, self.rated)

    def implausible(self, max_median_kernel_us: float = WARN_MEDIAN_KERNEL_US) -> str | None:
        """What is implausible about these times, or None."""
        if self.median_kernel_us is not None and self.median_kernel_us > max_median_kernel_us:
            return f"the median GPU kernel lasts {self.median_kernel_us / 1e3:,.1f} ms"
        rate = self.fastest_rate_mb_s
        if rate is not None and rate < MIN_RATE_MB_S:
            return (f"the fastest of its {self.rated:,} collectives of 1 MiB or more moves "
                    f"{rate:,.2f} MB/s, slower than any network a GPU job runs on")
        if rate is not None and rate > MAX_RATE_MB_S:
            return (f"the fastest of its {self.rated:,} collectives of 1 MiB or more moves "
                    f"{rate / 1e6:,.0f} TB/s, ten times any GPU link")
        return None


def time_evidence(gpu_ops: list[GpuOp], comm_by_ext: dict[int, CommCall]) -> TimeEvidence:
    """The median compute kernel and the fastest large collective of a file's GPU ops."""
    kernels = [g.dur for g in gpu_ops if not g.is_comm and not g.is_memory]
    fastest: float | None = None
    rated = 0
    for g in gpu_ops:
        if not g.is_comm or g.dur <= 0:
            continue
        info = CommInfo()
        info.absorb_metadata(g.args or {})
        ext = to_int((g.args or {}).get("External id"))
        if ext is not None and ext in comm_by_ext:
            info.absorb_call(comm_by_ext[ext])
        if info.message_bytes is None or info.message_bytes < RATE_MIN_BYTES:
            continue
        rated += 1
        rate = info.message_bytes / g.dur
        fastest = rate if fastest is None else max(fastest, rate)
    return TimeEvidence(statistics.median(kernels) if kernels else None, fastest, rated)


def time_scale(display_unit: object, evidence: TimeEvidence, path: str) -> tuple[float, list[str]]:
    """(what to multiply the trace's times by to have microseconds, the warning lines)."""
    hinted = evidence.implausible(MAX_MEDIAN_KERNEL_US) if display_unit == "ns" else None
    if hinted is not None and evidence.scaled(1 / NS_PER_US).implausible(MAX_MEDIAN_KERNEL_US) is None:
        return 1 / NS_PER_US, [f"{path}: displayTimeUnit is \"ns\" and, read as microseconds, {hinted}: its times "
                               "are read as nanoseconds"]
    seen = evidence.implausible()
    if seen is not None:
        return 1.0, [f"{path}: read as microseconds (the Chrome trace format's unit; displayTimeUnit "
                     f"{display_unit!r}), {seen}: are its times in another unit? The figures rest on them"]
    return 1.0, []
