"""Reading PyTorch profiler (Kineto) traces into Workloads, one per rank.

:func:`read_trace` takes a ``.json`` / ``.json.gz`` file or a directory with one file
per rank and returns one :class:`~traces.workload.Workload` per rank, sorted by rank.
Bad input (missing file, not JSON, truncated gzip, not a trace, a trace with neither
kernels nor collectives) raises :class:`~nccl_env.errors.LagomError` with one line
naming the file and the problem.

What becomes what:

- ``kernel`` events (legacy ``Kernel``) whose name is an NCCL/RCCL kernel become
  :class:`CollectiveOp` s (NCCL's symmetric kernels, ``ncclSymkDevKernel_*``, with
  ``recorded_path`` SYMMETRIC); other kernels become :class:`ComputeOp` s with their launch
  shape (grid, block, blocks per SM, registers, shared memory, occupancy);
  ``gpu_memcpy`` / ``gpu_memset`` (legacy ``Memcpy`` / ``Memset``) become ComputeOps with
  ``is_memory_op=True``, except the copies launched inside a collective's CPU call: that is
  NCCL's copy-engine path (CTA policy ZERO), and the copies of one call on one stream become
  one CollectiveOp (``recorded_path`` COPY_ENGINE: no SM). ``gpu_user_annotation`` spans are not
  kernels.
- A collective's type, message size, dtype and process group come from, in order:
  the kernel's own args (recent PyTorch copies ``Collective name``, ``In/Out msg
  nelems``, ``dtype``, ``Process Group Name/Ranks`` onto it), the ``record_param_comms``
  CPU op with the kernel's ``External id``, and the CPU comm calls that enclose the
  kernel's launch (``correlation`` -> ``cudaLaunchKernel`` -> ``record_param_comms`` /
  ``nccl:all_to_all`` / ``c10d::...`` on the launching thread, with their ``Input Dims``);
  the kernel name is the last resort. ``message_bytes`` = max(in, out) elements x dtype size.
- Traces without GPU communication kernels (e.g. gloo jobs) get their collectives from
  the CPU comm calls (``record_param_comms``, ``gloo:all_reduce`` ...), ``on_gpu=False``,
  on one pseudo-stream per CPU thread (negative stream ids).
- ``ProfilerStep#N`` CPU annotations give ``profiler_steps``; CUDA sync events
  (``Stream Wait Event`` with ``wait_on_stream``, recorded with PyTorch's
  ``enable_cuda_sync_events``) give event dependencies between streams.
- ``launch_us`` of each GPU op is the CPU time of the runtime call that launched it
  (same ``correlation``); analyses use it to trim to whole profiler steps as HTA does.
- ``exec_graph``: the execution graph a replay schedules (launch calls, host
  synchronisation, inferred stream waits, named steps, each NCCL kernel's recorded
  channels and threads): :mod:`traces.exec_graph`.

Times are microseconds from an integer origin: the floor of the earliest event of
all files read together, so the ranks of one directory share a clock (a file's
``baseTimeNanoseconds``, which recent PyTorch writes with times relative to it, is
added first, to the whole microsecond).

The files of one directory must be one job's ranks: two files with different
``distributedInfo.world_size``, ``nccl_version``, device names or ``lagom record`` job
ids, or recorded more than a minute apart, are a LagomError naming both, as two files
of the same rank are.

A trace written by ``lagom record`` carries a ``lagomRecord`` metadata object
(docs/record.md): its job id, the NCCL version (read when ``distributedInfo`` has
none: torch writes it only for a default group whose backend is exactly ``nccl``) and
the step times measured with and without the profiler (``Workload.recorded_steps``).
The world size comes from ``distributedInfo.world_size``, else from the default
process group of ``pg_config``; with neither, it counts the ranks read and the
Workload says so (``world_size_known=False``).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from nccl_env.errors import LagomError
from nccl_env.files import PathKind, check_path_kind
from nccl_env.knobs import CollectiveType, CommPath
from traces.comm_names import collective_from_kernel_name, is_nccl_kernel, is_symmetric_kernel
from traces.exec_graph_build import build_cpu_graph, build_exec_graph
from traces.gc_pause import no_cyclic_gc
from traces.kineto_comm import (
    CommInfo,
    CpuCollectiveCall,
    collective_from_call,
    cpu_call_nest,
    issuing_calls,
    parse_ranks,
)
from traces.kineto_events import (
    MAX_NAME_CHARS,
    CommCall,
    EventReader,
    GpuOp,
    HostCall,
    StepMark,
    SyncEvent,
    ThreadEvents,
    to_int,
)
from traces.kineto_json import read_events
from traces.limits import TRACE_MEMORY_PER_JSON_BYTE, check_fits_memory
from traces.parse_cache import (
    FileIdentity,
    cached_derived,
    cached_parse_keyed,
    derived_is_kept,
    file_identity,
    kept_derived,
    load_kept,
)
from traces.time_units import time_evidence, time_scale
from traces.trace_job import TRACE_RANK_BOUND, JobLayout, TraceHeader, attach_comm_waits, job_layout, recorded_steps_of
from traces.workload import (
    RECORD_METADATA_KEY,
    CollectiveOp,
    ComputeOp,
    Dependency,
    DependencyKind,
    P2PLink,
    ProcessGroup,
    RecordedSteps,
    Stream,
    StreamKind,
    Workload,
)

_COMM_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "dtype", "Process Group Name")


def read_trace(path: str | Path) -> list[Workload]:
    """One Workload per rank from a trace file or a directory of per-rank trace files."""
    files = trace_files(path)
    path = Path(path)
    with no_cyclic_gc():
        parsed = [scan_file(f) for f in files]
        layout = job_layout([p.header() for p in parsed], path)
        workloads = [p.build_rank(layout, i) for i, p in enumerate(parsed)]
        attach_comm_waits(workloads)
    return sorted(workloads, key=lambda w: w.rank)


# The steps of read_trace, public so that lagom.orchestration.rank_pool (through traces.reader) can run the per-file
# ones (parse, build) in worker processes and the rest (layout, waits: traces.trace_job) in the parent,
# with the same results.
def trace_files(path: str | Path) -> list[Path]:
    """The trace files ``path`` names (itself, or a folder's .json/.json.gz files, sorted), checked
    before reading: LagomError for an empty path, a missing one, a folder without traces, or traces
    larger than the memory at hand (:func:`traces.limits.check_fits_memory`)."""
    if not str(path).strip():
        raise LagomError("an empty path: give a trace file or a folder of trace files")
    path = Path(path)
    kind = check_path_kind(path, str(path), folder=True)
    if kind is PathKind.FOLDER:
        named = sorted(p for p in path.iterdir() if is_trace_name(p.name))
        for member in named:  # a trace's name on a FIFO, a device or a link loop: refused, never opened
            check_path_kind(member, str(member), folder=True)
        files = [p for p in named if p.is_file()]
        if not files:
            raise LagomError(f"{path}: directory holds no .json or .json.gz trace files")
    elif kind is PathKind.FILE:
        files = [path]
    else:
        raise LagomError(f"{path}: no such file or directory")
    check_fits_memory(files, path, TRACE_MEMORY_PER_JSON_BYTE)
    return files


def parse_trace_file(path: Path, known: FileIdentity | None = None) -> _ParsedTrace:
    """One file's metadata and compact event records (LagomError naming the file if it is not a trace);
    parsed once and kept while the file is unchanged (:mod:`traces.parse_cache`)."""
    with no_cyclic_gc():
        parsed, entry = cached_parse_keyed(path, _parse_file, known)
    parsed.cache_entry = entry
    return parsed


_HEADER = ("header",)  # the header kept beside a parse (cached_derived's inputs)


def scan_file(path: Path) -> _ParsedTrace | _KeptTrace:
    """One file as the two rounds of a folder read take it: where the cache keeps its parse, its
    header alone (:class:`_KeptTrace`: the records stay in the cache until a build needs them);
    else parsed (and its header kept beside the parse for the next command)."""
    found = file_identity(path)
    kept = _kept_scan(path, found)
    if kept is not None:
        return kept
    parsed = parse_trace_file(path, found[0] if found is not None else None)
    cached_derived(parsed.cache_entry, _HEADER, parsed.header)
    return parsed


def kept_scan(path: Path) -> _KeptTrace | None:
    """:func:`scan_file` where the cache keeps the file's header (nothing parsed); None where it does not."""
    return _kept_scan(path, file_identity(path))


def _kept_scan(path: Path, found: tuple[FileIdentity, str] | None) -> _KeptTrace | None:
    if found is None:
        return None
    head = kept_derived(found[1], _HEADER)
    return _KeptTrace(path, head, found[1]) if isinstance(head, TraceHeader) and head.path == path else None


def is_trace_name(name: str) -> bool:
    """A Kineto trace's file name: .json or .json.gz."""
    return name.endswith(".json") or name.endswith(".json.gz")


@dataclass(frozen=True)
class DeviceRecord:
    """More of ``deviceProperties`` than the name and SMs: memory, compute capability, devices listed."""

    mem_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
    count: int | None = None


@dataclass
class _ParsedTrace:
    """One file's metadata and compact event records, before times are shifted to the origin."""

    path: Path
    rank: int | None
    world_size: int | None
    device_name: str | None
    sm_count: int | None
    pg_config: list[ProcessGroup]
    device: DeviceRecord = field(default_factory=lambda: DeviceRecord())
    nccl_version: str | None = None  # distributedInfo.nccl_version, as written
    base_us: int = 0  # baseTimeNanoseconds in whole microseconds (0: times are absolute)
    job_id: str | None = None  # lagomRecord.job_id: the same in every rank of one recorded job
    recorded_steps: RecordedSteps | None = None  # lagomRecord.step_time_us
    gpu_ops: list[GpuOp] = field(default_factory=list)
    launch_ts: dict[int, float] = field(default_factory=dict)
    launch_thread: dict[int, tuple[float, float, tuple]] = field(default_factory=dict)
    comm_calls: list[CommCall] = field(default_factory=list)
    comm_by_ext: dict[int, CommCall] = field(default_factory=dict)
    steps: list[tuple[float, float]] = field(default_factory=list)
    stream_waits: list[tuple[int, int, int, int]] = field(default_factory=list)
    min_ts: float | None = None
    max_ts: float | None = None  # the latest end of a GPU op, comm call or profiler step
    # for the execution graph (traces.exec_graph_build)
    launch_calls: dict[int, tuple[float, float, tuple]] = field(default_factory=dict)
    host_calls: list[HostCall] = field(default_factory=list)
    sync_events: list[SyncEvent] = field(default_factory=list)
    step_marks: list[StepMark] = field(default_factory=list)
    thread_events: dict[tuple, ThreadEvents] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # events dropped for their times (one line)
    listed_groups: tuple[str, ...] = ()  # pg_config's groups that list their ranks (not only a size)
    cache_entry: str | None = None  # its kept parse (traces.parse_cache): what a built rank is kept beside

    def header(self) -> TraceHeader:
        return TraceHeader(self.path, self.rank, self.world_size, self.device_name, self.nccl_version,
                           self.base_us, self.min_ts, self.max_ts, self.job_id)

    def build_rank(self, layout: JobLayout, index: int) -> Workload:
        """The Workload of the ``index``-th file of ``layout``'s directory (this one), kept beside
        its parse (:func:`traces.parse_cache.cached_derived`) for the next command's same layout."""
        self.rank = layout.ranks[index]
        return _kept_build(self.cache_entry, self.path, self.base_us, layout, index, lambda: self)

    def kept(self) -> _ParsedTrace | _KeptTrace:
        """What a worker hands on: where the cache keeps this parse (:class:`_KeptTrace`), not a copy."""
        return self if self.cache_entry is None else _KeptTrace(self.path, self.header(), self.cache_entry)

    def whole(self) -> _ParsedTrace:
        return self

    def build_is_kept(self, layout: JobLayout, index: int) -> bool:
        return False  # records in hand: a worker builds from them
    def build(self, origin: int, world_size: int, world_size_known: bool) -> Workload:
        return _WorkloadBuilder(self, origin, world_size, world_size_known).build()


def _kept_build(entry: str | None, path: Path, base_us: int, layout: JobLayout, index: int,
                records: Callable[[], _ParsedTrace]) -> Workload:
    """The rank's Workload: kept beside its parse ``entry`` for these inputs, or built from ``records()``."""
    rank, origin = layout.ranks[index], layout.origin_us - base_us

    def build() -> Workload:
        parsed = records()
        parsed.rank = rank
        with no_cyclic_gc():
            return parsed.build(origin, layout.world_size, layout.world_size_known)

    return cached_derived(entry, _build_inputs(path, base_us, layout, index), build)


def _build_inputs(path: Path, base_us: int, layout: JobLayout, index: int) -> tuple:
    """What a rank's build reads besides its parse: its path, rank, origin and world."""
    return ("build_rank", str(path), layout.ranks[index], layout.origin_us - base_us, layout.world_size,
            layout.world_size_known)


@dataclass
class _KeptTrace:
    """A parse the cache keeps, named instead of copied (what a worker spills between the two rounds of
    ``lagom.orchestration.rank_pool``: its header and the entry's name): the records are read back
    from the cache only when the rank's Workload is not kept as well, and parsed again (the file
    must be the same) where the entry went meanwhile."""

    path: Path
    head: TraceHeader
    entry: str

    def header(self) -> TraceHeader:
        return self.head

    def build_rank(self, layout: JobLayout, index: int) -> Workload:
        return _kept_build(self.entry, self.path, self.head.base_us, layout, index, self._records)

    def kept(self) -> _KeptTrace:
        return self

    def build_is_kept(self, layout: JobLayout, index: int) -> bool:
        return derived_is_kept(self.entry, _build_inputs(self.path, self.head.base_us, layout, index))

    def whole(self) -> _ParsedTrace:
        return self._records()

    def _records(self) -> _ParsedTrace:
        found = load_kept(self.entry)
        if not isinstance(found, _ParsedTrace):
            found = parse_trace_file(self.path)
            if found.cache_entry != self.entry:
                raise LagomError(f"{self.path}: changed while it was read; run the command again")
        found.path = self.path
        return found


def _parse_file(path: Path) -> _ParsedTrace:
    meta, events = read_events(path, EventReader)
    scale, unit_warnings = time_scale(meta.get("displayTimeUnit"), time_evidence(events.gpu_ops, events.comm_by_ext),
                                      str(path))
    if scale != 1.0:  # its times are nanoseconds (traces.time_units): read again, scaled
        meta, events = read_events(path, lambda: EventReader(scale))
    parsed = _read_metadata(path, meta)
    parsed.gpu_ops = events.gpu_ops
    parsed.launch_ts, parsed.launch_thread = events.launches()
    parsed.comm_calls = events.comm_calls
    parsed.comm_by_ext = events.comm_by_ext
    parsed.steps = events.steps
    parsed.stream_waits = events.stream_waits
    parsed.min_ts = events.min_ts if events.min_ts != math.inf else None
    ends = [g.ts + g.dur for g in parsed.gpu_ops] + [c.end for c in parsed.comm_calls] + [e for _, e in parsed.steps]
    parsed.max_ts = max(ends, default=parsed.min_ts)
    parsed.launch_calls = events.launch_calls()
    parsed.host_calls = events.host_calls
    parsed.sync_events = events.sync_events
    parsed.step_marks = events.step_marks
    parsed.thread_events = events.thread_events()
    parsed.warnings = unit_warnings + _dropped_events(path, events.bad_events, events.timed_events(), events.first_bad)
    if events.long_names:
        parsed.warnings.append(f"{path}: {events.long_names:,} event names longer than {MAX_NAME_CHARS:,} characters "
                               f"cut to that length, first {events.first_long}")
    if not parsed.gpu_ops and not any(collective_from_call(c) for c in parsed.comm_calls):
        raise LagomError(f"{path}: trace has neither GPU kernels nor collectives (nothing to analyse)")
    return parsed


# A trace where more than 1 in 100 timed events has a time that cannot be (no ts, a negative duration)
# has a broken clock or writer: refused. Fewer are dropped with one warning line (a judgment: no real
# trace among the shared and test ones has any).
MAX_BAD_EVENT_FRACTION = 0.01


def _dropped_events(path: Path, bad: int, kept: int, first: str | None) -> list[str]:
    """The warning for events dropped for their times, or LagomError when they are the bulk."""
    if not bad:
        return []
    total = bad + kept
    if bad > MAX_BAD_EVENT_FRACTION * total:
        raise LagomError(f"{path}: {bad:,} of {total:,} timed events have a time that cannot be (no ts or a "
                         f"negative duration), first {first}; more than {MAX_BAD_EVENT_FRACTION:.0%}: not read")
    return [f"{path}: dropped {bad:,} of {total:,} timed events whose time cannot be (no ts or a negative "
            f"duration), first {first}"]


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_metadata(path: Path, doc: dict) -> _ParsedTrace:
    info = doc.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = to_int(info.get("rank"))
    world = to_int(info.get("world_size"))
    if "rank" in info and (rank is None or not 0 <= rank < TRACE_RANK_BOUND):
        raise LagomError(f"{path}: distributedInfo.rank {_show(info['rank'])} is not a rank")
    if "world_size" in info and (world is None or not 0 < world <= TRACE_RANK_BOUND):
        raise LagomError(f"{path}: distributedInfo.world_size {_show(info['world_size'])} is not a world size")
    if rank is not None and world is not None and rank >= world:
        raise LagomError(f"{path}: distributedInfo.rank {rank} is not below world_size {world}")
    groups: list[ProcessGroup] = []
    listed: list[str] = []
    pg_config = info.get("pg_config")
    if isinstance(pg_config, list):
        for pg in pg_config:
            if not isinstance(pg, dict) or not isinstance(pg.get("pg_name"), (str, int)):
                continue
            ranks = parse_ranks(pg.get("ranks"))
            size = to_int(pg.get("pg_size"))
            if ranks:
                listed.append(str(pg["pg_name"]))
            elif size and 0 < size <= TRACE_RANK_BOUND:
                ranks = tuple(range(size))
            if ranks:
                groups.append(ProcessGroup(str(pg["pg_name"]), ranks))
                if world is None and (pg.get("pg_desc") == "default_pg" or str(pg["pg_name"]) == "0"):
                    world = len(ranks) if len(ranks) <= TRACE_RANK_BOUND else None  # the default group spans the world
    device_name = sm_count = None
    device = DeviceRecord()
    props = doc.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict):
        device_name = props[0].get("name") if isinstance(props[0].get("name"), str) else None
        sm_count = to_int(props[0].get("numSms"))
        major, minor = to_int(props[0].get("computeMajor")), to_int(props[0].get("computeMinor"))
        mem = to_int(props[0].get("totalGlobalMem"))
        device = DeviceRecord(mem if mem is not None and mem > 0 else None,
                              (major, minor) if major is not None and minor is not None else None, len(props))
    record = doc.get(RECORD_METADATA_KEY)
    record = record if isinstance(record, dict) else {}
    version = info.get("nccl_version")
    if not isinstance(version, str):
        version = record.get("nccl_version")
    base_ns = to_int(doc.get("baseTimeNanoseconds"))
    base_us = base_ns // 1000 if base_ns is not None and 0 <= base_ns < 1 << 62 else 0
    job = record.get("job_id")
    parsed = _ParsedTrace(path, rank, world, device_name, sm_count, groups, device,
                          version if isinstance(version, str) else None, base_us,
                          job if isinstance(job, str) else None, recorded_steps_of(record))
    parsed.listed_groups = tuple(listed)
    return parsed


