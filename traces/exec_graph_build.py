"""Building a rank's :class:`~traces.exec_graph.ExecGraph` from the events the reader kept.

Rules (each one what the trace shows, or a documented guess where it shows less):

- **Launch latency and queue gap.** A replay starts an op at ``max(call + latency,
  ready + gap)``, ``ready`` being when its stream predecessor and its producers ended.
  An op launched while its stream was free (call at or after ``ready``) is
  launch-bound: its latency is its own ``start - call``, its gap ``min(own, median
  gap)``. An op launched while its stream was busy queued: its gap is its own
  ``start - ready`` (the GPU's time between kernels), its latency ``min(own, median
  latency)`` of the launch-bound ops. Either way a replay with measured durations
  starts every op where it started; an op with no launch call keeps its own gap.
- **Inter-stream, heuristic** (only when the trace has no ``cuda_sync`` "Stream Wait
  Event": those are the Workload's EVENT dependencies already). On each CPU thread, a
  ``cudaEventRecord`` records the last GPU op that thread launched before it (its
  stream is the recording stream: the runtime call carries no stream); the next
  ``cudaStreamWaitEvent`` on the thread waits for the latest such record, and the first
  op the thread launches after the wait is the consumer. A pair on one stream adds
  nothing; a pair the trace contradicts (the consumer started before the producer
  ended) is dropped.
- **Inter-stream, waits with no recorded event** (a ``cudaStreamWaitEvent`` with no
  ``cudaEventRecord`` before it on its thread: the trace left the records out). These
  are PyTorch's c10d pattern: before a collective the NCCL stream waits for the
  current stream, and ``work.wait()`` makes the current stream wait for the NCCL
  stream, often on another thread than the one that launched the collective (DDP's
  all-reduce on the autograd thread, the optimizer on the main thread). The waiting
  stream is the stream of the next op the thread launches; the consumer is the first
  op launched on that stream (by any thread) after the wait. The producer is one of
  the last ops launched (by any thread) before the wait on each other stream: of those
  the trace does not contradict, the one that ended last (one per consumer, however
  many waits precede it: the event that bound; the others had finished already, and a
  second producer would be a guess a what-if could wrongly bind). An op with no launch
  call in the trace (launched before the profiler started) counts as launched with its
  stream's previous op.
- **Hand-overs between CPU threads.** ``loss.backward()`` on the thread that calls it
  (the main thread: the one holding the profiler steps, else the busiest) hands the
  backward pass to the autograd engine's thread and blocks until it is done; nothing
  in a trace marks either hand-over, but the autograd thread's work is
  ``autograd::engine::evaluate_function: ...`` and the main thread is silent meanwhile
  (apart from the engine's own work for CPU tensors, which runs on the calling thread
  as ``autograd::``/``torch::autograd::`` ops and is not the main thread's own). So a
  *burst* is a maximal run of another thread's CPU events with no event of the main
  thread's own starting between them; a burst holding an ``evaluate_function`` is a
  backward pass: it starts (``wake``) after the main thread's last own event before
  it, with the measured delay, and the main thread's next own event comes (``return``)
  after the burst's last event ends, with the measured delay. A return the trace
  contradicts (the main thread went on before the burst's last event ended) is
  dropped; a burst with no main event before it (the backward began before the trace)
  gets no wake.
- **Inter-stream, by timing alone** (every trace): an op that started more than 10 us
  later than its known causes allow (its call + the median launch latency; its stream
  predecessor's and producers' ends + the median gap; an op launched before the profiler
  started has no call, and often no recorded wait either) and within 5 us of another
  stream's op ending waited for that op. This catches the waits of the ops the window
  cut off from their calls, and waits the rules above missed.
- **Host synchronisation.** ``cudaStreamSynchronize`` / ``cudaEventSynchronize``: the
  op they waited for is, when a ``cuda_sync`` event names the stream, the last op
  launched on it before the call; otherwise the op launched before the call whose end
  is the latest at or before the call's return. ``cudaDeviceSynchronize`` (and
  "Context Sync") waits for the last op launched on every stream. A launch call of a
  copy to or from pageable memory that returned after its copy ended (a blocking copy)
  waits for that copy. A
  call whose awaited op ended before the call began did not wait: it keeps its own
  duration and returns ``median`` return time after the op in a what-if.
"""

