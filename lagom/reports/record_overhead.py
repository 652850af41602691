"""The profiler's overhead as ``lagom record`` measured it: one line for ``lagom record``, ``analyze`` and ``tune``.

A recorded trace carries the step times of the steps timed just before its window
without the profiler and of the profiled steps, on one clock
(:class:`traces.workload.RecordedSteps`). The overhead is the ratio of the two means:
per rank, then the mean over ranks (the ranks of one job step together).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from costmodel.evaluator import DurationScale, TraceEvaluator
from nccl_env.errors import LagomError
from nccl_env.plan import Plan
from traces.workload import RecordedSteps, Workload

# Past this, the trace's CPU side is visibly paced by the profiler (a judgment, not a measured bound).
LARGE_OVERHEAD = 0.10
_CLOCK_NAMES = {"cuda_events": "CUDA events", "host": "host clock"}


@dataclass(frozen=True)
class ProfilerOverhead:
    profiled_us: float  # mean profiled step
    unprofiled_us: float  # mean step without the profiler
    profiled_steps: int
    unprofiled_steps: int
    ranks: int
    clock: str
    noise: float = 0.0  # the largest relative distance of one step from its set's mean (either set, any rank)

    @property
    def fraction(self) -> float:
        """+0.12: the profiled step is 12% longer."""
        return self.profiled_us / self.unprofiled_us - 1.0

    def to_dict(self) -> dict:
        return {"profiled_step_us": round(self.profiled_us, 3), "unprofiled_step_us": round(self.unprofiled_us, 3),
                "overhead": round(self.fraction, 4), "profiled_steps": self.profiled_steps,
                "unprofiled_steps": self.unprofiled_steps, "ranks": self.ranks, "clock": self.clock,
                "step_noise": round(self.noise, 4), "within_noise": self.within_noise}

    @property
    def within_noise(self) -> bool:
        """Below zero (the profiled steps ran faster: the profiler cannot speed a job up) or no
        larger than the steps' own spread: the profiler's cost is not measurable here."""
        return self.fraction < 0 or abs(self.fraction) <= self.noise


def profiler_overhead(recorded: Sequence[RecordedSteps | None]) -> ProfilerOverhead | None:
    """Over the ranks whose trace has both step times on one clock; None when none has."""
    usable = [r for r in recorded if r is not None and r.profiled_us and r.unprofiled_us and fmean(r.unprofiled_us) > 0]
    if not usable or len({r.clock for r in usable}) != 1:
        return None
    return ProfilerOverhead(
        profiled_us=fmean(fmean(r.profiled_us) for r in usable),
        unprofiled_us=fmean(fmean(r.unprofiled_us) for r in usable),
        profiled_steps=len(usable[0].profiled_us),
        unprofiled_steps=len(usable[0].unprofiled_us),
        ranks=len(usable),
        clock=usable[0].clock,
        noise=max(max(_spread(r.profiled_us), _spread(r.unprofiled_us)) for r in usable),
    )


def _spread(steps: Sequence[float]) -> float:
    mean = fmean(steps)
    return max(abs(t - mean) for t in steps) / mean if mean > 0 else 0.0


def overhead_line(overhead: ProfilerOverhead) -> str:
    o = overhead
    ranks = f", mean of {o.ranks} ranks" if o.ranks > 1 else ""
    line = (f"profiler overhead: {o.fraction:+.1%} (profiled step {o.profiled_us / 1e3:,.3f} ms, "
            f"{o.unprofiled_us / 1e3:,.3f} ms without the profiler; {o.profiled_steps} and {o.unprofiled_steps} "
            f"steps{ranks}, {_CLOCK_NAMES.get(o.clock, o.clock)})")
    if o.fraction < 0:
        line += (f"; below zero: the steps timed without the profiler (timed first) ran slower than the "
                 f"profiled ones, and a profiler cannot speed a job up: its cost is within the steps' "
                 f"noise here (one step is up to {o.noise:.1%} off its set's mean), not measurable; a job "
                 f"still warming up: raise --skip")
    elif o.within_noise:
        line += f"; within the steps' noise (one step is up to {o.noise:.1%} off its set's mean)"
    elif o.fraction >= LARGE_OVERHEAD:
        line += "; the profiler paced this job: its CPU side looks slower in the trace than it runs"
    return line


@dataclass(frozen=True)
class UnprofiledCpu:
    """The CPU scale at which a trace's replay runs at its unprofiled step time."""

    cpu: float  # DurationScale.cpu
    replayed_us: float  # the replay's mean step at that scale
    target_us: float  # the mean unprofiled step
    reached: bool  # False: even the smallest scale leaves the step above the target


MIN_CPU_SCALE = 0.05  # below this the CPU's own time is not what the profiler added


def check_recorded_steps(workload: Workload, from_trace: bool) -> None:
    """``--unprofiled-cpu`` needs a trace with the step times lagom record writes: LagomError otherwise."""
    if not from_trace:
        raise LagomError("--unprofiled-cpu: applies to a trace recorded by lagom record")
    if profiler_overhead([workload.recorded_steps]) is None:
        raise LagomError(f"{workload.source}: --unprofiled-cpu needs the step times lagom record writes "
                         f"(lagomRecord.step_time_us); this trace has none")


def unprofiled_cpu(evaluator: TraceEvaluator, workload: Workload, iterations: int = 14) -> UnprofiledCpu:
    """``--unprofiled-cpu``: the CPU's time between calls scaled so that the replay under the
    trace's own settings runs at the mean step ``lagom record`` timed without the profiler
    (bisection on the scale: a replay is monotone in it). LagomError when the trace carries
    no recorded step times."""
    check_recorded_steps(workload, True)
    overhead = profiler_overhead([workload.recorded_steps])
    assert overhead is not None  # checked just above
    target = overhead.unprofiled_us

    def step_us(cpu: float) -> float:
        return evaluator.evaluate(workload, Plan(), DurationScale(cpu=cpu)).iteration_us

    as_measured = step_us(1.0)
    if as_measured <= target:
        return UnprofiledCpu(1.0, as_measured, target, True)
    low, high = MIN_CPU_SCALE, 1.0
    at_low = step_us(low)
    if at_low > target:
        return UnprofiledCpu(low, at_low, target, False)
    for _ in range(iterations):
        mid = (low + high) / 2
        if step_us(mid) > target:
            high = mid
        else:
            low = mid
    return UnprofiledCpu(low, step_us(low), target, True)


def unprofiled_line(u: UnprofiledCpu) -> str:
    if not u.reached:
        return (f"--unprofiled-cpu: even the CPU's time between calls at x{u.cpu:.2f} leaves the replayed step at "
                f"{u.replayed_us / 1e3:,.3f} ms against {u.target_us / 1e3:,.3f} ms unprofiled: the profiler's "
                f"overhead is not in the CPU's time alone; replaying at x{u.cpu:.2f}")
    return (f"--unprofiled-cpu: the CPU's time between calls x{u.cpu:.3f} replays the unprofiled step "
            f"({u.replayed_us / 1e3:,.3f} ms against {u.target_us / 1e3:,.3f} ms measured without the profiler)")
