"""What ``lagom simulate`` shows as text: the figures table, then a trace's steps and the
replay's fidelity (its ``--json`` is :meth:`lagom.orchestration.simulation.SimulateResult.to_dict`).

A what-if on a trace stands beside the trace's measured figures, labelled; the figures are
per profiler step when the workload is a trace (docs/replay.md)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from costmodel.evaluator import Timing
from costmodel.replay.fidelity import ReplayFidelity
from costmodel.replay.joint import JointTiming
from lagom.reports.console import stdout_console
from lagom.reports.replay_report import fidelity_line, steps_table


@dataclass
class SimulateFigures:
    """What the table shows (:class:`lagom.orchestration.simulation.SimulateResult` is one)."""

    figures_of: str  # whose figures: the file (its rank), or a folder's job and its slowest ranks
    cluster: str  # the cluster's name
    evaluator: str  # analytic | sim
    rank: int  # the rank replayed (a folder's: the rank whose ops are counted)
    timing: Timing  # the figures: per step for a trace (a folder's: the job's step)
    ops: int
    collectives: int
    fidelity: ReplayFidelity | None  # a trace's replay under its own settings against the trace
    measured: dict[str, float] | None  # a what-if on a trace: the trace's means (us), else None
    whatif: bool  # a plan or a scale moves the replay off the trace's own (the steps table says so)
    joint: JointTiming | None  # a folder's ranks replayed jointly, else None


def figures_table(f: SimulateFigures) -> Table:
    """Iteration, compute, communication and contention figures; beside a what-if, the measured ones."""
    per = " per step" if f.timing.steps else ""
    measured = f.measured
    table = Table(title=f"{f.figures_of} on {f.cluster} ({f.evaluator}){per}")
    table.add_column("quantity")
    if measured:
        table.add_column("measured", justify="right")
    table.add_column("what-if" if measured else "value", justify="right")

    def add(label: str, value: str, key: str | None = None, same: bool = False) -> None:
        """A row; beside a what-if, the measured figure ``key`` first (``same``: the trace's, as is)."""
        if measured:
            table.add_row(label, value if same else "-" if key is None else f"{measured[key] / 1e3:,.2f} ms", value)
        else:
            table.add_row(label, value)

    t = f.timing
    add("iteration (Z)", f"{t.iteration_us / 1e3:,.2f} ms", "iteration_us")
    add("compute busy (Y)", f"{t.compute_us / 1e3:,.2f} ms", "compute_us")
    add("communication busy (X)", f"{t.comm_us / 1e3:,.2f} ms", "comm_us")
    add("exposed communication", f"{t.exposed_comm_us / 1e3:,.2f} ms", "exposed_comm_us")
    add("compute without contention", f"{t.compute_uncontended_us / 1e3:,.2f} ms")
    add("compute slowdown from contention", f"{t.compute_slowdown:.3f}x")
    add(f"ops / collectives (rank {f.rank})" if f.joint is not None else "ops / collectives",
        f"{f.ops} / {f.collectives}", same=True)
    return table


def print_simulate_report(f: SimulateFigures) -> None:
    """The table on stdout; for a trace, its steps and the replay's fidelity line after it."""
    console = stdout_console()
    console.print(figures_table(f))
    if f.timing.steps:
        console.print(steps_table(f.timing.steps, whatif=f.whatif))
        if f.fidelity is not None:
            console.print(fidelity_line(f.fidelity), highlight=False)
