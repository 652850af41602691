"""Replaying a trace's execution graph: the scheduler both evaluators share.

:func:`replay` takes a Workload read from a trace (it carries a
:class:`~traces.exec_graph.ExecGraph`) and one duration per op, and schedules:

- a GPU op starts at ``max(call' + latency, ready' + gap)``: ``call'`` its launching
  call moved by its CPU thread's shift, ``ready'`` when its stream predecessor and its
  producers (EVENT dependencies, inferred stream waits) ended; latency and gap are the
  trace's own (:mod:`traces.exec_graph_build`); an op with no launch call has only the
  second term, and an op with neither keeps its measured start;
- a CPU thread is a chain of segments kept as measured; only a host synchronisation
  moves it: the call returns at ``max(start' + own, latest awaited end' + return)``
  and everything the thread does after it shifts by ``return' - return``;
- a profiler step starts where its ``ProfilerStep#N`` annotation starts, shifted with
  its thread; its time runs to the next step's start (the unfinished last step only
  closes the one before it), and no earlier than its ops' last end allows: GPU work
  that ends later than measured, by more than the idle slack the trace left before
  the next step, delays the next step by the excess. (A GPU that gets faster shortens
  a step only through the host synchronisations: a trace without them was CPU-bound.)
  Its ops are those launched inside it (HTA's rule, as ``lagom analyze`` counts steps):
  communication = merged time of its on-GPU collectives, exposed = the part of that no
  compute kernel overlaps. A trace without steps is one pseudo-step, ``whole trace``,
  from its first launch to its last op end.

The order of evaluation is fixed once per workload (a topological order of the graph
by measured time), so one replay is a single pass over arrays.
"""

from __future__ import annotations

import heapq
import statistics
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from costmodel.evaluator import OpTiming, StepTiming, Timing
from costmodel.workload_cache import WorkloadCache
from nccl_env.errors import LagomError
from traces.exec_graph import ExecGraph
from traces.workload import CollectiveOp, ComputeOp, Op, Workload

WHOLE_TRACE = "whole trace"


@dataclass
class _Step:
    name: str
    thread: int  # -1: the pseudo-step of a trace without steps
    start_us: float
    next_start_us: float | None  # None: ends at the last op end (pseudo-step)
    op_index: list[int]  # ops launched inside it


@dataclass
class ReplayStatic:
    """What one workload's replays share."""

    op_ids: list[int]
    measured_start: list[float]
    measured_dur: list[float]
    is_coll: list[bool]  # an on-GPU collective
    is_compute: list[bool]  # a kernel that counts as compute (not memcpy/memset)
    order: list[tuple[int, int]]  # (0, op index) or (1, sync index), a topological order
    preds: list[tuple[int, ...]]  # op index -> stream predecessor and producers
    launch_ready: list[float | None]  # call + latency (measured), None without a launch call
    launch_sync: list[int]  # op index -> sync whose shift moves its call (-1: none)
    gap: list[float]
    sync_prev: list[int]  # sync -> previous sync on its thread (-1: none)
    sync_start: list[float]
    sync_end: list[float]
    sync_own: list[float]
    sync_return: list[float]
    sync_awaited: list[tuple[int, ...]]  # op indexes
    steps: list[_Step]
    step_sync: list[int]  # step -> sync whose shift moves its start
    step_end_sync: list[int]  # step -> sync whose shift moves the next step's start
    measured_steps: list[tuple[float, float, float, float]]  # (iteration, comm, exposed, compute) per step
    measured_tails: list[float]  # per step: the last end of its ops
    compute_index: np.ndarray  # ops that count as compute
    step_index: list[np.ndarray]  # per step: its ops
    step_coll_index: list[np.ndarray]  # per step: its on-GPU collectives
    step_compute_index: list[np.ndarray]  # per step: its compute kernels


def _build_static(workload: Workload) -> ReplayStatic:
    if workload.exec_graph is None:
        raise LagomError(f"{workload.source or 'workload'}: not read from a trace (no execution graph to replay)")
    return _build(workload, workload.exec_graph)


_STATICS: WorkloadCache[ReplayStatic] = WorkloadCache(_build_static, max_workloads=16)


