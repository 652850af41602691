"""How closely a replay under the trace's own settings reproduces what the trace measured.

The measured side is the trace's GPU period per profiler step (costmodel.replay.schedule),
read off the trace's own times, never the replay's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from costmodel.evaluator import Timing


@dataclass(frozen=True)
class ReplayFidelity:
    """Replayed against measured, over a replay's complete steps."""

    steps: int
    median_step_error_pct: float  # median over steps of |replayed - measured| / measured step time
    max_step_error_pct: float
    comm_error_pct: float  # total collective time over all steps, signed
    exposed_error_pct: float  # total exposed communication, signed
    exposed_error_us_per_step: float
    worst_part: str  # "compute", "communication" (exposed) or "idle" (the rest): where step time differs most
    unexplained_idle_us_per_step: float = 0.0  # GPU idle the graph shows no cause for (kept as measured delays)

    def to_dict(self) -> dict:
        return {
            "steps": self.steps, "median_step_error_pct": round(self.median_step_error_pct, 3),
            "max_step_error_pct": round(self.max_step_error_pct, 3), "comm_error_pct": round(self.comm_error_pct, 3),
            "exposed_error_pct": round(self.exposed_error_pct, 3),
            "exposed_error_us_per_step": round(self.exposed_error_us_per_step, 3), "worst_part": self.worst_part,
            "unexplained_idle_us_per_step": round(self.unexplained_idle_us_per_step, 3),
        }


def fidelity(timing: Timing) -> ReplayFidelity | None:
    """Replayed against measured, from a replay's steps (None when the timing has no steps)."""
    steps = timing.steps
    if not steps:
        return None
    errors = [abs(s.iteration_us - s.measured_iteration_us) / s.measured_iteration_us * 100.0
              for s in steps if s.measured_iteration_us > 0]

    def signed_pct(replayed: float, measured: float) -> float:
        return (replayed - measured) / measured * 100.0 if measured > 0 else (0.0 if replayed == 0 else 100.0)

    comm = sum(s.comm_us for s in steps)
    comm_m = sum(s.measured_comm_us for s in steps)
    exposed = sum(s.exposed_comm_us for s in steps)
    exposed_m = sum(s.measured_exposed_comm_us for s in steps)
    step_diff = sum(s.iteration_us - s.measured_iteration_us for s in steps)
    compute_diff = sum(s.compute_us - s.measured_compute_us for s in steps)
    parts = {"communication": abs(exposed - exposed_m), "compute": abs(compute_diff),
             "idle": abs(step_diff - (exposed - exposed_m) - compute_diff)}
    return ReplayFidelity(
        steps=len(steps), median_step_error_pct=statistics.median(errors) if errors else 0.0,
        max_step_error_pct=max(errors, default=0.0),
        comm_error_pct=signed_pct(comm, comm_m), exposed_error_pct=signed_pct(exposed, exposed_m),
        exposed_error_us_per_step=(exposed - exposed_m) / len(steps), worst_part=max(parts, key=lambda k: parts[k]),
        unexplained_idle_us_per_step=sum(s.unexplained_idle_us for s in steps) / len(steps),
    )
