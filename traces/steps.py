"""Trimming a trace's Workload to whole profiler steps, as Holistic Trace Analysis 0.5 does.

A profiler trace usually ends inside an unfinished step. HTA (``Trace.load_traces``)
keeps only the GPU ops whose launching CPU call started before the last
``ProfilerStep#N`` began; with ``include_last_profiler_step=True`` it also keeps
those launched before that step ended. Ops whose launch is not in the trace are
dropped when trimming. With fewer than two profiler steps nothing is trimmed.
HTA compares whole microseconds (it rounds fractional timestamps up), so do we.

CPU-only collectives (``on_gpu=False``) have no launch: they are kept by their own start.

One deliberate difference: HTA 0.5 compares launch times measured from the trace start
against the last step's end as an absolute timestamp, so with epoch timestamps its
``include_last_profiler_step=True`` also keeps ops launched after the last step ended.
Here they are dropped. None of the shared traces has such ops, so the figures agree.
"""

from __future__ import annotations

import math
from dataclasses import replace

from traces.workload import Workload


def trim_to_profiler_steps(workload: Workload, include_last_step: bool = False) -> Workload:
    """The part of the workload HTA analyses (a new Workload; the input is not changed)."""
    steps = workload.profiler_steps
    if len(steps) < 2:
        return workload
    last_start = max(math.ceil(s) for s, _ in steps)
    last_end = max(math.floor(e) for _, e in steps)

    def keep(t: float | None) -> bool:
        if t is None:
            return False
        t = math.ceil(t)
        return t <= last_end if include_last_step else t < last_start

    compute = [o for o in workload.compute_ops if keep(o.launch_us)]
    colls = [c for c in workload.collectives if keep(c.launch_us if c.on_gpu else c.start_us)]
    kept_steps = steps if include_last_step else [s for s in steps if math.ceil(s[0]) < last_start]
    return replace(workload, compute_ops=compute, collectives=colls, profiler_steps=list(kept_steps))