# ---- building the Workload ---------------------------------------------------------------
class _WorkloadBuilder:
    def __init__(self, parsed: _ParsedTrace, origin: int, world_size: int, world_size_known: bool) -> None:
        self.p = parsed
        self.origin = origin
        self.world_size = world_size
        self.world_size_known = world_size_known
        self.groups: dict[str, ProcessGroup] = {g.name: g for g in parsed.pg_config}
        self.listed_groups = set(parsed.listed_groups)  # groups whose members the trace lists (not positions)
        # send/recv peers not read (_p2p): (field, peer, why) -> group shown -> ops
        self.bad_peers: dict[tuple[str, int, str], dict[str, int]] = {}
        # Comm calls per launching thread, sorted by start, for the enclosing-call join.
        self.calls_by_thread: dict[tuple, list[CommCall]] = {}
        for call in sorted(parsed.comm_calls, key=lambda c: (c.ts, -c.end)):
            self.calls_by_thread.setdefault(call.thread, []).append(call)
        self.call_starts = {t: [c.ts for c in calls] for t, calls in self.calls_by_thread.items()}

    def build(self) -> Workload:
        p = self.p
        o = self.origin
        compute: list[ComputeOp] = []
        colls: list[CollectiveOp] = []
        # A stream's kind is its most telling op's: an NCCL kernel, else a compute kernel, else
        # another communication kernel (symmetric memory runs on the compute stream), else memory.
        stream_kind: dict[int, tuple[int, StreamKind]] = {}
        op_corr: list[tuple[ComputeOp | CollectiveOp, int | None]] = []
        made: list[tuple[ComputeOp | CollectiveOp, GpuOp]] = []  # each op with the GPU op it came from
        ce_copies: dict[tuple, list[GpuOp]] = {}  # (enclosing comm call, stream) -> its copies
        for g in p.gpu_ops:
            launch = p.launch_ts.get(g.correlation) if g.correlation is not None else None
            launch_us = None if launch is None else launch - o
            if g.is_comm:
                info = self._comm_info(g)
                nccl = is_nccl_kernel(g.name)
                colls.append(self._collective(info, g.name, g.stream, g.ts - o, g.dur, True, launch_us, nccl))
                if is_symmetric_kernel(g.name):
                    colls[-1].recorded_path = CommPath.SYMMETRIC
                op_corr.append((colls[-1], g.correlation))
                made.append((colls[-1], g))
                _note_kind(stream_kind, g.stream, 3 if nccl else 1, StreamKind.COMMUNICATION)
            elif g.is_memory and (call := self._collective_call(g.correlation)) is not None:
                ce_copies.setdefault((call.ts, call.end, call.thread, g.stream), []).append(g)
            else:
                compute.append(
                    ComputeOp(
                        op_id=-1,
                        name=g.name,
                        stream=g.stream,
                        start_us=g.ts - o,
                        duration_us=float(g.dur),
                        grid=g.grid,
                        block=g.block,
                        blocks_per_sm=g.blocks_per_sm,
                        registers_per_thread=g.registers,
                        shared_memory_bytes=g.shared_memory,
                        occupancy_pct=g.occupancy,
                        is_memory_op=g.is_memory,
                        launch_us=launch_us,
                    )
                )
                op_corr.append((compute[-1], g.correlation))
                made.append((compute[-1], g))
                if g.is_memory:
                    _note_kind(stream_kind, g.stream, 0, StreamKind.MEMORY)
                else:
                    _note_kind(stream_kind, g.stream, 2, StreamKind.COMPUTE)
        for copies in ce_copies.values():  # NCCL's copy-engine path: one collective per call and stream
            first = min(copies, key=lambda c: c.ts)
            end = max(c.ts + c.dur for c in copies)
            span = replace(first, dur=end - first.ts)
            launch = p.launch_ts.get(first.correlation) if first.correlation is not None else None
            info = self._comm_info(first)
            colls.append(self._collective(info, first.name, first.stream, first.ts - o, span.dur, True,
                                          None if launch is None else launch - o))
            colls[-1].recorded_path = CommPath.COPY_ENGINE
            op_corr.append((colls[-1], first.correlation))
            made.append((colls[-1], span))
            _note_kind(stream_kind, first.stream, 3, StreamKind.COMMUNICATION)
        streams = [Stream(s, k, f"stream {s}") for s, (_, k) in sorted(stream_kind.items())]
        cpu_threads: dict[int, tuple] = {}
        if not any(c.on_gpu for c in colls):
            cpu_colls, cpu_streams, cpu_threads = self._cpu_collectives()
            colls += cpu_colls
            streams += cpu_streams
        _assign_ids(compute, colls)
        deps = self._dependencies(op_corr)
        steps = sorted((a - o, b - o) for a, b in set(p.steps))
        graph = None
        if made:
            graph = build_exec_graph(made, p.launch_calls, p.host_calls, p.sync_events, p.step_marks, deps, o,
                                     p.thread_events)
        elif cpu_threads:  # a gloo job: its collectives are the CPU's own blocking calls
            graph = build_cpu_graph([(c, *cpu_threads[id(c)]) for c in colls if id(c) in cpu_threads],
                                    p.step_marks, p.thread_events, o)
        repeated = sorted({s.name.split(" (repeat ")[0] for s in graph.steps if " (repeat " in s.name}) if graph else []
        step_warnings = [f"{p.path}: step name{'s' if len(repeated) > 1 else ''} {', '.join(repeated)} "
                         f"annotate{'' if len(repeated) > 1 else 's'} more than one step: each kept apart, the "
                         "later ones named '... (repeat N)'"] if repeated else []
        return Workload(
            rank=p.rank if p.rank is not None else 0,
            world_size=self.world_size,
            streams=streams,
            compute_ops=compute,
            collectives=colls,
            groups=self.groups,
            dependencies=deps,
            source=str(p.path),
            device_name=p.device_name,
            sm_count=p.sm_count,
            device_mem_bytes=p.device.mem_bytes,
            compute_capability=p.device.compute_capability,
            device_count=p.device.count,
            profiler_steps=steps,
            nccl_version=p.nccl_version,
            world_size_known=self.world_size_known,
            exec_graph=graph,
            recorded_steps=p.recorded_steps,
            input_warnings=list(p.warnings) + self._peer_warnings() + step_warnings,
        )

    def _comm_info(self, g: GpuOp) -> CommInfo:
        info = CommInfo()
        args = g.args or {}
        if any(k in args for k in _COMM_KEYS):
            info.absorb_metadata(args)
        ext = to_int(args.get("External id"))
        if ext is not None and ext in self.p.comm_by_ext:
            info.absorb_call(self.p.comm_by_ext[ext])
        for call in self._enclosing_calls(g.correlation):
            info.absorb_call(call)
        if info.collective is None:
            info.collective = collective_from_kernel_name(g.name)
        return info

    def _collective_call(self, corr: int | None) -> CommCall | None:
        """The innermost CPU call naming a collective that encloses this launch (None: none does)."""
        for call in self._enclosing_calls(corr):
            if collective_from_call(call) is not None:
                return call
        return None

    def _enclosing_calls(self, corr: int | None) -> list[CommCall]:
        """CPU comm calls enclosing the kernel's launch on its thread, innermost first."""
        launch = self.p.launch_thread.get(corr) if corr is not None else None
        if launch is None:
            return []
        ts, end, thread = launch
        calls = self.calls_by_thread.get(thread)
        if not calls:
            return []
        i = bisect_right(self.call_starts[thread], ts)
        out = []
        # Comm calls nest only a few deep; look back over a bounded number of candidates.
        for call in reversed(calls[max(0, i - 16):i]):
            if call.ts <= ts and call.end >= end:
                out.append(call)
        return out

    def _collective(
        self, info: CommInfo, name: str, stream: int, start_us: float, dur: float, on_gpu: bool,
        launch_us: float | None, nccl_tunable: bool = True,
    ) -> CollectiveOp:
        group = self._group(info)
        return CollectiveOp(
            op_id=-1,
            name=name,
            collective=info.collective or CollectiveType.ALLREDUCE,  # generic kernel, no metadata: see docs
            message_bytes=info.message_bytes,  # None: the trace did not record it
            stream=stream,
            start_us=start_us,
            duration_us=float(dur),
            group=group,
            dtype=info.dtype,
            p2p=self._p2p(info, group) if info.collective is CollectiveType.SENDRECV else None,
            on_gpu=on_gpu,
            launch_us=launch_us,
            nccl_tunable=nccl_tunable,
        )

    def _p2p(self, info: CommInfo, group: str) -> P2PLink | None:
        """A send/recv's ends as global ranks: ``Dst Rank`` / ``Src Rank`` as PyTorch writes them
        (the peer's global rank), else ``Rank`` (the peer's rank in its group) mapped through the
        group's ranks (``pg_config``, else ``Process Group Ranks``). None where the metadata names no
        peer, or one outside the world or the group (counted for one warning naming it)."""
        found = info.p2p_peer()
        if found is None:
            return None
        own = self.p.rank if self.p.rank is not None else 0
        ranks = self.groups[group].ranks
        listed = group in self.listed_groups
        peer, why = found.rank, None
        if not found.is_global:
            if not listed and len(ranks) != self.world_size:
                why = "its group's ranks are not in the trace (no pg_config)"
            elif not 0 <= peer < len(ranks):
                why = f"not a rank of its {len(ranks)}-rank group"
            else:
                peer = ranks[peer]
        if why is None and (peer < 0 or (self.world_size_known and peer >= self.world_size)):
            why = f"outside the world of {self.world_size} ranks"
        elif why is None and (peer == own or (listed and (peer not in ranks or own not in ranks))):
            why = f"not a peer of rank {own} in its group"
        if why is not None:
            shown = list(ranks) if len(ranks) <= 8 else f"of {len(ranks)} ranks"
            groups = self.bad_peers.setdefault((found.field, found.rank, why), {})
            groups[f"{group!r} {shown}"] = groups.get(f"{group!r} {shown}", 0) + 1
            return None
        return P2PLink(own, peer, info.seq) if found.sends else P2PLink(peer, own, info.seq)

    def _peer_warnings(self) -> list[str]:
        """One line per peer that could not be read (traces.kineto._p2p): which, why, where, how many."""
        return [f"{self.p.path}: {sum(groups.values()):,} send/recv name peer {field} {rank}: {why} "
                f"(group {', '.join(sorted(groups))}); not paired with a peer"
                for (field, rank, why), groups in self.bad_peers.items()]

    def _group(self, info: CommInfo) -> str:
        """The op's process group name, registering the group if new."""
        name = info.group
        if name is None:
            # No metadata: PyTorch's default group ("0") spans the world.
            name = "0"
        if name not in self.groups:
            ranks = info.group_ranks
            if ranks:
                self.listed_groups.add(name)
            else:
                size = info.group_size
                if not size or not 0 < size <= TRACE_RANK_BOUND:
                    size = self.world_size
                ranks = tuple(range(size))  # positions only: the trace does not list the members
            self.groups[name] = ProcessGroup(name, ranks)
        return name

    def _cpu_collectives(self) -> tuple[list[CollectiveOp], list[Stream], dict[int, tuple]]:
        """Collectives seen only as CPU comm calls: outermost call per nest, one pseudo-stream per thread;
        and each one's thread and the caller's (thread, call time) that handed it over, if any (by ``id`` of
        the op). A caller's hand-over call (``c10d::allreduce_``)
        whose work a backend's span on another thread shows (``gloo:all_reduce``) is that one
        collective, counted once, at the backend's span (traces.kineto_comm.issuing_calls)."""
        o = self.origin
        nests: list[CpuCollectiveCall] = []
        seen: set[tuple] = set()
        for thread, calls in self.calls_by_thread.items():
            i = 0
            while i < len(calls):
                outer = calls[i]
                members = [outer]
                j = i + 1
                while j < len(calls) and calls[j].ts < outer.end and calls[j].end <= outer.end:
                    members.append(calls[j])
                    j += 1
                i = j
                key = (thread, outer.ts, outer.end)
                if key in seen:
                    continue
                seen.add(key)
                nest = cpu_call_nest(outer, members)
                if nest.info.collective is not None:  # else a wait or an unknown call
                    nests.append(nest)
        handed = issuing_calls(nests)
        for i, j in handed.items():  # the hand-over's metadata (group, size) completes the backend's
            nests[j].info.absorb_call(nests[i].outer)
        issuer = {j: (nests[i].outer.thread, nests[i].outer.ts) for i, j in handed.items()}
        ops: list[CollectiveOp] = []
        op_threads: dict[int, tuple] = {}
        thread_stream: dict[tuple, int] = {}
        for i, nest in enumerate(nests):
            if i in handed:
                continue
            outer, thread = nest.outer, nest.outer.thread
            stream = thread_stream.setdefault(thread, -(len(thread_stream) + 1))
            ops.append(self._collective(nest.info, outer.name, stream, outer.ts - o, outer.end - outer.ts, False,
                                        None))
            op_threads[id(ops[-1])] = (thread, issuer.get(i))
        streams = [
            Stream(sid, StreamKind.COMMUNICATION, f"cpu thread {thread[1]}") for thread, sid in thread_stream.items()
        ]
        return ops, streams, op_threads

    def _dependencies(self, op_corr: list) -> list[Dependency]:
        """Event record/wait pairs (CUDA sync events): last op recorded on the producer stream
        before the record call -> first op launched on the waiting stream after the wait call."""
        if not self.p.stream_waits:
            return []
        by_stream: dict[int, list[tuple[int, int]]] = {}
        for op, corr in op_corr:
            if corr is not None:
                by_stream.setdefault(op.stream, []).append((corr, op.op_id))
        for lst in by_stream.values():
            lst.sort()
        deps: set[Dependency] = set()
        for stream, wait_on, record_corr, wait_corr in self.p.stream_waits:
            producers = by_stream.get(wait_on, [])
            consumers = by_stream.get(stream, [])
            i = bisect_right(producers, (record_corr, -1)) - 1
            j = bisect_right(consumers, (wait_corr, 1 << 62))
            if i >= 0 and j < len(consumers):
                deps.add(Dependency(producers[i][1], consumers[j][1], DependencyKind.EVENT))
        return sorted(deps, key=lambda d: (d.before, d.after))


def _note_kind(kinds: dict[int, tuple[int, StreamKind]], stream: int, rank: int, kind: StreamKind) -> None:
    if stream not in kinds or kinds[stream][0] < rank:
        kinds[stream] = (rank, kind)


def _assign_ids(compute: list[ComputeOp], colls: list[CollectiveOp]) -> None:
    """Sort each list by start and number all ops in global start order."""
    compute.sort(key=lambda o: (o.start_us, o.stream))
    colls.sort(key=lambda o: (o.start_us, o.stream))
    merged: list[ComputeOp | CollectiveOp] = sorted([*compute, *colls], key=lambda o: (o.start_us, o.stream))
    for i, op in enumerate(merged):
        op.op_id = i
