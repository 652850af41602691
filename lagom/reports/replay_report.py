"""Words and tables for a replayed trace: its fidelity line, its warning, its steps.

Shared by ``lagom simulate`` and ``lagom tune``; every line fits a 100-column terminal.
"""

from __future__ import annotations

from rich.table import Table

from costmodel.evaluator import StepTiming
from costmodel.replay.data import ReplayData
from costmodel.replay.fidelity import ReplayFidelity
from nccl_env.errors import LagomError
from traces.workload import Workload

UNTRUSTED_STEP_ERROR_PCT = 10.0  # past this median step error a prediction is not worth acting on


def fidelity_line(fid: ReplayFidelity) -> str:
    """``the model reproduces N steps of this trace within X%`` and the collective figures."""
    noun = "step" if fid.steps == 1 else "steps"
    return (f"the model reproduces {fid.steps} {noun} of this trace within {fid.median_step_error_pct:.1f}% "
            f"(collectives {fid.comm_error_pct:+.1f}%, exposed {fid.exposed_error_pct:+.1f}%)")


def fidelity_warning(fid: ReplayFidelity) -> str | None:
    """One warning line when the replay is too far from the trace to trust predictions."""
    if fid.median_step_error_pct <= UNTRUSTED_STEP_ERROR_PCT:
        return None
    return (f"warning: the replay is {fid.median_step_error_pct:.0f}% off the measured steps "
            f"(mostly {fid.worst_part}): do not trust these predictions")


def measured_steps(workload: Workload) -> list[dict]:
    """Per complete profiler step, the trace's own figures (us): the GPU's period, collectives,
    exposed, collective time on the critical path (the most faster collectives can save) and
    GPU idle the graph shows no cause for (docs/replay.md). Empty for a workload it cannot replay."""
    if workload.exec_graph is None:
        return []
    try:
        st = ReplayData(workload).static  # built for these figures alone (analyze replays nothing else)
    except LagomError:
        return []
    # a step's period opens at its first op's start (its annotation's, with no op) and closes
    # where the next one opens: the rows tile the time from the first step's start
    return [{"name": step.name,
             "start_us": round(st.measured_start[step.first] if step.first >= 0 else step.start_us, 3),
             "iteration_us": round(m[0], 3), "comm_us": round(m[1], 3),
             "exposed_comm_us": round(m[2], 3), "critical_comm_us": round(m[4], 3),
             "unexplained_idle_us": round(idle, 3)}
            for step, m, idle in zip(st.steps, st.measured_steps, st.step_unexplained_us)]


_STEP_FIGURES = ("iteration_us", "comm_us", "exposed_comm_us", "critical_comm_us", "unexplained_idle_us")


def measured_steps_table(rows: list[dict]) -> Table:
    """:func:`measured_steps` as a table (ms), with a row of their sums (the periods tile the steps'
    span, so the step column's sum is that span)."""
    table = Table(title="profiler steps, the GPU's period (ms): critical = collective time on the critical path, "
                        "the most faster collectives can save", title_justify="left")
    for col in ("step", "step", "coll.", "exposed", "critical", "unexpl. idle"):
        table.add_column(col, justify="left" if col == "step" and not table.columns else "right", no_wrap=True)
    for r in rows:
        table.add_row(r["name"], *(f"{r[k] / 1e3:,.2f}" for k in _STEP_FIGURES))
    if len(rows) > 1:
        table.add_section()
        table.add_row(f"all {len(rows)} steps", *(f"{sum(r[k] for r in rows) / 1e3:,.2f}" for k in _STEP_FIGURES))
    return table


def steps_table(steps: list[StepTiming], tuned: list[StepTiming] | None = None, whatif: bool = False) -> Table:
    """One row per step (ms): the step as measured, replayed (and tuned); collectives and exposed
    time as measured (>tuned); the trace's collective time on the critical path (the most faster
    collectives can save); a row of their means, the figures the summary gives per step.

    ``whatif``: ``steps`` are a what-if's (``--scale``, ``--set``, ``--config``), each beside what
    the trace measured: measured, what-if, then collectives and exposed as measured > what-if."""
    predicted = "what-if" if whatif else "replayed"
    title = "profiler steps, the GPU's period (ms)"
    if tuned:
        title += "; X>Y: measured > tuned"
    elif whatif:
        title += "; X>Y: measured > what-if"
    table = Table(title=title, title_justify="left")
    for col in ("step", "measured", predicted, *(("tuned",) if tuned else ()), "coll.", "exposed", "critical"):
        table.add_column(col, justify="left" if col == "step" else "right", no_wrap=True)

    def ms(values: list[float]) -> float:
        return sum(values) / len(values) / 1e3

    def row(name: str, group: list[StepTiming], after: list[StepTiming] | None) -> list[str]:
        cells = [name, f"{ms([s.measured_iteration_us for s in group]):,.2f}",
                 f"{ms([s.iteration_us for s in group]):,.2f}"]
        if after is not None:
            cells += [f"{ms([t.iteration_us for t in after]):,.2f}",
                      f"{ms([s.measured_comm_us for s in group]):,.2f}>{ms([t.comm_us for t in after]):,.2f}",
                      f"{ms([s.measured_exposed_comm_us for s in group]):,.2f}>"
                      f"{ms([t.exposed_comm_us for t in after]):,.2f}"]
        elif whatif:
            cells += [f"{ms([s.measured_comm_us for s in group]):,.2f}>{ms([s.comm_us for s in group]):,.2f}",
                      f"{ms([s.measured_exposed_comm_us for s in group]):,.2f}>"
                      f"{ms([s.exposed_comm_us for s in group]):,.2f}"]
        else:
            cells += [f"{ms([s.measured_comm_us for s in group]):,.2f}",
                      f"{ms([s.measured_exposed_comm_us for s in group]):,.2f}"]
        cells.append(f"{ms([s.measured_critical_comm_us for s in group]):,.2f}")
        return cells

    for i, s in enumerate(steps):
        table.add_row(*row(s.name, [s], [tuned[i]] if tuned else None))
    if len(steps) > 1:
        table.add_section()
        table.add_row(*row(f"mean of {len(steps)}", steps, tuned or None))
    return table
