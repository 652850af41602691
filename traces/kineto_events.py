"""One pass over a Kineto trace's events, keeping only what a Workload needs.

:class:`EventReader` is fed chunks of events (see :mod:`traces.kineto_json`) and
keeps compact records: GPU ops (kernels, memcpy, memset) with their launch shape,
the CPU launch call of each correlation id (in flat arrays), CPU comm calls with
their args, profiler steps and CUDA stream-wait events; for the execution graph
(:mod:`traces.exec_graph_build`) also the host calls that order streams or block the
CPU (:data:`HOST_CALL_NAMES`), every ``cuda_sync`` event and the named profiler steps
with their thread. Malformed events (missing or
non-numeric ``ts``/``dur``, negative ``dur``, non-string ``cat``/``name``) are skipped,
as HTA's parser drops rows without ``dur``; wrongly typed args read as absent.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from traces.comm_names import is_comm_call, is_comm_kernel

# Event categories, current and legacy spellings (Kineto renamed them in 2021).
KERNEL, MEMCPY, MEMSET, RUNTIME, CPU, GPU_ANNOTATION, SYNC = range(7)
CATEGORY = {
    "kernel": KERNEL,
    "gpu_memcpy": MEMCPY,
    "memcpy": MEMCPY,
    "gpu_memset": MEMSET,
    "memset": MEMSET,
    "cuda_runtime": RUNTIME,
    "cuda_driver": RUNTIME,
    "runtime": RUNTIME,
    "hip_runtime": RUNTIME,
    "cpu_op": CPU,
    "operator": CPU,
    "user_annotation": CPU,
    "gpu_user_annotation": GPU_ANNOTATION,
    "cuda_sync": SYNC,
}
_INT64 = 1 << 63
# The longest event name kept whole: the longest in the shared and test traces is 5,123 characters (a
# demangled template kernel in a100_alexnet_cuda_sync); past 16,384 a name is cut there, with one warning
# (a 1 GB name kept analyze busy past 300 s).
MAX_NAME_CHARS = 16_384
_COMM_CALL_FIRST = frozenset("rngmuc")  # first letters of record_param_comms, nccl:, gloo:, mpi:, ucc:, c10d::


@dataclass(slots=True)
class GpuOp:
    ts: float
    dur: float
    name: str
    stream: int
    correlation: int | None
    is_comm: bool
    is_memory: bool
    grid: tuple[int, int, int] | None
    block: tuple[int, int, int] | None
    blocks_per_sm: float | None
    registers: int | None
    shared_memory: int | None
    occupancy: float | None
    args: dict | None  # kept for communication kernels only (their metadata)


@dataclass(slots=True)
class CommCall:
    """A CPU-side comm call: record_param_comms, nccl:/gloo: annotation or c10d:: op."""

    ts: float
    end: float
    name: str
    args: dict
    thread: tuple


# Runtime calls the execution graph needs by name: they block the CPU thread until the GPU
# catches up, or order one stream after another (CUDA and HIP spellings).
HOST_CALL_NAMES = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaEventRecord",
    "cudaStreamWaitEvent", "cudaMemcpy", "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
    "hipEventRecord", "hipStreamWaitEvent", "hipMemcpy",
})


@dataclass(slots=True)
class HostCall:
    """A runtime call from :data:`HOST_CALL_NAMES`, as the CPU thread saw it."""

    ts: float
    end: float
    name: str
    correlation: int | None
    thread: tuple


@dataclass(slots=True)
class SyncEvent:
    """A ``cuda_sync`` event (Stream Wait Event, Stream Sync, Event Sync, Context Sync)."""

    kind: str
    correlation: int | None  # of the runtime call that caused it
    stream: int | None  # the waiting stream (Stream Wait Event) or the synchronised one


# CPU events the hand-over rule (traces.exec_graph_build) reads by name: the autograd engine's
# work, on its own thread (one per device) or, for CPU tensors, on the thread that called backward().
AUTOGRAD_PREFIXES = ("autograd::engine::evaluate_function", "torch::autograd::")
CPU_PLAIN, CPU_AUTOGRAD_EVAL, CPU_AUTOGRAD_OTHER = 0, 1, 2  # ThreadEvents.kind


@dataclass(slots=True)
class ThreadEvents:
    """Every CPU event of one thread (cpu_op, user_annotation, runtime call), in trace order:
    start, end and kind (CPU_PLAIN, CPU_AUTOGRAD_EVAL, CPU_AUTOGRAD_OTHER)."""

    starts: array
    ends: array
    kinds: array


@dataclass(slots=True)
class StepMark:
    """A ``ProfilerStep#N`` annotation on its CPU thread."""

    name: str
    ts: float
    end: float
    thread: tuple


