"""What the trace files of one job share, whatever their format: each file's small header, the
job's layout (the rank of each file, the clock origin and the world they share), the checks that
the files are one job's ranks, each collective's wait for its peers attached across ranks, and the
step times of ``lagom record``'s metadata object (docs/record.md).

A reader (:mod:`traces.reader`) parses each file to a header and its records; :func:`job_layout`
lays the files out from the headers alone, so that ``lagom.orchestration.rank_pool`` can parse the files in
worker processes and lay the job out in the parent, with the in-process reader's results.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from nccl_env.errors import LagomError
from traces.exec_graph import WAIT_BASIS_FASTEST, WAIT_BASIS_RANKS
from traces.workload import RecordedSteps, Workload

TRACE_RANK_BOUND = 1 << 20  # a sanity bound on ranks and group sizes read from a trace
_RANK_IN_NAME = re.compile(r"rank[-_.]?(\d+)", re.IGNORECASE)
# Two files whose recorded times lie further apart are different runs: the profilers of one
# job's ranks start within seconds of each other (a judgment, not a measured figure).
JOB_GAP_US = 60e6


@dataclass(frozen=True)
class TraceHeader:
    """What the files of one directory are checked and laid out by (:func:`job_layout`): small."""

    path: Path
    rank: int | None  # distributedInfo.rank; None: from the file name or position (job_layout)
    world_size: int | None
    device_name: str | None
    nccl_version: str | None
    base_us: int
    min_ts: float | None
    max_ts: float | None
    job_id: str | None = None  # lagomRecord.job_id: the same in every rank of one recorded job


@dataclass(frozen=True)
class JobLayout:
    """The ranks of one directory's files and the clock and world they share."""

    ranks: tuple[int, ...]  # per file, in the order of the headers
    origin_us: int  # the shared integer origin (an absolute time)
    world_size: int
    world_size_known: bool


def job_layout(headers: list[TraceHeader], path: Path) -> JobLayout:
    """Ranks, origin and world of one directory's files; LagomError if they are not one job's ranks
    (files of different jobs are told as such before two files' ranks are compared: a folder of
    unrelated traces, each its job's rank 0, is refused as different jobs, not as "both rank 0")."""
    _check_one_job(headers, _assign_ranks(headers, path, check=False), path)
    ranks = _assign_ranks(headers, path)
    starts = [h.base_us + math.floor(h.min_ts) for h in headers if h.min_ts is not None]
    origin = min(starts) if starts else 0
    world = max([h.world_size or 0 for h in headers] + [len(headers), max(ranks) + 1])
    known = any(h.world_size is not None for h in headers)
    return JobLayout(tuple(ranks), origin, world, known)


def attach_comm_waits(workloads: list[Workload]) -> None:
    """Each NCCL kernel's wait for its peers, from all ranks read together (traces.comm_split)."""
    from traces.comm_split import split_waits

    waits = split_waits(workloads)
    for w in workloads:
        set_comm_waits(w, waits.get(w.rank, {}), len(workloads))


def set_comm_waits(workload: Workload, waits: dict[int, float], ranks_read: int) -> None:
    """Attach one rank's waits (collective op id -> us) found among ``ranks_read`` ranks."""
    if workload.exec_graph is not None:
        workload.exec_graph.comm_wait_us = waits
        workload.exec_graph.wait_basis = WAIT_BASIS_RANKS if ranks_read > 1 else WAIT_BASIS_FASTEST


def _assign_ranks(headers: list[TraceHeader], path: Path, check: bool = True) -> list[int]:
    """Rank from distributedInfo, else from the file name (``rank-3``, ``rank3``), else file order;
    ``check``: LagomError where two files are one rank."""
    used: dict[int, Path] = {}
    ranks = []
    for index, h in enumerate(headers):
        rank = h.rank
        if rank is None:
            m = _RANK_IN_NAME.search(h.path.name)
            rank = int(m.group(1)) if m and int(m.group(1)) < TRACE_RANK_BOUND else index
        if rank in used and check:
            raise LagomError(f"{path}: files {used[rank].name} and {h.path.name} are both rank {rank}")
        used[rank] = h.path
        ranks.append(rank)
    return ranks


def _check_one_job(headers: list[TraceHeader], ranks: list[int], path: Path) -> None:
    """Every file against the lowest rank's: the same world, NCCL and device, recorded together."""
    ref = headers[min(range(len(headers)), key=lambda i: ranks[i])]
    for p in headers:
        if p is ref:
            continue
        for what, a, b in (("world size", ref.world_size, p.world_size), ("NCCL", ref.nccl_version, p.nccl_version),
                           ("device", ref.device_name, p.device_name), ("lagom record job", ref.job_id, p.job_id)):
            if a is not None and b is not None and a != b:
                raise LagomError(f"{path}: {ref.path.name} and {p.path.name} are traces of different jobs "
                                 f"({what} {a} and {b}); a folder is one job's ranks: name the files to "
                                 "analyse each on its own")
        if ref.min_ts is not None and ref.max_ts is not None and p.min_ts is not None and p.max_ts is not None:
            a0, a1 = ref.base_us + ref.min_ts, ref.base_us + ref.max_ts
            b0, b1 = p.base_us + p.min_ts, p.base_us + p.max_ts
            if max(a0, b0) - min(a1, b1) > JOB_GAP_US:
                raise LagomError(f"{path}: {ref.path.name} and {p.path.name} are traces of different jobs "
                                 f"(recorded more than a minute apart: from {_when(a0)} and from {_when(b0)}); "
                                 "a folder is one job's ranks: name the files to analyse each on its own")


def _when(time_us: float) -> str:
    """A trace time as a UTC date when it is one (epoch microseconds), else as microseconds."""
    if 1e15 <= time_us < 1e17:  # 2001 .. 5138
        return datetime.fromtimestamp(time_us / 1e6, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{time_us:.0f} us"


def recorded_steps_of(record: dict) -> RecordedSteps | None:
    """A ``lagomRecord`` object's step times as RecordedSteps; None when absent or not numbers."""
    times = record.get("step_time_us")
    if not isinstance(times, dict) or not isinstance(record.get("clock"), str):
        return None

    def series(phase: str, clock: str) -> tuple[float, ...] | None:
        values = (times.get(phase) or {}).get(clock) if isinstance(times.get(phase), dict) else None
        if not isinstance(values, list) or not all(isinstance(v, int | float) and v >= 0 for v in values):
            return None
        return tuple(float(v) for v in values)

    clock = "device" if record["clock"] == "cuda_events" else "host"
    unprofiled, profiled = series("unprofiled", clock), series("profiled", clock)
    if unprofiled is None or profiled is None:
        return None
    return RecordedSteps(record["clock"], unprofiled, profiled,
                         series("unprofiled", "host") or (), series("profiled", "host") or ())
