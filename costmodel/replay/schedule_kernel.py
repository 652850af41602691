"""The replay's two loops over arrays, compiled by numba: the schedule pass and the critical-path walk.

:func:`schedule_pass` is :func:`costmodel.replay.schedule` 's one topological pass (docs/replay.md,
"The replay"): per node in the fixed order, an op starts at ``max(call' + latency, ready' + gap)``
and a wait ends at the latest of its causes. :func:`critical_comm` follows the binding causes back
from a step's end. Both do, in the same order, the same floating-point operations as the Python
they replace, so a compiled replay gives the same figures to the last bit (``tests/test_replay.py``
runs both forms side by side: ``schedule_pass.py_func``).

numba compiles them on first use and caches the machine code beside this file (``cache=True``);
without numba (not installed, or a Python it does not support yet) they run as plain Python over
the same arrays, the same figures, slower.
"""

from __future__ import annotations

import math

import numpy as np

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency; this keeps a replay working without it
    def njit(*_args, **_kwargs):  # type: ignore[no-redef]
        def wrap(function):
            function.py_func = function
            return function
        return wrap

_NO = -1


@njit(cache=True)
def _at(new_end, wait_end, anchor, cpu, thread, j, t):
    """Where a thread's call at measured time ``t`` lands (``schedule._CpuClock.at``)."""
    if j >= 0:
        return new_end[j] + cpu * (t - wait_end[j])
    if cpu == 1.0:
        return t
    a = t
    if 0 <= thread < anchor.shape[0] and anchor[thread] == anchor[thread]:
        a = anchor[thread]
    return a + cpu * (t - a)


@njit(cache=True)
def _op_start(v, ends, new_end, pred_ptr, pred_idx, launch_call, launch_latency, launch_thread, launch_wait, gap,
              measured_start, wait_end, anchor, cpu, n_ops):
    """The one rule that places op ``v`` (docs/replay.md, "The replay"): ``max(call' + latency, ready' + gap)``
    (its start, and its binding node: what its time waited for, -1: nothing); wait ``j``'s node is
    ``n_ops + j``. :func:`schedule_pass` (one rank) and :func:`joint_pass` (every rank) both place ops by it."""
    ready = -math.inf
    by = _NO
    for q in range(pred_ptr[v], pred_ptr[v + 1]):
        p = pred_idx[q]
        if ends[p] > ready:
            ready = ends[p]
            by = p
    call = launch_call[v]
    if call == call:  # a launch call (not nan)
        j = launch_wait[v]
        t = _at(new_end, wait_end, anchor, cpu, launch_thread[v], j, call) + launch_latency[v]
        b = n_ops + j if j >= 0 else _NO
        if by >= 0 and ready + gap[v] > t:
            t = ready + gap[v]
            b = by
    elif by >= 0:
        t = ready + gap[v]
        b = by
    else:
        t = measured_start[v]
        b = _NO
    return t, b


@njit(cache=True)
def _wait_finish(j, ends, new_end, wait_thread, wait_prev, wait_begin, wait_own, wait_end, wait_return, awaited_ptr,
                 awaited_idx, wait_cause_thread, wait_cause, wait_cause_us, anchor, cpu, n_ops):
    """The one rule that ends wait ``j``: the latest of its thread's own time, what it awaited and its
    cause (its new end, and its binding node)."""
    finish = -math.inf
    b = _NO
    begin = wait_begin[j]
    if begin == begin:
        prev = wait_prev[j]
        finish = _at(new_end, wait_end, anchor, cpu, wait_thread[j], prev, begin) + cpu * wait_own[j]
        b = n_ops + prev if prev >= 0 else _NO
    for q in range(awaited_ptr[j], awaited_ptr[j + 1]):
        a = awaited_idx[q]
        if ends[a] + wait_return[j] > finish:
            finish = ends[a] + wait_return[j]
            b = a
    cause_us = wait_cause_us[j]
    if cause_us == cause_us:
        c = wait_cause[j]
        t = _at(new_end, wait_end, anchor, cpu, wait_cause_thread[j], c, cause_us) + wait_return[j]
        if t > finish:
            finish = t
            b = n_ops + c if c >= 0 else _NO
    if finish == -math.inf:
        finish = wait_end[j]
    return finish, b