from __future__ import annotations

import math
import re
import statistics
from bisect import bisect_left, bisect_right

from nccl_env.knobs import Algorithm, Protocol
from traces.exec_graph import (
    ExecGraph,
    HandOver,
    HostSync,
    Launch,
    RecordedSettings,
    StepSpan,
    StreamWait,
)
from traces.kineto_events import CPU_AUTOGRAD_EVAL, CPU_PLAIN, GpuOp, HostCall, StepMark, SyncEvent, ThreadEvents
from traces.workload import CollectiveOp, ComputeOp, Dependency

SYNC_TOLERANCE_US = 2.0  # CPU and GPU clocks of one trace agree to about a microsecond
LATE_EVIDENCE_US = 10.0  # an op this much later than its known causes allow waited for something
EVENT_LATENCY_US = 5.0  # a stream released by an event starts within a few microseconds of its producer's end
_STREAM_SYNCS = ("StreamSynchronize", "EventSynchronize")
_DEVICE_SYNCS = ("DeviceSynchronize",)
_ALGO_PROTO_RE = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?:_|\(|$)")

Op = ComputeOp | CollectiveOp


class _ThreadIndex:
    """A CPU thread's key -> its index in ``graph.cpu_threads`` (added on first sight, as ``pid/tid``)."""

    def __init__(self, graph: ExecGraph) -> None:
        self.graph = graph
        self.index: dict[tuple, int] = {}

    def __call__(self, key: tuple) -> int:
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.graph.cpu_threads)
            self.graph.cpu_threads.append(f"{key[0]}/{key[1]}")
        return i


def build_exec_graph(
    made: list[tuple[Op, GpuOp]],
    launch_calls: dict[int, tuple[float, float, tuple]],
    host_calls: list[HostCall],
    sync_events: list[SyncEvent],
    step_marks: list[StepMark],
    dependencies: list[Dependency],
    origin: float,
    thread_events: dict[tuple, ThreadEvents] | None = None,
) -> ExecGraph:
    """The graph of one rank: ``made`` pairs each Workload op with the GPU op it came from;
    ``thread_events`` (every CPU event per thread) gives the hand-overs between threads."""
    graph = ExecGraph()
    thread_of = _ThreadIndex(graph)

    calls: dict[int, tuple[float, float, int]] = {}  # op id -> (call start, call end, thread)
    for op, g in made:
        hit = launch_calls.get(g.correlation) if g.correlation is not None else None
        if hit is not None:
            calls[op.op_id] = (hit[0] - origin, hit[1] - origin, thread_of(hit[2]))
        if isinstance(op, CollectiveOp):
            graph.recorded[op.op_id] = _recorded(g)
    ops = {op.op_id: op for op, _ in made}
    if thread_events:
        graph.hand_overs = _hand_overs(thread_events, step_marks, launch_calls, thread_of, origin)
    has_kineto_waits = any(e.kind == "Stream Wait Event" for e in sync_events)
    if not has_kineto_waits:
        wakes: dict[int, list[float]] = {}
        for h in graph.hand_overs:
            if h.kind == "wake":
                wakes.setdefault(h.thread, []).append(h.resume_us)
        graph.stream_waits = _heuristic_waits(ops, calls, host_calls, thread_of, origin,
                                              {t: sorted(v) for t, v in wakes.items()})
    producers: dict[int, list[int]] = {}
    for d in dependencies:
        producers.setdefault(d.after, []).append(d.before)
    for w in graph.stream_waits:
        producers.setdefault(w.consumer, []).append(w.producer)
    _launch_latencies(graph, ops, calls, producers)
    timed = _timing_waits(graph, ops, calls, producers)
    if timed:
        graph.stream_waits = sorted(graph.stream_waits + timed, key=lambda w: (w.producer, w.consumer))
        for w in timed:
            producers.setdefault(w.consumer, []).append(w.producer)
        graph.launches, graph.gaps = {}, {}
        _launch_latencies(graph, ops, calls, producers)
    graph.syncs = _host_syncs(ops, calls, host_calls, sync_events, made, thread_of, origin)
    graph.steps = _steps(step_marks, thread_of, origin)
    return graph