def replay_static(workload: Workload) -> ReplayStatic:
    """Built once per workload object (cached while the workload lives)."""
    return _STATICS.get(workload)


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
        if a is not None and b is not None and a != b:
            preds[b].append(a)
    syncs = sorted(g.syncs, key=lambda s: (s.start_us, s.thread))
    by_thread: dict[int, list[int]] = {}
    for j, s in enumerate(syncs):
        by_thread.setdefault(s.thread, []).append(j)
    sync_prev = [-1] * len(syncs)
    thread_ends: dict[int, list[float]] = {}
    for t, js in by_thread.items():
        for a, b in pairwise(js):
            sync_prev[b] = a
        thread_ends[t] = [syncs[j].end_us for j in js]

    def sync_before(thread: int, t: float) -> int:
        """The last sync on ``thread`` that returned at or before ``t`` (-1: none)."""
        ends = thread_ends.get(thread)
        if not ends:
            return -1
        i = bisect_right(ends, t) - 1
        return by_thread[thread][i] if i >= 0 else -1

    launch_ready: list[float | None] = [None] * n
    launch_sync = [-1] * n
    gap = [0.0] * n
    for k, o in enumerate(ops):
        la = g.launches.get(o.op_id)
        if la is not None:
            launch_ready[k] = la.call_us + la.latency_us
            launch_sync[k] = sync_before(la.thread, la.call_us)
        gap[k] = g.gaps.get(o.op_id, 0.0)
    awaited = [tuple(index[a] for a in s.awaited if a in index) for s in syncs]
    order = _topological(ops, preds, launch_sync, syncs, sync_prev, awaited)
    steps = _steps(w, g, ops)
    step_sync = [sync_before(s.thread, s.start_us) if s.thread >= 0 else -1 for s in steps]
    step_end_sync = [sync_before(s.thread, s.next_start_us) if s.next_start_us is not None else -1 for s in steps]
    st = ReplayStatic(
        op_ids=[o.op_id for o in ops], measured_start=[o.start_us for o in ops],
        measured_dur=[o.duration_us for o in ops],
        is_coll=[isinstance(o, CollectiveOp) and o.on_gpu for o in ops],
        is_compute=[isinstance(o, ComputeOp) and not o.is_memory_op for o in ops],
        order=order, preds=[tuple(p) for p in preds], launch_ready=launch_ready, launch_sync=launch_sync, gap=gap,
        sync_prev=sync_prev, sync_start=[s.start_us for s in syncs], sync_end=[s.end_us for s in syncs],
        sync_own=[s.own_us for s in syncs], sync_return=[s.return_us for s in syncs], sync_awaited=awaited,
        steps=steps, step_sync=step_sync, step_end_sync=step_end_sync, measured_steps=[],
        measured_tails=[], compute_index=np.array([], dtype=np.int64), step_index=[], step_coll_index=[],
        step_compute_index=[],
    )
    st.compute_index = np.array([k for k in range(n) if st.is_compute[k]], dtype=np.int64)
    for step in steps:
        st.step_index.append(np.array(step.op_index, dtype=np.int64))
        st.step_coll_index.append(np.array([k for k in step.op_index if st.is_coll[k]], dtype=np.int64))
        st.step_compute_index.append(np.array([k for k in step.op_index if st.is_compute[k]], dtype=np.int64))
    ends = [o.start_us + o.duration_us for o in ops]
    figures = _step_figures(st, st.measured_start, ends, [0.0] * len(syncs))
    st.measured_steps = [f[:4] for f in figures]
    st.measured_tails = [f[4] for f in figures]
    return st


def _topological(ops: list[Op], preds, launch_sync, syncs, sync_prev, awaited) -> list[tuple[int, int]]:
    """Kahn's order over ops and syncs, ties broken by measured time (ops at their start,
    syncs at their return)."""
    n, m = len(ops), len(syncs)
    succ: list[list[int]] = [[] for _ in range(n + m)]  # node: op k -> k, sync j -> n + j
    indeg = [0] * (n + m)
    for k in range(n):
        for p in preds[k]:
            succ[p].append(k)
            indeg[k] += 1
        if launch_sync[k] >= 0:
            succ[n + launch_sync[k]].append(k)
            indeg[k] += 1
    for j in range(m):
        for a in awaited[j]:
            succ[a].append(n + j)
            indeg[n + j] += 1
        if sync_prev[j] >= 0:
            succ[n + sync_prev[j]].append(n + j)
            indeg[n + j] += 1

    def key(node: int) -> tuple[float, int]:
        return (ops[node].start_us, node) if node < n else (syncs[node - n].end_us, node)

    heap = [key(v) for v in range(n + m) if indeg[v] == 0]
    heapq.heapify(heap)
    order: list[tuple[int, int]] = []
    while heap:
        _, v = heapq.heappop(heap)
        order.append((0, v) if v < n else (1, v - n))
        for s in succ[v]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, key(s))
    if len(order) != n + m:
        raise LagomError("trace: its execution graph has a cycle (dependencies contradict the measured times)")
    return order


