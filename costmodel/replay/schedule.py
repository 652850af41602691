"""Replaying a trace's execution graph: the scheduler both evaluators share.

:func:`replay` takes a Workload read from a trace (it carries a
:class:`~traces.exec_graph.ExecGraph`) and one duration per op, and schedules the
graph as the world runs it (docs/replay.md):

- a CPU thread is a chain: the CPU's own time between its calls is kept as measured,
  and a call moves with the thread's last *wait* before it. A wait is a host
  synchronisation (it returns at ``max(start' + own, latest awaited end' + return)``)
  or a hand-over between threads (``backward()`` wakes the autograd thread, which
  starts at ``max(idle since', main's call' + delay)``; the main thread goes on at
  ``max(its call', the burst's last end' + delay)``). Every time is relative to a
  cause; only a thread's calls before its first wait keep their measured times;
- a GPU op starts at ``max(call' + latency, ready' + gap)``: ``call'`` its launching
  call on its moved thread, ``ready'`` when its stream predecessor and its producers
  (EVENT dependencies, inferred stream waits) ended; latency and gap are the trace's
  own (:mod:`traces.exec_graph_build`), so GPU idle the graph cannot explain stays a
  delay after what the op waited for, not an absolute time; an op with no launch
  call has only the second term, and an op with neither keeps its measured start;
- a profiler step is the GPU's period: step N runs from the start of the first GPU op
  launched inside ``ProfilerStep#N`` to the start of the first one launched inside
  ``ProfilerStep#N+1`` (the unfinished last step only closes the one before). Its ops
  are those launched inside it (HTA's rule): communication = merged time of its
  on-GPU collectives, exposed = the part of that no compute kernel overlaps, critical
  = its collectives' time on the critical path to the step's end (the most that
  faster communication can save). A trace without steps is one pseudo-step, ``whole
  trace``, from its first op start to its last op end.

The measured figures are the same definitions read off the trace's own times, never
the replay's. The order of evaluation is fixed once per workload (a topological order
of the graph by measured time), so one replay is a single pass over arrays.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodel.evaluator import LazyOpValues, OpTiming, StepTiming, Timing, check_workload
from nccl_env.errors import LagomError
from traces.exec_graph import ExecGraph
from traces.gc_pause import no_cyclic_gc
from traces.workload import CollectiveOp, ComputeOp, Op, Workload

WHOLE_TRACE = "whole trace"
SAME_THREAD_US = 2.0  # a trace's CPU timestamps of one thread agree to about a microsecond (rounding)
UNEXPLAINED_US = 100.0  # an op that started this much later than its causes allow waited on something unrecorded
_NO = -1


@dataclass
class _Step:
    name: str
    thread: int  # -1: the pseudo-step of a trace without steps
    start_us: float  # its annotation's start
    op_index: list[int]  # ops launched inside it
    first: int  # the first op launched inside it (-1: none)


@dataclass
class ReplayStatic:
    """What one workload's replays share (op k: ``order`` node k; wait j: node ``n + j``)."""

    op_ids: list[int]
    measured_start: list[float]
    measured_dur: list[float]
    is_coll: list[bool]  # an on-GPU collective
    is_compute: list[bool]  # a kernel that counts as compute (not memcpy/memset)
    order: list[int]  # a topological order of the nodes
    preds: list[tuple[int, ...]]  # op index -> stream predecessor and producers
    launch_call: list[float]  # measured call time (nan without a launch call)
    launch_latency: list[float]
    launch_thread: list[int]  # -1 without a launch call
    launch_wait: list[int]  # op index -> the last wait on its launching thread before the call (-1: none)
    gap: list[float]
    wait_thread: list[int]
    wait_prev: list[int]  # wait -> the last wait on its thread before it began (-1: none)
    wait_begin: list[float]  # when the thread began waiting (nan: since before the trace)
    wait_own: list[float]  # the call's own time when it did not wait
    wait_end: list[float]  # when it went on (measured)
    wait_return: list[float]  # from its cause's end to its end
    wait_awaited: list[tuple[int, ...]]  # GPU ops it waited for (op indexes)
    wait_cause_thread: list[int]  # a hand-over: the thread whose call let it go on (-1: a host sync)
    wait_cause: list[int]  # a hand-over: the cause thread's last wait before the cause (-1: none)
    wait_cause_us: list[float]  # a hand-over: the cause's measured time (nan: a host sync)
    steps: list[_Step]
    step_close: list[int]  # step -> the op whose start ends it (-1: the last op end, or its annotation)
    step_close_wait: list[int]  # step -> the wait that moves its closing annotation (no op to close it)
    step_close_us: list[float]  # step -> that annotation's start
    step_open_wait: list[int]  # step -> the wait that moves its annotation (no op to open it)
    step_close_thread: list[int]  # step -> the thread of that closing annotation
    thread_anchor: dict[int, float]  # thread -> its first call in the graph: CPU time scales from there
    compute_index: np.ndarray  # ops that count as compute
    step_coll_index: list[np.ndarray]  # per step: its on-GPU collectives
    step_compute_index: list[np.ndarray]  # per step: its compute kernels
    measured_steps: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    # (iteration, comm, exposed, compute, critical comm) per step, from the trace's own times
    unexplained: dict[int, float] = field(default_factory=dict)  # op index -> idle its causes do not explain
    step_unexplained_us: list[float] = field(default_factory=list)  # per step: that idle, summed
    arrays: GraphArrays | None = None  # the graph as the compiled pass reads it (built with the rest)
    # ops with neither a launch call nor a cause: a replay keeps their measured start, as the trace wrote
    # it (an int where it was one: the figures print as they always did)
    keeps_start: list[int] = field(default_factory=list)
    kept: frozenset[int] = frozenset()  # the same, for membership
    index: dict[int, int] = field(default_factory=dict)  # op id -> op index

    @property
    def graph_arrays(self) -> GraphArrays:
        assert self.arrays is not None  # _build sets it
        return self.arrays