def build_cpu_graph(collectives: list[tuple[CollectiveOp, tuple, tuple | None]], step_marks: list[StepMark],
                    thread_events: dict[tuple, ThreadEvents] | None, origin: float) -> ExecGraph:
    """The graph of a trace whose collectives all ran on the CPU (a gloo job: no GPU op at all).
    Each collective is its thread's blocking call: an op launched at the call with no latency,
    and a wait of the thread that ends when the op does, so the thread's later calls move with
    the collective's time. A collective a caller handed over to a backend's worker thread
    (``c10d::allreduce_`` -> ``gloo:all_reduce``: its third item, (caller's thread, call time))
    is launched by that call instead, with the measured delay to its start, and where the
    caller's thread had nothing of its own running when it ended, the caller's next event
    waited for it (``work.wait()``; of several ending in one such gap, the last). Steps and
    hand-overs as for any trace."""
    graph = ExecGraph()
    thread_of = _ThreadIndex(graph)

    calls: dict[int, tuple[float, float, tuple]] = {}
    handed: dict[tuple, list[tuple[CollectiveOp, float]]] = {}
    for op, key, issuer in collectives:
        t = thread_of(key)
        if issuer is None:
            graph.launches[op.op_id] = Launch(t, op.start_us, 0.0)
        else:
            call_us = min(issuer[1] - origin, op.start_us)
            graph.launches[op.op_id] = Launch(thread_of(issuer[0]), call_us, op.start_us - call_us)
            handed.setdefault(issuer[0], []).append((op, call_us))
        graph.syncs.append(HostSync(t, op.start_us, op.end_us, (op.op_id,), "cpu collective", 0.0, 0.0))
        calls[op.op_id] = (op.start_us + origin, op.end_us + origin, key)
    for caller, ops in handed.items():
        events = thread_events.get(caller) if thread_events else None
        if events is not None:
            graph.syncs += _caller_waits(thread_of(caller), ops, events, origin)
    graph.syncs.sort(key=lambda s: (s.start_us, s.thread))
    graph.steps = _steps(step_marks, thread_of, origin)
    if thread_events:
        graph.hand_overs = _hand_overs(thread_events, step_marks, calls, thread_of, origin)
    return graph


def _caller_waits(thread: int, ops: list[tuple[CollectiveOp, float]], events: ThreadEvents,
                  origin: float) -> list[HostSync]:
    """The caller's waits for collectives it handed over (each with its hand-over call's time):
    a collective ended while the caller had nothing of its own running (no event begun after
    the hand-over was open; the step's annotation, begun before, is not work), so the caller's
    next event waited for it, from the end of its last event before. Of several collectives
    ending in one such gap, the one that ended last."""
    starts = [a - origin for a in events.starts]
    ends = [b - origin for b in events.ends]
    last_in_gap: dict[int, tuple[CollectiveOp, float]] = {}
    for op, call_us in ops:
        lo, hi = bisect_right(starts, call_us), bisect_right(starts, op.end_us)
        if hi == len(starts) or any(ends[k] > op.end_us for k in range(lo, hi)):
            continue  # the caller never went on after it, or was busy when it ended
        idle_from = max((ends[k] for k in range(lo, hi)), default=call_us)
        if hi not in last_in_gap or op.end_us > last_in_gap[hi][0].end_us:
            last_in_gap[hi] = (op, idle_from)
    return [HostSync(thread, idle_from, starts[i], (op.op_id,), "c10d work wait", 0.0, starts[i] - op.end_us)
            for i, (op, idle_from) in sorted(last_in_gap.items())]