def _steps(w: Workload, g: ExecGraph, ops: list[Op]) -> list[_Step]:
    launched = [(g.launches[o.op_id].call_us if o.op_id in g.launches else o.start_us, k) for k, o in enumerate(ops)]
    launched.sort()
    times = [t for t, _ in launched]
    if len(g.steps) >= 2:
        out = []
        for a, b in zip(g.steps, g.steps[1:]):  # the last step is unfinished: it only closes the one before
            lo, hi = bisect_right(times, a.start_us - 1e-9), bisect_right(times, b.start_us - 1e-9)
            out.append(_Step(a.name, a.thread, a.start_us, b.start_us, [k for _, k in launched[lo:hi]]))
        return out
    start = min(times) if times else 0.0
    return [_Step(WHOLE_TRACE, -1, start, None, list(range(len(ops))))]


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals (vectorised: sort, running max of ends, segment sums)."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return float(np.sum(e[last] - s[first]))


def _step_figures(st: ReplayStatic, starts: list[float], ends: list[float], sync_shift: list[float],
                  measured_tails: list[float] | None = None) -> list[tuple[float, float, float, float, float]]:
    """(step time, communication, exposed communication, compute, last op end) per step.
    Exposed = |collectives U compute| - |compute|, compute being every kernel of the trace."""
    s_arr, e_arr = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    ks, ke = s_arr[st.compute_index], e_arr[st.compute_index]
    compute_all = _union_length(ks, ke)
    out = []
    for i, step in enumerate(st.steps):
        shift = sync_shift[st.step_sync[i]] if st.step_sync[i] >= 0 else 0.0
        begin = step.start_us + shift
        index = st.step_index[i]
        tail = float(e_arr[index].max()) if index.size else begin
        if step.next_start_us is None:
            finish = tail
        else:
            nxt = st.step_end_sync[i]
            finish = step.next_start_us + (sync_shift[nxt] if nxt >= 0 else 0.0)
            # GPU work that ends later than measured, past its slack, delays the next step
            if measured_tails is not None:
                slack = max(0.0, step.next_start_us - measured_tails[i])
                finish = max(finish, step.next_start_us + tail - measured_tails[i] - slack)
        ci = st.step_coll_index[i]
        comm = _union_length(s_arr[ci], e_arr[ci])
        exposed = _union_length(np.concatenate([s_arr[ci], ks]),
                                np.concatenate([e_arr[ci], ke])) - compute_all if ci.size else 0.0
        pi = st.step_compute_index[i]
        compute = _union_length(s_arr[pi], e_arr[pi])
        out.append((finish - begin, comm, max(0.0, exposed), compute, tail))
    return out


class _LazyOps(Mapping):
    """``Timing.ops`` of a replay: OpTiming objects made on first access."""

    def __init__(self, op_ids: list[int], starts: list[float], ends: list[float]) -> None:
        self._op_ids, self._starts, self._ends = op_ids, starts, ends
        self._ops: dict[int, OpTiming] | None = None

    def _all(self) -> dict[int, OpTiming]:
        if self._ops is None:
            self._ops = {i: OpTiming(s, e - s) for i, s, e in zip(self._op_ids, self._starts, self._ends)}
        return self._ops

    def __getitem__(self, op_id: int) -> OpTiming:
        return self._all()[op_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._op_ids)

    def __len__(self) -> int:
        return len(self._op_ids)

    def __contains__(self, op_id: object) -> bool:
        return op_id in self._all()