@dataclass
class GraphArrays:
    """The same graph as flat arrays (lists of tuples as CSR: ``ptr[k]:ptr[k + 1]`` into ``idx``),
    what :mod:`costmodel.replay.schedule_kernel` reads."""

    order: np.ndarray
    pred_ptr: np.ndarray
    pred_idx: np.ndarray
    launch_call: np.ndarray
    launch_latency: np.ndarray
    launch_thread: np.ndarray
    launch_wait: np.ndarray
    gap: np.ndarray
    measured_start: np.ndarray
    wait_thread: np.ndarray
    wait_prev: np.ndarray
    wait_begin: np.ndarray
    wait_own: np.ndarray
    wait_end: np.ndarray
    wait_return: np.ndarray
    awaited_ptr: np.ndarray
    awaited_idx: np.ndarray
    wait_cause_thread: np.ndarray
    wait_cause: np.ndarray
    wait_cause_us: np.ndarray
    anchor: np.ndarray  # thread -> its first call (nan: none)
    is_coll: np.ndarray

    def rule_arrays(self) -> tuple[np.ndarray, ...]:
        """What the node rule reads (``schedule_kernel._op_start``, ``_wait_finish``), in the order the
        passes take them: from ``pred_ptr`` to ``anchor``."""
        return (self.pred_ptr, self.pred_idx, self.launch_call, self.launch_latency, self.launch_thread,
                self.launch_wait, self.gap, self.measured_start, self.wait_thread, self.wait_prev, self.wait_begin,
                self.wait_own, self.wait_end, self.wait_return, self.awaited_ptr, self.awaited_idx,
                self.wait_cause_thread, self.wait_cause, self.wait_cause_us, self.anchor)