def _main_thread(thread_events: dict[tuple, ThreadEvents], step_marks: list[StepMark],
                 launch_calls: dict[int, tuple[float, float, tuple]]) -> tuple | None:
    """The thread that calls ``backward()``: the one holding the most profiler steps, else the
    one that launched the most GPU ops."""
    count: dict[tuple, int] = {}
    for m in step_marks:
        count[m.thread] = count.get(m.thread, 0) + 1
    if not count:
        for _start, _end, thread in launch_calls.values():
            count[thread] = count.get(thread, 0) + 1
    candidates = [t for t in count if t in thread_events]
    return max(candidates, key=lambda t: (count[t], str(t))) if candidates else None


def _own_starts(events: ThreadEvents) -> list[float]:
    """Starts of a thread's own events: plain ones not nested in the autograd engine's work."""
    engine: list[tuple[float, float]] = []  # merged spans of autograd events on this thread
    for a, b, k in zip(events.starts, events.ends, events.kinds):
        if k != CPU_PLAIN:
            if engine and a <= engine[-1][1]:
                engine[-1] = (engine[-1][0], max(engine[-1][1], b))
            else:
                engine.append((a, b))
    if not engine:
        return [a for a, k in zip(events.starts, events.kinds) if k == CPU_PLAIN]
    ends = [b for _, b in engine]
    out = []
    for a, k in zip(events.starts, events.kinds):
        if k != CPU_PLAIN:
            continue
        i = bisect_left(ends, a)  # the first engine span ending at or after a
        if i < len(engine) and engine[i][0] <= a:
            continue  # nested in the engine's work
        out.append(a)
    return out


def _hand_overs(thread_events: dict[tuple, ThreadEvents], step_marks: list[StepMark],
                launch_calls: dict[int, tuple[float, float, tuple]], thread_of, origin: float) -> list[HandOver]:
    """Backward-pass bursts on autograd threads and their wake/return edges (module docstring)."""
    main = _main_thread(thread_events, step_marks, launch_calls)
    if main is None:
        return []
    own = _own_starts(thread_events[main])
    out: list[HandOver] = []
    for key, ev in thread_events.items():
        if key == main or CPU_AUTOGRAD_EVAL not in ev.kinds:
            continue
        starts, ends, kinds = ev.starts, ev.ends, ev.kinds
        n = len(starts)
        idle_since: float | None = None  # the latest end of this thread's events so far
        i = 0
        while i < n:
            j = bisect_right(own, starts[i])  # own[j - 1]: the main thread's last own event at or before
            limit = own[j] if j < len(own) else math.inf
            k, last_end = i, ends[i]
            while k + 1 < n and starts[k + 1] < limit:
                k += 1
                last_end = max(last_end, ends[k])
            if j > 0 and CPU_AUTOGRAD_EVAL in kinds[i:k + 1]:
                before = own[j - 1]
                out.append(HandOver(thread_of(key), None if idle_since is None else min(idle_since, starts[i]) - origin,
                                    starts[i] - origin, thread_of(main), before - origin, "wake"))
                if limit != math.inf and last_end <= limit:
                    out.append(HandOver(thread_of(main), before - origin, limit - origin, thread_of(key),
                                        last_end - origin, "return"))
            idle_since = last_end if idle_since is None else max(idle_since, last_end)
            i = k + 1
    out.sort(key=lambda h: (h.resume_us, h.thread))
    return out