def replay(workload: Workload, durations: list[float], uncontended: list[float] | None = None) -> Timing:
    """Schedule the workload's execution graph with ``durations`` (one per op, in the
    order of :attr:`ReplayStatic.op_ids`); per-step figures against the trace's own.
    ``uncontended``: the same ops' durations with no collective beside them."""
    st = replay_static(workload)
    n = len(st.op_ids)
    starts = [0.0] * n
    ends = [0.0] * n
    shift = [0.0] * len(st.sync_start)
    preds, launch_ready, launch_sync, gap = st.preds, st.launch_ready, st.launch_sync, st.gap
    for kind, v in st.order:
        if kind == 0:
            ready = None
            for p in preds[v]:
                e = ends[p]
                if ready is None or e > ready:
                    ready = e
            lr = launch_ready[v]
            if lr is not None:
                j = launch_sync[v]
                t = lr + (shift[j] if j >= 0 else 0.0)
                if ready is not None and ready + gap[v] > t:
                    t = ready + gap[v]
            elif ready is not None:
                t = ready + gap[v]
            else:
                t = st.measured_start[v]
            starts[v] = t
            ends[v] = t + durations[v]
        else:
            prev = st.sync_prev[v]
            begin = st.sync_start[v] + (shift[prev] if prev >= 0 else 0.0)
            finish = begin + st.sync_own[v]
            awaited = st.sync_awaited[v]
            if awaited:
                finish = max(finish, max(ends[a] for a in awaited) + st.sync_return[v])
            shift[v] = finish - st.sync_end[v]
    figures = _step_figures(st, starts, ends, shift, st.measured_tails)
    steps = []
    for step, (it, comm, exp, compute, _), measured in zip(st.steps, figures, st.measured_steps):
        m_it, m_comm, m_exp, m_compute = measured
        steps.append(StepTiming(step.name, it, comm, exp, m_it, m_comm, m_exp, compute, m_compute))
    count = len(steps)
    compute_busy = sum(s.compute_us for s in steps) / count
    unc = compute_busy
    if uncontended is not None:
        total = sum(durations[k] for k in range(n) if st.is_compute[k])
        if total > 0:
            unc = compute_busy * sum(uncontended[k] for k in range(n) if st.is_compute[k]) / total
    return Timing(
        iteration_us=sum(s.iteration_us for s in steps) / count,
        compute_us=compute_busy,
        comm_us=sum(s.comm_us for s in steps) / count,
        exposed_comm_us=sum(s.exposed_comm_us for s in steps) / count,
        compute_uncontended_us=min(unc, compute_busy),
        ops=_LazyOps(st.op_ids, starts, ends),
        steps=steps,
    )


@dataclass(frozen=True)
class ReplayFidelity:
    """How closely a replay under the trace's own settings reproduces what the trace measured."""

    steps: int
    median_step_error_pct: float  # median over steps of |replayed - measured| / measured step time
    max_step_error_pct: float
    comm_error_pct: float  # total collective time over all steps, signed
    exposed_error_pct: float  # total exposed communication, signed
    exposed_error_us_per_step: float
    worst_part: str  # "compute", "communication" (exposed) or "idle" (the rest): where step time differs most

    def to_dict(self) -> dict:
        return {
            "steps": self.steps, "median_step_error_pct": round(self.median_step_error_pct, 3),
            "max_step_error_pct": round(self.max_step_error_pct, 3), "comm_error_pct": round(self.comm_error_pct, 3),
            "exposed_error_pct": round(self.exposed_error_pct, 3),
            "exposed_error_us_per_step": round(self.exposed_error_us_per_step, 3), "worst_part": self.worst_part,
        }


def fidelity(timing: Timing) -> ReplayFidelity | None:
    """Replayed against measured, from a replay's steps (None when the timing has no steps)."""
    steps = timing.steps
    if not steps:
        return None
    errors = [abs(s.iteration_us - s.measured_iteration_us) / s.measured_iteration_us * 100.0
              for s in steps if s.measured_iteration_us > 0]

    def signed_pct(replayed: float, measured: float) -> float:
        return (replayed - measured) / measured * 100.0 if measured > 0 else (0.0 if replayed == 0 else 100.0)

    comm = sum(s.comm_us for s in steps)
    comm_m = sum(s.measured_comm_us for s in steps)
    exposed = sum(s.exposed_comm_us for s in steps)
    exposed_m = sum(s.measured_exposed_comm_us for s in steps)
    step_diff = sum(s.iteration_us - s.measured_iteration_us for s in steps)
    compute_diff = sum(s.compute_us - s.measured_compute_us for s in steps)
    parts = {"communication": abs(exposed - exposed_m), "compute": abs(compute_diff),
             "idle": abs(step_diff - (exposed - exposed_m) - compute_diff)}
    return ReplayFidelity(
        steps=len(steps), median_step_error_pct=statistics.median(errors) if errors else 0.0,
        max_step_error_pct=max(errors, default=0.0),
        comm_error_pct=signed_pct(comm, comm_m), exposed_error_pct=signed_pct(exposed, exposed_m),
        exposed_error_us_per_step=(exposed - exposed_m) / len(steps), worst_part=max(parts, key=lambda k: parts[k]),
    )
