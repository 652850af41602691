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
from bisect import bisect_left

from nccl_env.knobs import Algorithm, Protocol
from traces.exec_graph import (
    ExecGraph,
    HostSync,
    Launch,
    RecordedSettings,
    StepSpan,
    StreamWait,
)
from traces.kineto_events import GpuOp, HostCall, StepMark, SyncEvent
from traces.workload import CollectiveOp, ComputeOp, Dependency

SYNC_TOLERANCE_US = 2.0  # CPU and GPU clocks of one trace agree to about a microsecond
_STREAM_SYNCS = ("StreamSynchronize", "EventSynchronize")
_DEVICE_SYNCS = ("DeviceSynchronize",)
_ALGO_PROTO_RE = re.compile(r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?:_|\(|$)")

Op = ComputeOp | CollectiveOp


def build_exec_graph(
    made: list[tuple[Op, GpuOp]],
    launch_calls: dict[int, tuple[float, float, tuple]],
    host_calls: list[HostCall],
    sync_events: list[SyncEvent],
    step_marks: list[StepMark],
    dependencies: list[Dependency],
    origin: float,
) -> ExecGraph:
    """The graph of one rank: ``made`` pairs each Workload op with the GPU op it came from."""
    graph = ExecGraph()
    thread_index: dict[tuple, int] = {}

    def thread_of(key: tuple) -> int:
        i = thread_index.get(key)
        if i is None:
            i = thread_index[key] = len(graph.threads)
            graph.threads.append(f"{key[0]}/{key[1]}")
        return i

    calls: dict[int, tuple[float, float, int]] = {}  # op id -> (call start, call end, thread)
    for op, g in made:
        hit = launch_calls.get(g.correlation) if g.correlation is not None else None
        if hit is not None:
            calls[op.op_id] = (hit[0] - origin, hit[1] - origin, thread_of(hit[2]))
        if isinstance(op, CollectiveOp):
            graph.recorded[op.op_id] = _recorded(g)
    ops = {op.op_id: op for op, _ in made}
    has_kineto_waits = any(e.kind == "Stream Wait Event" for e in sync_events)
    if not has_kineto_waits:
        graph.stream_waits = _heuristic_waits(ops, calls, host_calls, thread_of, origin)
    producers: dict[int, list[int]] = {}
    for d in dependencies:
        producers.setdefault(d.after, []).append(d.before)
    for w in graph.stream_waits:
        producers.setdefault(w.consumer, []).append(w.producer)
    _launch_latencies(graph, ops, calls, producers)
    graph.syncs = _host_syncs(ops, calls, host_calls, sync_events, made, thread_of, origin)
    graph.steps = _steps(step_marks, thread_of, origin)
    return graph


def _recorded(g: GpuOp) -> RecordedSettings:
    channels = g.grid[0] * g.grid[1] * g.grid[2] if g.grid else None
    threads = g.block[0] * g.block[1] * g.block[2] if g.block else None
    m = _ALGO_PROTO_RE.search(g.name)
    if m is None or m.group(2) == "LL":  # NCCL's generic kernels are all named ..._LL: not evidence
        return RecordedSettings(channels or None, threads or None)
    return RecordedSettings(channels or None, threads or None, Algorithm[m.group(1)], Protocol[m.group(2)])


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
                     origin: float) -> list[StreamWait]:
    """Record/wait pairs, and waits with no recorded event, on each CPU thread (see the module docstring)."""
    timeline: dict[int, list[tuple[float, int, object]]] = {}  # thread -> (time, order, item)
    for op_id, (start, _end, thread) in calls.items():
        timeline.setdefault(thread, []).append((start, 1, op_id))
    launched = _launch_order(ops, calls)
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

    for items in timeline.values():
        items.sort(key=lambda x: (x[0], x[1]))
        last_launched: int | None = None
        recorded: int | None = None
        waiting_on: int | None = None  # a recorded event the thread's next launch waits for
        unrecorded: list[float] = []  # times of waits whose event the trace does not show
        for t, _order, item in items:
            if isinstance(item, int):  # a launch
                op_id = item
                if waiting_on is not None:
                    add(waiting_on, op_id, "record/wait")
                    waiting_on = None
                stream = launched[ops[op_id].stream]
                # the waiting stream is this op's: its first op after each wait
                by_consumer: dict[int, list[float]] = {}
                for wait_us in unrecorded:
                    by_consumer.setdefault(stream[bisect_left(stream, (wait_us, -1))][1], []).append(wait_us)
                for consumer_id, wait_list in by_consumer.items():
                    producer_id = _unrecorded_producer(ops, consumer_id, wait_list, last_on_stream)
                    if producer_id is not None:
                        add(producer_id, consumer_id, "unrecorded wait")
                unrecorded = []
                last_launched = op_id
            elif str(item).endswith("EventRecord"):
                recorded = last_launched
            elif recorded is not None:
                waiting_on = recorded
            else:
                unrecorded.append(t)
    return [StreamWait(p, c, source) for (p, c), source in sorted(waits.items())]


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


def _host_syncs(ops: dict[int, Op], calls: dict, host_calls: list[HostCall], sync_events: list[SyncEvent],
                made: list[tuple[Op, GpuOp]], thread_of, origin: float) -> list[HostSync]:
    launched = sorted((c[0], op_id) for op_id, c in calls.items())  # by launch call start
    launch_times = [t for t, _ in launched]
    sync_stream = {e.correlation: e.stream for e in sync_events if e.correlation is not None
                   and e.kind != "Stream Wait Event"}
    raw: list[tuple[int, float, float, tuple[int, ...], str]] = []
    for call in host_calls:
        name = call.name
        if not (name.endswith(_STREAM_SYNCS) or name.endswith(_DEVICE_SYNCS) or name.endswith("Memcpy")):
            continue
        start, end = call.ts - origin, call.end - origin
        before = [op_id for _, op_id in launched[:bisect_left(launch_times, start)]]
        if not before:
            continue
        if name.endswith(_DEVICE_SYNCS):
            last: dict[int, int] = {}
            for op_id in before:
                s = ops[op_id].stream
                if s not in last or ops[op_id].end_us > ops[last[s]].end_us:
                    last[s] = op_id
            awaited = tuple(sorted(last.values()))
        else:
            stream = sync_stream.get(call.correlation) if call.correlation is not None else None
            if stream is not None and stream >= 0 and any(ops[o].stream == stream for o in before):
                cands = [o for o in before if ops[o].stream == stream]
                awaited = (max(cands, key=lambda o: ops[o].end_us),)
            else:
                cands = [o for o in before if ops[o].end_us <= end + SYNC_TOLERANCE_US]
                if not cands:
                    continue
                awaited = (max(cands, key=lambda o: ops[o].end_us),)
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
    """One span per step name, on the thread that holds the most step annotations."""
    if not marks:
        return []
    count: dict[tuple, int] = {}
    for m in marks:
        count[m.thread] = count.get(m.thread, 0) + 1
    main = max(count, key=lambda t: (count[t], -min(m.ts for m in marks if m.thread == t)))
    seen: set[str] = set()
    out = []
    for m in sorted((m for m in marks if m.thread == main), key=lambda m: m.ts):
        if m.name not in seen:
            seen.add(m.name)
            out.append(StepSpan(m.name, thread_of(m.thread), m.ts - origin, m.end - origin))
    return out