def _recorded(g: GpuOp) -> RecordedSettings:
    grid_ctas = g.grid[0] * g.grid[1] * g.grid[2] if g.grid else None  # one CTA per channel
    block_threads = g.block[0] * g.block[1] * g.block[2] if g.block else None
    m = _ALGO_PROTO_RE.search(g.name)
    if m is None or m.group(2) == "LL":  # NCCL's generic kernels are all named ..._LL: not evidence
        return RecordedSettings(grid_ctas or None, block_threads or None)
    return RecordedSettings(grid_ctas or None, block_threads or None, Algorithm[m.group(1)], Protocol[m.group(2)])


def _launch_latencies(graph: ExecGraph, ops: dict[int, Op], calls: dict, producers: dict[int, list[int]]) -> None:
    by_stream: dict[int, list[Op]] = {}
    for op in ops.values():
        by_stream.setdefault(op.stream, []).append(op)
    launch_bound: dict[int, float] = {}  # op id -> own latency (its stream was free at the call)
    stream_bound: dict[int, float] = {}  # op id -> own gap after its stream and producers were done
    for stream_ops in by_stream.values():
        stream_ops.sort(key=lambda o: (o.start_us, o.op_id))
        prev_end = None
        for op in stream_ops:
            ready = prev_end
            for p in producers.get(op.op_id, ()):
                if p in ops:
                    ready = ops[p].end_us if ready is None else max(ready, ops[p].end_us)
            prev_end = op.end_us if prev_end is None else max(prev_end, op.end_us)
            call = calls.get(op.op_id)
            if call is not None and (ready is None or call[0] >= ready):
                launch_bound[op.op_id] = op.start_us - call[0]
                if ready is not None:
                    graph.gaps[op.op_id] = op.start_us - ready
            elif ready is not None:
                stream_bound[op.op_id] = op.start_us - ready
    graph.median_latency_us = statistics.median(launch_bound.values()) if launch_bound else 0.0
    graph.median_gap_us = max(0.0, statistics.median(stream_bound.values())) if stream_bound else 0.0
    for op_id, gap in stream_bound.items():
        graph.gaps[op_id] = gap
    for op_id, gap in list(graph.gaps.items()):
        if op_id in launch_bound:
            graph.gaps[op_id] = min(gap, graph.median_gap_us)
    for op_id, (call_us, _end, thread) in calls.items():
        own = ops[op_id].start_us - call_us
        latency = own if op_id in launch_bound else min(own, graph.median_latency_us)
        graph.launches[op_id] = Launch(thread, call_us, latency)