@njit(cache=True)
def schedule_pass(order, n, pred_ptr, pred_idx, launch_call, launch_latency, launch_thread, launch_wait, gap,
                  measured_start, wait_thread, wait_prev, wait_begin, wait_own, wait_end, wait_return, awaited_ptr,
                  awaited_idx, wait_cause_thread, wait_cause, wait_cause_us, anchor, cpu, durations):
    """(starts, ends, each wait's new end, binding node per node: what its time waited for, -1: nothing)."""
    m = wait_end.shape[0]
    starts = np.zeros(n)
    ends = np.zeros(n)
    new_end = wait_end.copy()
    bind = np.full(n + m, _NO, dtype=np.int64)
    for v in order:
        if v < n:
            t, b = _op_start(v, ends, new_end, pred_ptr, pred_idx, launch_call, launch_latency, launch_thread,
                             launch_wait, gap, measured_start, wait_end, anchor, cpu, n)
            starts[v] = t
            ends[v] = t + durations[v]
            bind[v] = b
        else:
            j = v - n
            new_end[j], bind[v] = _wait_finish(j, ends, new_end, wait_thread, wait_prev, wait_begin, wait_own,
                                               wait_end, wait_return, awaited_ptr, awaited_idx, wait_cause_thread,
                                               wait_cause, wait_cause_us, anchor, cpu, n)
    return starts, ends, new_end, bind


@njit(cache=True)
def _release(v, succ_ptr, succ_idx, indeg, queue, tail):
    for q in range(succ_ptr[v], succ_ptr[v + 1]):
        s = succ_idx[q]
        indeg[s] -= 1
        if indeg[s] == 0:
            queue[tail] = s
            tail += 1
    return tail


@njit(cache=True)
def joint_pass(n, succ_ptr, succ_idx, indeg0, pred_ptr, pred_idx, launch_call, launch_latency, launch_thread,
               launch_wait, gap, measured_start, wait_thread, wait_prev, wait_begin, wait_own, wait_end, wait_return,
               awaited_ptr, awaited_idx, wait_cause_thread, wait_cause, wait_cause_us, anchor, op_cpu, wait_cpu,
               match_of, mem_ptr, mem_idx, op_offset, last_meas, lag_unrec, transfer, durations):
    """Every rank's graph at once (``costmodel.replay.joint``): the ranks' nodes in one graph (ops
    0..n-1, waits n..), placed by the one-rank rules (:func:`_op_start`, :func:`_wait_finish`) as
    Kahn's order reaches them; a matched collective's members end together, a transfer after the
    last member's arrival on the aligned clock. (starts, ends, each wait's new end, held matches:
    1 where the members' order contradicted their graphs and the waits were held as measured; the
    nodes that never ran, 0 when all did.)"""
    m = wait_end.shape[0]
    starts = np.zeros(n)
    ends = np.zeros(n)
    new_end = wait_end.copy()
    indeg = indeg0.copy()
    queue = np.empty(n + m, dtype=np.int64)
    tail = 0
    for v in range(n + m):
        if indeg[v] == 0:
            queue[tail] = v
            tail += 1
    matches = last_meas.shape[0]
    came = np.zeros(matches, dtype=np.int64)
    arrived = np.zeros(n, dtype=np.bool_)
    held = np.zeros(matches, dtype=np.bool_)
    head = 0
    while True:
        while head < tail:
            v = queue[head]
            head += 1
            if v >= n:
                j = v - n
                new_end[j], _ = _wait_finish(j, ends, new_end, wait_thread, wait_prev, wait_begin, wait_own, wait_end,
                                             wait_return, awaited_ptr, awaited_idx, wait_cause_thread, wait_cause,
                                             wait_cause_us, anchor, wait_cpu[j], n)
                tail = _release(v, succ_ptr, succ_idx, indeg, queue, tail)
                continue
            t, _ = _op_start(v, ends, new_end, pred_ptr, pred_idx, launch_call, launch_latency, launch_thread,
                             launch_wait, gap, measured_start, wait_end, anchor, op_cpu[v], n)
            starts[v] = t
            i = match_of[v]
            if i < 0:
                ends[v] = t + durations[v]
                tail = _release(v, succ_ptr, succ_idx, indeg, queue, tail)
                continue
            if held[i]:
                tail = _hold(v, i, starts, ends, measured_start, op_offset, last_meas, transfer, succ_ptr, succ_idx,
                             indeg, queue, tail)
                continue
            arrived[v] = True
            came[i] += 1
            if came[i] < mem_ptr[i + 1] - mem_ptr[i]:
                continue
            last = -math.inf
            for q in range(mem_ptr[i], mem_ptr[i + 1]):
                k = mem_idx[q]
                a = starts[k] + op_offset[k]
                if a > last:
                    last = a
            if lag_unrec[i] > 0:
                moved = math.inf
                for q in range(mem_ptr[i], mem_ptr[i + 1]):
                    k = mem_idx[q]
                    d = starts[k] - measured_start[k]
                    if d < moved:
                        moved = d
                last = max(last, last_meas[i] + moved)
            for q in range(mem_ptr[i], mem_ptr[i + 1]):
                k = mem_idx[q]
                ends[k] = max(starts[k], last - op_offset[k] + transfer[k])
                tail = _release(k, succ_ptr, succ_idx, indeg, queue, tail)
        if head == n + m:
            return starts, ends, new_end, held, 0
        stalled = 0
        for i in range(matches):
            if came[i] > 0 and came[i] < mem_ptr[i + 1] - mem_ptr[i] and not held[i]:
                stalled += 1
                held[i] = True
                for q in range(mem_ptr[i], mem_ptr[i + 1]):
                    k = mem_idx[q]
                    if arrived[k]:
                        tail = _hold(k, i, starts, ends, measured_start, op_offset, last_meas, transfer, succ_ptr,
                                     succ_idx, indeg, queue, tail)
        if stalled == 0:
            return starts, ends, new_end, held, n + m - head