def _csr(rows: list[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    idx = np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(ptr[-1]))
    return ptr, idx


def _arrays(st: ReplayStatic) -> GraphArrays:
    i64, f64 = np.int64, np.float64
    thread_count = max(st.thread_anchor, default=-1) + 1
    anchor = np.full(max(thread_count, 0), np.nan)
    for thread, t in st.thread_anchor.items():
        if thread >= 0:
            anchor[thread] = t
    pred_ptr, pred_idx = _csr(st.preds)
    awaited_ptr, awaited_idx = _csr(st.wait_awaited)
    return GraphArrays(
        np.asarray(st.order, dtype=i64), pred_ptr, pred_idx, np.asarray(st.launch_call, dtype=f64),
        np.asarray(st.launch_latency, dtype=f64), np.asarray(st.launch_thread, dtype=i64),
        np.asarray(st.launch_wait, dtype=i64), np.asarray(st.gap, dtype=f64),
        np.asarray(st.measured_start, dtype=f64), np.asarray(st.wait_thread, dtype=i64),
        np.asarray(st.wait_prev, dtype=i64), np.asarray(st.wait_begin, dtype=f64), np.asarray(st.wait_own, dtype=f64),
        np.asarray(st.wait_end, dtype=f64), np.asarray(st.wait_return, dtype=f64), awaited_ptr, awaited_idx,
        np.asarray(st.wait_cause_thread, dtype=i64), np.asarray(st.wait_cause, dtype=i64),
        np.asarray(st.wait_cause_us, dtype=f64), anchor, np.asarray(st.is_coll, dtype=np.bool_))


def replay_static(workload: Workload) -> ReplayStatic:
    """The workload's replay data, built (and the workload checked) on every call: hold it
    (:class:`costmodel.replay.data.ReplayData` does) rather than build it twice."""
    check_workload(workload)
    if workload.exec_graph is None:
        raise LagomError(f"{workload.source or 'workload'}: not read from a trace (no execution graph to replay)")
    with no_cyclic_gc():
        return _build(workload, workload.exec_graph)


@dataclass
class _Wait:
    thread: int
    begin_us: float  # nan: none
    own_us: float
    end_us: float
    return_us: float
    awaited: tuple[int, ...]  # op ids
    cause_thread: int  # -1: a host sync
    cause_us: float


def _waits(g: ExecGraph) -> list[_Wait]:
    out = [_Wait(s.thread, s.start_us, s.own_us, s.end_us, s.return_us, s.awaited, _NO, math.nan) for s in g.syncs]
    for h in g.hand_overs:
        out.append(_Wait(h.thread, math.nan if h.start_us is None else h.start_us, 0.0, h.resume_us,
                         max(0.0, h.resume_us - h.cause_us), (), h.cause_thread, h.cause_us))
    out.sort(key=lambda w: (w.end_us, w.thread))
    return out


class _ThreadWaits:
    """Per thread, its waits by end: which one a call at time t moves with."""

    def __init__(self, waits: list[_Wait]) -> None:
        self.index: dict[int, list[int]] = {}
        for j, w in enumerate(waits):
            self.index.setdefault(w.thread, []).append(j)
        self.ends = {t: [waits[j].end_us for j in js] for t, js in self.index.items()}

    def before(self, thread: int, t: float, exclude: int = _NO) -> int:
        """The last wait on ``thread`` that ended at or before ``t`` (-1: none). A thread's calls
        follow one another, so a wait that ends within the clocks' rounding after ``t`` ended
        before the call at ``t`` began (SAME_THREAD_US); ``exclude`` and the waits after it never count."""
        ends = self.ends.get(thread)
        if not ends or math.isnan(t):
            return _NO
        i = bisect_right(ends, t + SAME_THREAD_US) - 1
        js = self.index[thread]
        if exclude >= 0 and exclude in js:
            i = min(i, js.index(exclude) - 1)
        return js[i] if i >= 0 else _NO


def _build(w: Workload, g: ExecGraph) -> ReplayStatic:
    ops: list[Op] = [*w.compute_ops, *w.collectives]
    ops.sort(key=lambda o: (o.start_us, o.op_id))
    index = {o.op_id: k for k, o in enumerate(ops)}
    n = len(ops)
    preds: list[list[int]] = [[] for _ in range(n)]
    last_on_stream: dict[int, int] = {}
    for k, o in enumerate(ops):
        prev = last_on_stream.get(o.stream)
        if prev is not None:
            preds[k].append(prev)
        last_on_stream[o.stream] = k
    for before, after in ([(d.before, d.after) for d in w.dependencies]
                          + [(s.producer, s.consumer) for s in g.stream_waits]):
        a, b = index.get(before), index.get(after)
        if a is not None and b is not None and a != b and a not in preds[b]:
            preds[b].append(a)
    waits = _waits(g)
    by_thread = _ThreadWaits(waits)
    wait_prev = [by_thread.before(wt.thread, wt.begin_us, exclude=j) for j, wt in enumerate(waits)]
    wait_cause = [by_thread.before(wt.cause_thread, wt.cause_us) if wt.cause_thread >= 0 else _NO for wt in waits]
    launch_call, launch_latency = [math.nan] * n, [0.0] * n
    launch_thread, launch_wait = [_NO] * n, [_NO] * n
    gap = [0.0] * n
    anchor: dict[int, float] = {}
    for k, o in enumerate(ops):
        la = g.launches.get(o.op_id)
        if la is not None:
            launch_call[k], launch_latency[k], launch_thread[k] = la.call_us, la.latency_us, la.thread
            launch_wait[k] = by_thread.before(la.thread, la.call_us)
            anchor[la.thread] = min(anchor.get(la.thread, math.inf), la.call_us)
        gap[k] = g.gaps.get(o.op_id, 0.0)
    for wt in waits:
        for thread, t in ((wt.thread, wt.begin_us), (wt.thread, wt.end_us), (wt.cause_thread, wt.cause_us)):
            if thread >= 0 and not math.isnan(t):
                anchor[thread] = min(anchor.get(thread, math.inf), t)
    awaited = [tuple(index[a] for a in wt.awaited if a in index) for wt in waits]
    order = _topological(ops, waits, preds, launch_wait, wait_prev, awaited, wait_cause)
    cpu_side = not any(isinstance(o, CollectiveOp) and o.on_gpu for o in ops) and not w.compute_ops
    windows = _steps(g, ops)  # every annotated step; the last, unfinished, only closes the one before
    if cpu_side:  # no GPU: a step is its annotation's period, moved with its thread
        for window in windows:
            window.first = _NO
    steps = windows[:-1] if len(windows) >= 2 else windows
    step_close = [windows[i + 1].first if i + 1 < len(windows) else _NO for i in range(len(steps))]
    step_close_us = [windows[i + 1].start_us if i + 1 < len(windows) else math.nan for i in range(len(steps))]
    step_close_wait = [by_thread.before(windows[i + 1].thread, windows[i + 1].start_us) if i + 1 < len(windows)
                       else _NO for i in range(len(steps))]
    step_open_wait = [by_thread.before(s.thread, s.start_us) if s.thread >= 0 else _NO for s in steps]
    step_close_thread = [windows[i + 1].thread if i + 1 < len(windows) else _NO for i in range(len(steps))]
    for s in windows:
        if s.thread >= 0:
            anchor[s.thread] = min(anchor.get(s.thread, math.inf), s.start_us)
    st = ReplayStatic(
        op_ids=[o.op_id for o in ops], measured_start=[o.start_us for o in ops],
        measured_dur=[o.duration_us for o in ops],
        is_coll=[isinstance(o, CollectiveOp) and (o.on_gpu or cpu_side) for o in ops],
        is_compute=[isinstance(o, ComputeOp) and not o.is_memory_op for o in ops],
        order=order, preds=[tuple(p) for p in preds], launch_call=launch_call, launch_latency=launch_latency,
        launch_thread=launch_thread, launch_wait=launch_wait, gap=gap,
        wait_thread=[wt.thread for wt in waits], wait_prev=wait_prev, wait_begin=[wt.begin_us for wt in waits],
        wait_own=[wt.own_us for wt in waits],
        wait_end=[wt.end_us for wt in waits], wait_return=[wt.return_us for wt in waits], wait_awaited=awaited,
        wait_cause_thread=[wt.cause_thread for wt in waits], wait_cause=wait_cause,
        wait_cause_us=[wt.cause_us for wt in waits],
        steps=steps, step_close=step_close, step_close_wait=step_close_wait, step_close_us=step_close_us,
        step_open_wait=step_open_wait, step_close_thread=step_close_thread, thread_anchor=anchor,
        compute_index=np.array([], dtype=np.int64), step_coll_index=[],
        step_compute_index=[],
    )
    st.compute_index = np.array([k for k in range(n) if st.is_compute[k]], dtype=np.int64)
    for step in steps:
        st.step_coll_index.append(np.array([k for k in step.op_index if st.is_coll[k]], dtype=np.int64))
        st.step_compute_index.append(np.array([k for k in step.op_index if st.is_compute[k]], dtype=np.int64))
    st.arrays = _arrays(st)
    st.keeps_start = [k for k in range(n) if math.isnan(launch_call[k]) and not preds[k]]
    st.kept = frozenset(st.keeps_start)
    st.index = index
    ends = [o.start_us + o.duration_us for o in ops]
    _, _, clock, bind = _schedule(st, st.measured_dur)
    st.measured_steps = _step_figures(st, st.measured_start, ends, clock, bind)
    st.unexplained = _unexplained(st, g, ops, ends)
    late_a = np.array([ops[k].start_us - late for k, late in st.unexplained.items()])
    late_b = np.array([ops[k].start_us for k in st.unexplained])
    # wall time inside each step's measured period, not a sum: ops on several streams can wait
    # on the same unrecorded cause, and an op launched in one step can wait in the next
    st.step_unexplained_us = []
    for i, step in enumerate(steps):
        begin = st.measured_start[step.first] if step.first >= 0 else step.start_us
        end = begin + st.measured_steps[i][0]
        st.step_unexplained_us.append(_union_length(np.clip(late_a, begin, end), np.clip(late_b, begin, end)))
    return st


def _unexplained(st: ReplayStatic, g: ExecGraph, ops: list[Op], ends: list[float]) -> dict[int, float]:
    """Op index -> how much later than ``max(call + median latency, ready + median gap)`` it
    started, where that exceeds UNEXPLAINED_US: GPU idle the graph shows no cause for (over arrays:
    numpy's max and difference are Python's, to the last bit)."""
    a = st.graph_arrays
    bound = np.full(len(ops), -math.inf)
    has_preds = np.diff(a.pred_ptr) > 0
    if a.pred_idx.size:  # the latest end among each op's predecessors (rows of the CSR with any)
        bound[has_preds] = np.maximum.reduceat(np.asarray(ends, dtype=np.float64)[a.pred_idx],
                                               a.pred_ptr[:-1][has_preds]) + g.median_gap_us
    launched = np.array([o.op_id in g.launches for o in ops], dtype=np.bool_)
    bound = np.where(launched, np.maximum(bound, a.launch_call + g.median_latency_us), bound)
    late_us = a.measured_start - bound
    late = (has_preds | launched) & (late_us > UNEXPLAINED_US)
    return {k: float(late_us[k]) for k in np.flatnonzero(late).tolist()}


def graph_edges(n: int, m: int, preds, launch_wait, awaited, wait_prev,
                wait_cause) -> tuple[list[list[int]], list[int]]:
    """The replay graph's successors and in-degrees over ops (node k < ``n``) and waits (node
    n + j): an op after its predecessors and its launch's wait, a wait after what it awaited, the
    thread's previous wait and its cause. The schedule's order and the joint replay both walk it."""
    succ: list[list[int]] = [[] for _ in range(n + m)]
    indeg = [0] * (n + m)

    def edge(a: int, b: int) -> None:
        succ[a].append(b)
        indeg[b] += 1

    for k in range(n):
        for p in preds[k]:
            edge(p, k)
        if launch_wait[k] >= 0:
            edge(n + launch_wait[k], k)
    for j in range(m):
        for a in awaited[j]:
            edge(a, n + j)
        if wait_prev[j] >= 0:
            edge(n + wait_prev[j], n + j)
        if wait_cause[j] >= 0:
            edge(n + wait_cause[j], n + j)
    return succ, indeg


def _topological(ops: list[Op], waits: list[_Wait], preds, launch_wait, wait_prev, awaited,
                 wait_cause) -> list[int]:
    """Kahn's order over ops (node k) and waits (node n + j), ties broken by measured time
    (ops at their start, waits at their end)."""
    n, m = len(ops), len(waits)
    succ, indeg = graph_edges(n, m, preds, launch_wait, awaited, wait_prev, wait_cause)
    keys = [ops[v].start_us for v in range(n)] + [waits[j].end_us for j in range(m)]
    heap = [(keys[v], v) for v in range(n + m) if indeg[v] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, v = heapq.heappop(heap)
        order.append(v)
        for s in succ[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (keys[s], s))
    if len(order) != n + m:
        raise LagomError("trace: its execution graph has a cycle (dependencies contradict the measured times)")
    return order


def _steps(g: ExecGraph, ops: list[Op]) -> list[_Step]:
    """Every annotated step with the ops launched inside it. An op whose launch call the trace
    lacks was launched before the profiler started: it belongs to no step (unless no op has a
    call: then its start stands in for it)."""
    if g.launches:
        launched = sorted((g.launches[o.op_id].call_us, o.start_us, k) for k, o in enumerate(ops)
                          if o.op_id in g.launches)
    else:
        launched = sorted((o.start_us, o.start_us, k) for k, o in enumerate(ops))
    times = [t for t, _, _ in launched]
    if len(g.steps) >= 2:
        out = []
        bounds = [s.start_us for s in g.steps] + [math.inf]
        for i, a in enumerate(g.steps):
            lo, hi = bisect_right(times, a.start_us - 1e-9), bisect_right(times, bounds[i + 1] - 1e-9)
            members = [k for _, _, k in launched[lo:hi]]
            first = members[0] if members else _NO
            out.append(_Step(a.name, a.thread, a.start_us, members, first))
        return out
    first = min(range(len(ops)), key=lambda k: (ops[k].start_us, k)) if ops else _NO
    return [_Step(WHOLE_TRACE, -1, ops[first].start_us if ops else 0.0, list(range(len(ops))), first)]


class _CpuClock:
    """Where a thread's call at measured time t lands: after its last wait j (which ended at
    ``end_j`` and now ends at ``end_j'``) at ``end_j' + cpu x (t - end_j)``; before any wait,
    ``cpu x`` its distance from the thread's first call. ``cpu`` scales the CPU's own time. The
    rule is the schedule pass's own (``schedule_kernel._at``, its plain-Python form: one call at a time)."""

    def __init__(self, st: ReplayStatic, new_end: np.ndarray, cpu: float) -> None:  # new_end: per wait
        from costmodel.replay.schedule_kernel import _at

        self.st, self.new_end, self.cpu = st, new_end, cpu
        self._rule = _at.py_func

    def at(self, thread: int, j: int, t: float) -> float:
        a = self.st.graph_arrays
        return float(self._rule(self.new_end, a.wait_end, a.anchor, self.cpu, thread, j, t))


def _schedule(st: ReplayStatic, durations: Sequence[float] | np.ndarray,
              cpu: float = 1.0) -> tuple[np.ndarray, np.ndarray, _CpuClock, np.ndarray]:
    """One pass: (starts, ends, the CPU's clock, binding node per node: what its time waited for, -1: nothing)."""
    from costmodel.replay.schedule_kernel import schedule_pass  # numba: loaded by the first replay, not by imports

    a = st.graph_arrays
    args = (a.order, len(st.op_ids), *a.rule_arrays(), float(cpu), np.asarray(durations, dtype=np.float64))
    starts, ends, new_end, bind = schedule_pass(*args)
    return starts, ends, _CpuClock(st, new_end, cpu), bind


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals (sort, running max of ends, segment lengths; numpy sums them)."""
    from costmodel.replay.schedule_kernel import union_segments

    if starts.size == 0:
        return 0.0
    return float(np.sum(union_segments(np.ascontiguousarray(starts, dtype=np.float64),
                                       np.ascontiguousarray(ends, dtype=np.float64))))


def _critical_comm(st: ReplayStatic, starts: np.ndarray, ends: np.ndarray, clock: _CpuClock, bind: np.ndarray,
                   begin_node: int, end_node: int, horizon_us: float, ends_at_end: bool = False) -> float:
    """Collective time on the critical path to ``end_node`` (the chain of binding causes) after
    it meets the path to ``begin_node``: the most that faster collectives can shorten the step
    (the step's end moves at most by it; its begin moves with the shared part). Paths are
    followed back to ``horizon_us`` at most."""
    from costmodel.replay.schedule_kernel import critical_comm

    return float(critical_comm(starts, ends, np.asarray(clock.new_end, dtype=np.float64), bind,
                               st.graph_arrays.is_coll, begin_node, end_node, horizon_us, ends_at_end))


def _step_figures(st: ReplayStatic, starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray,
                  clock: _CpuClock, bind: np.ndarray) -> list[tuple[float, float, float, float, float]]:
    """(step time, communication, exposed communication, compute, critical communication) per step.
    Exposed = |collectives U compute| - |compute|, compute being every compute kernel of the
    trace that overlaps the step's collectives."""
    s_arr, e_arr = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    kept = st.kept

    def start_of(k: int) -> float:  # as given (the trace's own), or the measured start where the replay kept it
        if isinstance(starts, list):
            return starts[k]
        return st.measured_start[k] if k in kept else float(s_arr[k])

    ks, ke = s_arr[st.compute_index], e_arr[st.compute_index]
    by_start = np.argsort(ks, kind="stable")
    ks, ke = ks[by_start], ke[by_start]
    longest = float(np.max(ke - ks)) if ks.size else 0.0
    last_end = float(e_arr.max()) if e_arr.size else 0.0
    out = []
    begins: list[float] = []
    for i, step in enumerate(st.steps):
        if step.first >= 0:
            begin, begin_node = start_of(step.first), step.first
        else:
            j = st.step_open_wait[i]
            begin, begin_node = clock.at(step.thread, j, step.start_us), (len(starts) + j if j >= 0 else _NO)
        begins.append(begin)
        close = st.step_close[i]
        if close >= 0:
            finish, end_node = start_of(close), close
        elif not math.isnan(st.step_close_us[i]):
            j = st.step_close_wait[i]
            finish = clock.at(st.step_close_thread[i], j, st.step_close_us[i])
            end_node = len(starts) + j if j >= 0 else _NO
        else:  # the pseudo-step of a trace without steps: it ends with its last op
            finish, end_node = last_end, int(np.argmax(e_arr)) if e_arr.size else _NO
        ci = st.step_coll_index[i]
        comm = exposed = 0.0
        if ci.size:
            cs, ce = s_arr[ci], e_arr[ci]
            comm = _union_length(cs, ce)
            lo, hi = float(cs.min()), float(ce.max())
            a, b = np.searchsorted(ks, lo - longest, side="left"), np.searchsorted(ks, hi, side="left")
            near = slice(a, b)
            keep = ke[near] > lo
            ws, we = ks[near][keep], ke[near][keep]
            exposed = _union_length(np.concatenate([cs, ws]), np.concatenate([ce, we])) - _union_length(ws, we)
        pi = st.step_compute_index[i]
        compute = _union_length(s_arr[pi], e_arr[pi])
        horizon = begins[i - 1] if i else -math.inf  # the path back to the step before is enough
        critical = _critical_comm(st, s_arr, e_arr, clock, bind, begin_node, end_node, horizon,
                                  ends_at_end=close < 0 and math.isnan(st.step_close_us[i])) if end_node >= 0 else 0.0
        out.append((finish - begin, comm, max(0.0, exposed), compute, critical))
    return out


def _python_starts(st: ReplayStatic, starts: np.ndarray) -> list[float]:
    """The replayed starts as Python numbers, the measured start (as the trace wrote it) where kept."""
    out = starts.tolist()
    for k in st.keeps_start:
        out[k] = st.measured_start[k]
    return out


class _LazyOps(Mapping):
    """``Timing.ops`` of a replay: an OpTiming made for each op asked (a search reads a few
    collectives' times per evaluation, not every op's)."""

    def __init__(self, st: ReplayStatic, starts: np.ndarray, ends: np.ndarray) -> None:
        self._st, self._starts, self._ends = st, starts, ends
        self._made: dict[int, OpTiming] = {}  # each op's OpTiming once: asked again, the same object

    def __getitem__(self, op_id: int) -> OpTiming:
        made = self._made.get(op_id)
        if made is None:
            k = self._st.index[op_id]
            start = self._st.measured_start[k] if k in self._st.kept else float(self._starts[k])
            made = self._made[op_id] = OpTiming(start, float(self._ends[k]) - start)
        return made

    def __iter__(self) -> Iterator[int]:
        return iter(self._st.op_ids)

    def __len__(self) -> int:
        return len(self._st.op_ids)

    def __contains__(self, op_id: object) -> bool:
        return op_id in self._st.index


def replay(st: ReplayStatic, durations: Sequence[float] | np.ndarray,
           uncontended: Sequence[float] | np.ndarray | None = None, cpu: float = 1.0) -> Timing:
    """Schedule a trace's execution graph (its replay data ``st``) with ``durations`` (one per
    op, in the order of :attr:`ReplayStatic.op_ids`); per-step figures against the trace's own.
    ``uncontended``: the same ops' durations with no collective beside them; ``cpu``: the
    CPU's own time between calls scaled (1: as measured)."""
    from costmodel.replay.schedule_kernel import ordered_sum

    durations = np.asarray(durations, dtype=np.float64)
    starts, ends, clock, bind = _schedule(st, durations, cpu)
    figures = _step_figures(st, starts, ends, clock, bind)
    steps = []
    for i, (step, (it, comm, exp, compute, critical), measured) in enumerate(zip(st.steps, figures,
                                                                                  st.measured_steps)):
        m_it, m_comm, m_exp, m_compute, m_critical = measured
        steps.append(StepTiming(step.name, it, comm, exp, m_it, m_comm, m_exp, compute, m_compute, critical,
                                m_critical, st.step_unexplained_us[i]))
    count = len(steps)
    compute_busy = sum(s.compute_us for s in steps) / count
    unc = compute_busy
    unc_arr: np.ndarray | None = None
    if uncontended is not None:
        unc_arr = np.asarray(uncontended, dtype=np.float64)
        # summed one after the other in op order, as the figures always were (a numpy sum pairs them: other
        # last digits)
        total = float(ordered_sum(durations, st.compute_index))
        if total > 0:
            unc = compute_busy * float(ordered_sum(unc_arr, st.compute_index)) / total
    return Timing(
        iteration_us=sum(s.iteration_us for s in steps) / count,
        compute_us=compute_busy,
        comm_us=sum(s.comm_us for s in steps) / count,
        exposed_comm_us=sum(s.exposed_comm_us for s in steps) / count,
        compute_uncontended_us=min(unc, compute_busy),
        ops=_LazyOps(st, starts, ends),
        steps=steps,
        uncontended_us=LazyOpValues(st.op_ids, unc_arr) if unc_arr is not None else {},
    )


def as_measured(workload: Workload) -> Timing:
    """The trace's replay with its measured durations (its data built for it)."""
    st = replay_static(workload)
    return replay(st, st.measured_dur)


@dataclass
class MovedTimes:
    """Where a replay put everything: each op's start and end (by op id) and, for any CPU
    call of the trace, its moved time (it moves with its thread's last wait before it)."""

    starts: dict[int, float]
    ends: dict[int, float]
    _waits: _ThreadWaits
    _clock: _CpuClock

    def cpu_us(self, thread: int, t: float) -> float:
        """The replayed time of a call made at ``t`` on graph thread ``thread``."""
        return self._clock.at(thread, self._waits.before(thread, t), t)


def moved_times(st: ReplayStatic, graph: ExecGraph, timing: Timing, cpu: float = 1.0) -> MovedTimes:
    """The schedule behind ``timing`` (a replay of the trace whose graph is ``graph`` and replay
    data ``st``, with the CPU's time scaled by ``cpu``), with the CPU's moves."""
    durations = [timing.ops[i].duration_us for i in st.op_ids]
    starts, ends, clock, _ = _schedule(st, durations, cpu)
    return MovedTimes(dict(zip(st.op_ids, _python_starts(st, starts))), dict(zip(st.op_ids, ends.tolist())),
                      _ThreadWaits(_waits(graph)), clock)