class EventReader:
    """Accumulates the records of every chunk fed to it; ``time_scale``: what each ``ts`` and
    ``dur`` is multiplied by to be microseconds (1e-3: a trace whose times are nanoseconds,
    :mod:`traces.time_units`)."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self.gpu_ops: list[GpuOp] = []
        self.comm_calls: list[CommCall] = []
        self.comm_by_ext: dict[int, CommCall] = {}
        self.steps: list[tuple[float, float]] = []
        # (waiting stream, producer stream, cudaEventRecord correlation, cudaStreamWaitEvent correlation)
        self.stream_waits: list[tuple[int, int, int, int]] = []
        self.host_calls: list[HostCall] = []
        self.sync_events: list[SyncEvent] = []
        self.step_marks: list[StepMark] = []
        self.min_ts = math.inf
        # CPU runtime calls, flat: correlation, start, end, thread index.
        self._rt_corr = array("q")
        self._rt_ts = array("d")
        self._rt_end = array("d")
        self._rt_thread = array("l")
        self._threads: dict[tuple, int] = {}
        self._names: dict[str, str] = {}  # one string object per distinct kernel name
        # Every CPU event, flat: start, end, thread index, kind (the execution graph's thread chains).
        self._cpu_ts = array("d")
        self._cpu_end = array("d")
        self._cpu_thread = array("l")
        self._cpu_kind = array("b")
        # Events of a kind the reader keeps whose time cannot be (no ts, a negative duration): dropped,
        # counted; the first is described (traces.kineto refuses a trace where they are many).
        self.bad_events = 0
        self.first_bad: str | None = None
        self._fed = 0  # events fed before this chunk: the first bad one's index in traceEvents
        self.long_names = 0  # names cut to MAX_NAME_CHARS
        self.first_long: str | None = None

    def timed_events(self) -> int:
        """Events kept with their times (GPU ops, CPU and runtime calls)."""
        return len(self.gpu_ops) + len(self._cpu_ts)

    def _bad(self, events: list, e: dict) -> None:
        cat = e.get("cat")
        if type(cat) is not str or cat == "Trace" or CATEGORY.get(cat, CATEGORY.get(cat.lower(), -1)) == -1:
            return  # a kind the reader does not use: nothing of it is lost
        self.bad_events += 1
        if self.first_bad is None:
            index = self._fed + next(i for i, x in enumerate(events) if x is e)
            name = str(e.get("name"))
            name = name if len(name) <= 48 else name[:45] + "..."
            times = " ".join(f"{k}={e[k]!r}" if k in e else f"no {k}" for k in ("ts", "dur"))
            self.first_bad = f"traceEvents[{index:,}] {cat} {name!r} {times}"

    def _cut(self, events: list, e: dict, name: str) -> str:
        """``name`` cut to :data:`MAX_NAME_CHARS`, counted; the first such event described."""
        self.long_names += 1
        if self.first_long is None:
            index = self._fed + next(i for i, x in enumerate(events) if x is e)
            self.first_long = f"traceEvents[{index:,}] {e.get('cat')} {name[:45]!r}... ({len(name):,} characters)"
        return name[:MAX_NAME_CHARS]

    def feed(self, events: list) -> None:
        category = CATEGORY
        gpu_ops = self.gpu_ops
        names = self._names
        rt_corr, rt_ts, rt_end, rt_thread = self._rt_corr, self._rt_ts, self._rt_end, self._rt_thread
        cpu_ts, cpu_end, cpu_thread, cpu_kind = self._cpu_ts, self._cpu_end, self._cpu_thread, self._cpu_kind
        thread_ids = self._threads
        min_ts = self.min_ts
        scale = self.time_scale
        for e in events:
            if type(e) is not dict:
                continue
            # Like HTA, an event counts when it has a duration (complete "X" events do).
            dur = e.get("dur")
            if dur is None:
                continue
            ts = e.get("ts")
            if not (type(ts) is int or type(ts) is float) or not (type(dur) is int or type(dur) is float) or dur < 0:
                self._bad(events, e)
                continue
            if scale != 1.0:
                ts, dur = ts * scale, dur * scale
            cat = e.get("cat")
            name = e.get("name")
            if type(cat) is not str or type(name) is not str or cat == "Trace":
                continue
            if len(name) > MAX_NAME_CHARS:
                name = self._cut(events, e, name)
            kind = category.get(cat)
            if kind is None:
                kind = category.get(cat.lower(), -1)
            if ts < min_ts:
                min_ts = ts
            args = e.get("args")
            if type(args) is not dict:
                args = {}
            if kind in (KERNEL, MEMCPY, MEMSET):
                stream = args.get("stream")
                if type(stream) is not int:
                    stream = to_int(stream)
                    if stream is None:
                        continue
                corr = args.get("correlation")
                if type(corr) is not int:
                    corr = to_int(corr)
                name = names.setdefault(name, name)
                comm = kind == KERNEL and is_comm_kernel(name)
                gpu_ops.append(
                    GpuOp(
                        ts, dur, name, stream, corr, comm, kind != KERNEL,
                        to_triple(args.get("grid")), to_triple(args.get("block")), to_num(args.get("blocks per SM")),
                        to_int(args.get("registers per thread")), to_int(args.get("shared memory")),
                        to_num(args.get("est. achieved occupancy %")), args if comm else None,
                    )
                )
            elif kind == RUNTIME:
                corr = args.get("correlation")
                if type(corr) is not int:
                    corr = to_int(corr)
                if corr is not None and -_INT64 <= corr < _INT64:
                    thread = (e.get("pid"), e.get("tid"))
                    index = thread_ids.get(thread) if type(thread[0]) is int and type(thread[1]) is int else None
                    if index is None:
                        thread = thread_key(e)
                        index = thread_ids.setdefault(thread, len(thread_ids))
                    rt_corr.append(corr)
                    rt_ts.append(ts)
                    rt_end.append(ts + dur)
                    rt_thread.append(index)
                    cpu_ts.append(ts)
                    cpu_end.append(ts + dur)
                    cpu_thread.append(index)
                    cpu_kind.append(CPU_PLAIN)
                    if name in HOST_CALL_NAMES:
                        self.host_calls.append(HostCall(ts, ts + dur, name, corr, thread))
            elif kind == CPU:
                thread = thread_key(e)
                index = thread_ids.get(thread)
                if index is None:
                    index = thread_ids.setdefault(thread, len(thread_ids))
                cpu_ts.append(ts)
                cpu_end.append(ts + dur)
                cpu_thread.append(index)
                first = name[:1]
                if first == "a" and name.startswith(AUTOGRAD_PREFIXES[0]):
                    cpu_kind.append(CPU_AUTOGRAD_EVAL)
                elif first == "t" and name.startswith(AUTOGRAD_PREFIXES[1]):
                    cpu_kind.append(CPU_AUTOGRAD_OTHER)
                else:
                    cpu_kind.append(CPU_PLAIN)
                if first == "P" and name.startswith("ProfilerStep"):
                    self.steps.append((ts, ts + dur))
                    self.step_marks.append(StepMark(name, ts, ts + dur, thread_key(e)))
                elif first in _COMM_CALL_FIRST and is_comm_call(name):
                    call = CommCall(ts, ts + dur, name, args, thread_key(e))
                    self.comm_calls.append(call)
                    ext = to_int(args.get("External id"))
                    if ext is not None and name == "record_param_comms":
                        self.comm_by_ext[ext] = call
            elif kind == SYNC:
                wait_on = to_int(args.get("wait_on_stream"))
                record_corr = to_int(args.get("wait_on_cuda_event_record_corr_id"))
                stream = to_int(args.get("stream"))
                corr = to_int(args.get("correlation"))
                if (wait_on is not None and wait_on >= 0 and record_corr is not None and stream is not None
                        and corr is not None):
                    self.stream_waits.append((stream, wait_on, record_corr, corr))
                self.sync_events.append(SyncEvent(name, corr, stream))
        self.min_ts = min_ts
        self._fed += len(events)

    def launches(self) -> tuple[dict[int, float], dict[int, tuple[float, float, tuple]]]:
        """(correlation -> earliest launch time) for every GPU op, and (correlation -> (start,
        end, thread)) of the launch of every communication kernel and memory copy (a copy
        launched inside a collective's CPU call is NCCL's copy-engine path)."""
        wanted = {g.correlation for g in self.gpu_ops if g.correlation is not None}
        comm = {g.correlation for g in self.gpu_ops if (g.is_comm or g.is_memory) and g.correlation is not None}
        thread_ids = {i: t for t, i in self._threads.items()}
        launch_ts: dict[int, float] = {}
        launch_thread: dict[int, tuple[float, float, tuple]] = {}
        rt_ts, rt_end, rt_thread = self._rt_ts, self._rt_end, self._rt_thread
        for i, corr in enumerate(self._rt_corr):
            if corr in wanted:
                ts = rt_ts[i]
                prev = launch_ts.get(corr)
                if prev is None or ts < prev:
                    launch_ts[corr] = ts
                if corr in comm:
                    launch_thread[corr] = (ts, rt_end[i], thread_ids[rt_thread[i]])
        return launch_ts, launch_thread


    def launch_calls(self) -> dict[int, tuple[float, float, tuple]]:
        """Correlation -> (start, end, thread) of the earliest runtime call with that
        correlation, for every GPU op's correlation (the execution graph's launch edges)."""
        wanted = {g.correlation for g in self.gpu_ops if g.correlation is not None}
        thread_ids = {i: t for t, i in self._threads.items()}
        out: dict[int, tuple[float, float, tuple]] = {}
        rt_ts, rt_end, rt_thread = self._rt_ts, self._rt_end, self._rt_thread
        for i, corr in enumerate(self._rt_corr):
            if corr in wanted:
                prev = out.get(corr)
                if prev is None or rt_ts[i] < prev[0]:
                    out[corr] = (rt_ts[i], rt_end[i], thread_ids[rt_thread[i]])
        return out


    def thread_events(self) -> dict[tuple, ThreadEvents]:
        """Thread key -> its CPU events sorted by start (runtime calls with a correlation id,
        cpu_ops and user annotations)."""
        per: dict[int, list[int]] = {}
        for i, t in enumerate(self._cpu_thread):
            per.setdefault(t, []).append(i)
        keys = {i: t for t, i in self._threads.items()}
        out: dict[tuple, ThreadEvents] = {}
        ts, end, kind = self._cpu_ts, self._cpu_end, self._cpu_kind
        for t, idx in per.items():
            idx.sort(key=ts.__getitem__)
            out[keys[t]] = ThreadEvents(array("d", (ts[i] for i in idx)), array("d", (end[i] for i in idx)),
                                        array("b", (kind[i] for i in idx)))
        return out


def thread_key(event: dict) -> tuple:
    """(pid, tid) as a hashable key, whatever types the trace used."""
    pid, tid = event.get("pid"), event.get("tid")
    return (pid if isinstance(pid, (int, str)) else repr(pid), tid if isinstance(tid, (int, str)) else repr(tid))


def to_int(value: object) -> int | None:
    """An int from an int, an integral float or a decimal string; None otherwise."""
    if type(value) is int:
        return value
    if type(value) is float:
        return int(value) if value == value and value not in (math.inf, -math.inf) and value == int(value) else None
    if type(value) is str:
        try:
            return int(value)
        except ValueError:
            return None
    return None


def to_num(value: object) -> float | None:
    if (type(value) is int or type(value) is float) and value == value and abs(value) != math.inf:
        return float(value)
    return None


def to_triple(value: object) -> tuple[int, int, int] | None:
    if type(value) is list and len(value) == 3:
        a, b, c = value
        if type(a) is int and type(b) is int and type(c) is int and a >= 0 and b >= 0 and c >= 0:
            return (a, b, c)
        x, y, z = (to_int(v) for v in value)
        if x is not None and x >= 0 and y is not None and y >= 0 and z is not None and z >= 0:
            return (x, y, z)
    return None