def _heuristic_waits(ops: dict[int, Op], calls: dict, host_calls: list[HostCall], thread_of,
                     origin: float, wakes: dict[int, list[float]]) -> list[StreamWait]:
    """Record/wait pairs, and waits with no recorded event, on each CPU thread (see the module
    docstring). ``wakes``: per thread, when its bursts of work began (hand-overs)."""
    timeline: dict[int, list[tuple[float, int, object]]] = {}  # thread -> (time, order, item)
    for op_id, (start, _end, thread) in calls.items():
        timeline.setdefault(thread, []).append((start, 1, op_id))
    launched = _launch_order(ops, calls)
    any_thread = sorted((c[0], op_id) for op_id, c in calls.items())  # every launch, by call time
    wait_times: list[float] = []
    for call in host_calls:
        if call.name.endswith("EventRecord") or call.name.endswith("StreamWaitEvent"):
            timeline.setdefault(thread_of(call.thread), []).append((call.ts - origin, 0, call.name))
            if call.name.endswith("StreamWaitEvent"):
                wait_times.append(call.ts - origin)
    last_on_stream = _last_launched_per_stream(ops, launched, wait_times)
    waits: dict[tuple[int, int], str] = {}

    def add(producer_id: int, consumer_id: int, source: str) -> None:
        producer, consumer = ops[producer_id], ops[consumer_id]
        if producer.stream != consumer.stream and producer.end_us <= consumer.start_us + SYNC_TOLERANCE_US:
            waits.setdefault((producer_id, consumer_id), source)

    def first_elsewhere(after_us: float, producer_id: int) -> int | None:
        """The first op launched after ``after_us``, by any thread, on another stream than the producer's."""
        stream = ops[producer_id].stream
        for _call, op_id in any_thread[bisect_right(any_thread, (after_us, math.inf)):]:
            if ops[op_id].stream != stream:
                return op_id
        return None

    for thread, items in timeline.items():
        items.sort(key=lambda x: (x[0], x[1]))
        thread_wakes = wakes.get(thread, [])
        last_launched: int | None = None
        recorded: int | None = None
        pending: list[tuple[float, int]] = []  # (wait time, producer): waits no launch has consumed yet
        unrecorded: list[float] = []  # times of waits whose event the trace does not show
        for t, _order, item in items:
            if isinstance(item, int):  # a launch
                op_id = item
                keep = []
                for wait_us, producer_id in pending:
                    if ops[producer_id].stream == ops[op_id].stream:
                        keep.append((wait_us, producer_id))  # a stream never waits on its own event
                    elif bisect_right(thread_wakes, wait_us) != bisect_right(thread_wakes, t):
                        consumer = first_elsewhere(wait_us, producer_id)  # the thread slept in between
                        if consumer is not None:
                            add(producer_id, consumer, "record/wait")
                    else:
                        add(producer_id, op_id, "record/wait")
                pending = keep
                stream = launched[ops[op_id].stream]
                # the waiting stream is this op's: its first op after each wait
                by_consumer: dict[int, list[float]] = {}
                for wait_us in unrecorded:
                    by_consumer.setdefault(stream[bisect_left(stream, (wait_us, -1))][1], []).append(wait_us)
                for consumer_id, wait_list in by_consumer.items():
                    found = _unrecorded_producer(ops, consumer_id, wait_list, last_on_stream)
                    if found is not None:
                        add(found, consumer_id, "unrecorded wait")
                unrecorded = []
                last_launched = op_id
            elif str(item).endswith("EventRecord"):
                recorded = last_launched
            elif recorded is not None:
                pending.append((t, recorded))
            else:
                unrecorded.append(t)
        for wait_us, producer_id in pending:  # the thread launched nothing elsewhere after them
            consumer = first_elsewhere(wait_us, producer_id)
            if consumer is not None:
                add(producer_id, consumer, "record/wait")
    return [StreamWait(p, c, source) for (p, c), source in sorted(waits.items())]


def _timing_waits(graph: ExecGraph, ops: dict[int, Op], calls: dict,
                  producers: dict[int, list[int]]) -> list[StreamWait]:
    """Waits the trace shows only by their timing: an op that started more than
    LATE_EVIDENCE_US after its known causes allow (its call + the median latency, its stream
    predecessor's and producers' ends + the median gap; an op launched before the trace has
    no call) and within EVENT_LATENCY_US of another stream's op ending waited for that op."""
    by_end = sorted((o.end_us, o.op_id) for o in ops.values())
    end_times = [e for e, _ in by_end]
    prev_end: dict[int, float] = {}
    out: list[StreamWait] = []
    for op in sorted(ops.values(), key=lambda o: (o.start_us, o.op_id)):
        bounds = [ops[p].end_us + graph.median_gap_us for p in producers.get(op.op_id, ()) if p in ops]
        if op.stream in prev_end:
            bounds.append(prev_end[op.stream] + graph.median_gap_us)
        prev_end[op.stream] = max(prev_end.get(op.stream, op.end_us), op.end_us)
        call = calls.get(op.op_id)
        if call is not None:
            bounds.append(call[0] + graph.median_latency_us)
        if bounds and op.start_us - max(bounds) <= LATE_EVIDENCE_US:
            continue
        i = bisect_right(end_times, op.start_us + SYNC_TOLERANCE_US) - 1
        while i >= 0 and end_times[i] >= op.start_us - EVENT_LATENCY_US:
            producer = ops[by_end[i][1]]
            if producer.stream != op.stream and producer.start_us < op.start_us:
                out.append(StreamWait(producer.op_id, op.op_id, "timing"))
                break
            i -= 1
    return out