@njit(cache=True)
def _hold(k, i, starts, ends, measured_start, op_offset, last_meas, transfer, succ_ptr, succ_idx, indeg, queue, tail):
    """A member of a held match ends as it would with its measured wait (the one-rank replay)."""
    wait = max(0.0, last_meas[i] - measured_start[k] - op_offset[k])
    ends[k] = max(starts[k], starts[k] + wait + transfer[k])
    return _release(k, succ_ptr, succ_idx, indeg, queue, tail)


@njit(cache=True)
def critical_comm(starts, ends, new_end, bind, is_coll, begin_node, end_node, horizon_us, ends_at_end):
    """Collective time on the critical path to ``end_node`` after it meets the path to
    ``begin_node`` (``schedule._critical_comm``)."""
    n = starts.shape[0]
    shared = np.zeros(bind.shape[0], dtype=np.bool_)
    node = begin_node
    while node >= 0 and (starts[node] if node < n else new_end[node - n]) >= horizon_us:
        shared[node] = True
        node = bind[node]
    total = 0.0
    node = end_node if ends_at_end else bind[end_node]
    while node >= 0 and not shared[node]:
        if node < n:
            if starts[node] < horizon_us:
                break
            if is_coll[node]:
                total += ends[node] - starts[node]
        elif new_end[node - n] < horizon_us:
            break
        node = bind[node]
    return total


@njit(cache=True)
def union_segments(starts, ends):
    """The lengths of the union's segments, in order: intervals sorted by start (stable), the
    running latest end, a new segment where a start passes it (``schedule._union_length`` sums them)."""
    order = np.argsort(starts, kind="mergesort")
    n = order.shape[0]
    s = starts[order]
    e = ends[order]
    for i in range(1, n):
        if e[i - 1] > e[i]:
            e[i] = e[i - 1]
    count = 1
    for i in range(1, n):
        if s[i] > e[i - 1]:
            count += 1
    out = np.empty(count)
    first = 0
    k = 0
    for i in range(1, n):
        if s[i] > e[i - 1]:
            out[k] = e[i - 1] - s[first]
            k += 1
            first = i
    out[k] = e[n - 1] - s[first]
    return out


@njit(cache=True)
def ordered_sum(values, index):
    """``values[index]`` summed one after the other, in index order (Python's ``sum`` of them)."""
    total = 0.0
    for k in index:
        total += values[k]
    return total
