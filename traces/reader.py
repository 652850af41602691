"""The trace-reader interface: what every module outside ``traces/`` reads a trace through.

A trace format (PyTorch profiler / Kineto JSON today; an Nsight Systems export or a Chakra
trace later) is one :class:`TraceReader`. It says whether it reads a path
(:meth:`TraceReader.can_read`), reads it whole (:meth:`TraceReader.read`: one
:class:`~traces.workload.Workload` per rank, each with its execution graph,
``Workload.exec_graph``, and the metadata the trace records: device, NCCL version, world,
profiler steps, ``lagom record``'s step times), reads it in the two rounds
``lagom.orchestration.rank_pool`` spreads over workers (:meth:`TraceReader.files`,
:meth:`TraceReader.scan`, then :func:`job_layout` over the headers and
:meth:`ScannedTrace.build_rank`), and writes a replay's prediction back in its own format
(:meth:`TraceReader.moved_trace`, ``--export-trace``).

:func:`reader_for` picks the reader of a path: the first of :func:`readers` that claims it,
else Kineto, the fallback, whose one-line errors then say what is wrong with the path (a
missing file, a folder without traces, a file that is not JSON). A second format is a
module of ``traces/`` and one entry in :func:`readers`; no caller changes.

What is not a format's: the job's layout from the files' headers and each collective's wait
for its peers across ranks (:mod:`traces.trace_job`), NCCL's kernel names
(:mod:`traces.comm_names`) and ``lagom record``'s metadata object are re-exported here, so
that callers need no reader's module. ``tests/test_import_layers.py`` holds that nothing
outside ``traces/`` imports a reader's modules (``traces.kineto*``, ``traces.comm_names``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nccl_env.errors import LagomError
from traces.comm_names import algorithm_protocol_from_kernel_name, kernel_short_name
from traces.trace_job import (
    JobLayout,
    TraceHeader,
    attach_comm_waits,
    job_layout,
    recorded_steps_of,
    set_comm_waits,
)
from traces.workload import Workload

__all__ = [
    "JobLayout", "MovedOps", "ReadTrace", "ScannedTrace", "TraceHeader", "TraceReader",
    "algorithm_protocol_from_kernel_name", "attach_comm_waits", "job_layout", "kernel_short_name", "read_trace",
    "reader_for", "readers", "recorded_steps_of",
    "kept_trace_scans", "scan_trace_file", "set_comm_waits", "trace_files",
]


@dataclass(frozen=True)
class ReadTrace:
    """A trace as read: one Workload per rank (sorted by rank), each carrying its execution graph
    (``exec_graph``) and the trace's metadata, and which reader read which files."""

    workloads: list[Workload]
    files: tuple[Path, ...]
    reader: str  # the reader's name ("kineto")

    @property
    def lowest(self) -> Workload:
        """The lowest rank's Workload (what ``simulate`` and ``tune`` replay)."""
        return min(self.workloads, key=lambda w: w.rank)


class ScannedTrace(Protocol):
    """One file parsed, before its times are laid on the job's clock: picklable (worker processes
    return it), small enough to spill."""

    path: Path

    def header(self) -> TraceHeader:
        """What :func:`job_layout` lays the job's files out by."""
        ...

    def build_rank(self, layout: JobLayout, index: int) -> Workload:
        """The Workload of the ``index``-th file of ``layout``'s job (this one)."""
        ...

    def kept(self) -> ScannedTrace:
        """What a worker on this machine spills between the rounds: itself, or a smaller stand-in that
        finds its records again here (where this machine's trace cache keeps them)."""
        ...

    def whole(self) -> ScannedTrace:
        """This scan with its records in hand: what a worker on another machine can build from."""
        ...

    def build_is_kept(self, layout: JobLayout, index: int) -> bool:
        """Whether the trace cache keeps this rank's Workload in ``layout`` (a read, not a build)."""
        ...


class MovedOps(Protocol):
    """Where a replay put a trace's ops and CPU calls (``costmodel.replay.schedule.MovedTimes``)."""

    starts: dict[int, float]  # op id -> predicted start, us on the workload's clock
    ends: dict[int, float]

    def cpu_us(self, thread: int, t: float) -> float:
        """The replayed time of a CPU call made at ``t`` on the execution graph's thread ``thread``."""
        ...


class TraceReader(Protocol):
    """One trace format."""

    name: str

    def can_read(self, path: Path) -> bool:
        """Whether ``path`` (a file, or a folder of one job's per-rank files) is in this format."""
        ...

    def files(self, path: Path) -> list[Path]:
        """The per-rank files ``path`` names, checked before reading (LagomError: missing, empty,
        too large for the memory at hand)."""
        ...

    def scan(self, file: Path) -> ScannedTrace:
        """One file parsed (LagomError naming the file if it is not a trace of this format)."""
        ...

    def kept_scan(self, file: Path) -> ScannedTrace | None:
        """:meth:`scan` where the trace cache keeps what it needs (nothing parsed); None where it does not."""
        ...

    def read(self, path: Path) -> ReadTrace:
        """Every rank of ``path``, each collective's wait for its peers found across the ranks."""
        ...

    def moved_trace(self, workload: Workload, moved: MovedOps, gzipped: bool, stamp: dict) -> tuple[bytes, int]:
        """``workload``'s own file rewritten with every event where ``moved`` puts it and ``stamp``'s
        entries (what was predicted, by whom) added to its metadata, as a file's bytes (gzip
        compressed when ``gzipped``), and the number of GPU ops moved; the caller writes them."""
        ...


def readers() -> tuple[TraceReader, ...]:
    """The readers, in the order :func:`reader_for` tries them; Kineto last (the fallback)."""
    from traces.kineto_reader import KINETO  # lazily: the implementations import this module's types

    return (KINETO,)


def reader_for(path: str | Path) -> TraceReader:
    """The reader of ``path``: the first that claims it, else Kineto (whose errors then name the problem)."""
    if not str(path).strip():  # Path("") is ".": an empty argument is not the current folder
        raise LagomError("an empty path: give a trace file or a folder of trace files")
    found = readers()
    return next((r for r in found if r.can_read(Path(path))), found[-1])


def read_trace(path: str | Path) -> list[Workload]:
    """One Workload per rank from a trace file or a folder of per-rank files, sorted by rank."""
    return reader_for(path).read(Path(path)).workloads


def trace_files(path: str | Path) -> list[Path]:
    """The per-rank files of the trace ``path``, checked before any is read."""
    return reader_for(path).files(Path(path))


def kept_trace_scans(files: list[Path]) -> list[ScannedTrace] | None:
    """Every file's scan where the trace cache keeps them all (each file's header: nothing to parse);
    None at the first file it does not keep."""
    out = []
    for f in files:
        kept = reader_for(f).kept_scan(f)
        if kept is None:
            return None
        out.append(kept)
    return out


def scan_trace_file(path: Path) -> ScannedTrace:
    """One per-rank file parsed by its format's reader (the first round of ``lagom.orchestration.rank_pool``)."""
    return reader_for(path).scan(path)