def _unrecorded_producer(ops: dict[int, Op], consumer_id: int, wait_list: list[float],
                         last_on_stream: dict[float, dict[int, int]]) -> int | None:
    """Of the other streams' last ops launched before the consumer's waits, the latest-ending one
    the trace does not contradict (it ended by the consumer's start): the event that bound."""
    consumer = ops[consumer_id]
    candidates = [op_id for wait_us in wait_list for stream, op_id in last_on_stream[wait_us].items()
                  if stream != consumer.stream and ops[op_id].end_us <= consumer.start_us + SYNC_TOLERANCE_US]
    return max(candidates, key=lambda o: (ops[o].end_us, o)) if candidates else None


def _launch_order(ops: dict[int, Op], calls: dict) -> dict[int, list[tuple[float, int]]]:
    """Stream -> (launch call start, op id) in stream order, any thread. An op with no launch call
    in the trace (launched before the profiler started, or by a call it did not record) counts
    as launched with the stream's previous op (before the trace: ``-inf``)."""
    by_stream: dict[int, list[Op]] = {}
    for op in ops.values():
        by_stream.setdefault(op.stream, []).append(op)
    out: dict[int, list[tuple[float, int]]] = {}
    for stream, stream_ops in by_stream.items():
        stream_ops.sort(key=lambda o: (o.start_us, o.op_id))
        call_us = -math.inf
        out[stream] = []
        for op in stream_ops:
            call = calls.get(op.op_id)
            call_us = max(call_us, call[0]) if call is not None else call_us
            out[stream].append((call_us, op.op_id))
        out[stream].sort()
    return out


def _last_launched_per_stream(ops: dict[int, Op], launched: dict[int, list[tuple[float, int]]],
                              times: list[float]) -> dict[float, dict[int, int]]:
    """For each time: stream -> the op whose launch call (on any thread) started last before it."""
    out: dict[float, dict[int, int]] = {}
    for t in set(times):
        last: dict[int, int] = {}
        for stream, stream_launches in launched.items():
            i = bisect_left(stream_launches, (t, -1))
            if i:
                last[stream] = stream_launches[i - 1][1]
        out[t] = last
    return out


class _MaxFenwick:
    """Inserted ranks 0..n-1; ``largest_at_most(r)``: the largest inserted rank <= r (-1: none)."""

    def __init__(self, n: int) -> None:
        self._tree = [-1] * (n + 1)

    def insert(self, rank: int) -> None:
        i = rank + 1
        while i < len(self._tree):
            if self._tree[i] < rank:
                self._tree[i] = rank
            i += i & -i

    def largest_at_most(self, rank: int) -> int:
        best, i = -1, rank + 1
        while i > 0:
            if self._tree[i] > best:
                best = self._tree[i]
            i -= i & -i
        return best


def _host_syncs(ops: dict[int, Op], calls: dict, host_calls: list[HostCall], sync_events: list[SyncEvent],
                made: list[tuple[Op, GpuOp]], thread_of, origin: float) -> list[HostSync]:
    """One sweep over launches and host calls in time order (module docstring for the rules)."""
    launched = sorted((c[0], op_id) for op_id, c in calls.items())  # by launch call start
    by_end = sorted(launched, key=lambda x: (ops[x[1]].end_us, x[1]))
    end_rank = {op_id: r for r, (_, op_id) in enumerate(by_end)}
    end_times = [ops[op_id].end_us for _, op_id in by_end]
    inserted = _MaxFenwick(len(by_end))
    last_on_stream: dict[int, int] = {}  # stream -> the latest-ending op launched on it so far
    sync_stream = {e.correlation: e.stream for e in sync_events if e.correlation is not None
                   and e.kind != "Stream Wait Event"}
    wanted = [c for c in host_calls if c.name.endswith(_STREAM_SYNCS) or c.name.endswith(_DEVICE_SYNCS)
              or c.name.endswith("Memcpy")]
    wanted.sort(key=lambda c: c.ts)
    raw: list[tuple[int, float, float, tuple[int, ...], str]] = []
    k = 0
    for call in wanted:
        name = call.name
        start, end = call.ts - origin, call.end - origin
        while k < len(launched) and launched[k][0] < start:
            op_id = launched[k][1]
            inserted.insert(end_rank[op_id])
            s = ops[op_id].stream
            if s not in last_on_stream or ops[op_id].end_us > ops[last_on_stream[s]].end_us:
                last_on_stream[s] = op_id
            k += 1
        if k == 0:
            continue
        if name.endswith(_DEVICE_SYNCS):
            awaited = tuple(sorted(last_on_stream.values()))
        else:
            stream = sync_stream.get(call.correlation) if call.correlation is not None else None
            if stream is not None and stream >= 0 and stream in last_on_stream:
                awaited = (last_on_stream[stream],)
            else:
                r = inserted.largest_at_most(bisect_right(end_times, end + SYNC_TOLERANCE_US) - 1)
                if r < 0:
                    continue
                awaited = (by_end[r][1],)
        raw.append((thread_of(call.thread), start, end, awaited, name))
    for op, _g in made:  # blocking copies: the launch call returned after its copy ended
        c = calls.get(op.op_id)
        if c is not None and isinstance(op, ComputeOp) and "Pageable" in op.name and c[1] >= op.end_us:
            raw.append((c[2], c[0], c[1], (op.op_id,), "blocking copy"))
    waited_returns = []
    for _thread, start, end, awaited, _name in raw:
        latest = max(ops[o].end_us for o in awaited)
        if latest > start:
            waited_returns.append(end - latest)
    median_return = max(0.0, statistics.median(waited_returns)) if waited_returns else 0.0
    out = []
    for thread, start, end, awaited, name in raw:
        latest = max(ops[o].end_us for o in awaited)
        if latest > start:  # it waited: its end is the GPU's end plus the measured tail
            out.append(HostSync(thread, start, end, awaited, name, 0.0, end - latest))
        else:  # it did not wait: own duration; were the op later, it would return a median tail after it
            out.append(HostSync(thread, start, end, awaited, name, end - start, min(median_return, end - latest)))
    out.sort(key=lambda s: (s.start_us, s.thread))
    return out


def _steps(marks: list[StepMark], thread_of, origin: float) -> list[StepSpan]:
    """One span per step annotation on the thread that holds the most of them; an annotation
    that starts inside the step of its name is that step (kept once). A name used again for a
    later step (two profiler sessions in one trace, a writer that restarts its count) is a
    step of its own, named apart: ``repeated_step_name`` (issue 32: it was merged into the
    first's period)."""
    if not marks:
        return []
    count: dict[tuple, int] = {}
    for m in marks:
        count[m.thread] = count.get(m.thread, 0) + 1
    main = max(count, key=lambda t: (count[t], -min(m.ts for m in marks if m.thread == t)))
    uses: dict[str, int] = {}
    last_end: dict[str, float] = {}  # per name, the end of its latest step
    out = []
    for m in sorted((m for m in marks if m.thread == main), key=lambda m: m.ts):
        if m.ts < last_end.get(m.name, -math.inf):  # inside the step of that name: the same step
            continue
        last_end[m.name] = m.end
        uses[m.name] = uses.get(m.name, 0) + 1
        name = m.name if uses[m.name] == 1 else repeated_step_name(m.name, uses[m.name])
        out.append(StepSpan(name, thread_of(m.thread), m.ts - origin, m.end - origin))
    return out


def repeated_step_name(name: str, use: int) -> str:
    """The name of the ``use``-th step (from 2) annotated ``name``."""
    return f"{name} (repeat {use})"
