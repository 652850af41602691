"""The analytic timeline for two streams (one kernel stream, one collective stream), by jumps.

Same result as :meth:`costmodel.analytic.AnalyticEvaluator._timeline` (the phases of a
fixed running set), computed run by run instead of op by op: while one collective
runs, the kernels beside it take their contended durations ``y_e[k]`` and advance the
collective by ``y_e[k] / yx_e[k]`` of its work, so prefix sums over the kernel order
(one pair of lists per collective estimate ``e``, cached) and a bisection find where
the collective ends. An FSDP iteration of 1,500 ops is then a few hundred jumps.

It applies when every dependency links a kernel and a collective or follows stream
order, and no kernel is a memcpy/memset (:func:`build_jump_static` returns None
otherwise, and the evaluator uses the general timeline).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np

from costmodel.analytic.collective_model import CollectiveEstimate
from nccl_env.errors import LagomError


@dataclass
class JumpStatic:
    kernels: list[int]  # positions (in the evaluator's op order) of the kernels, in stream order
    colls: list[int]  # positions of the collectives, in stream order
    kdep: list[int]  # kernel -> the last collective (collective order) it waits for, -1 none
    cdep: list[int]  # collective -> the last kernel (kernel order) it waits for, -1 none
    blockers: list[int]  # kernels that wait for a collective, in order
    x_first: list[bool]  # collective j starts before the kernel that becomes ready with it
    shape_of: list[int]  # kernel -> shape id
    base: list[float]  # kernel -> duration alone
    cum_base: list[float]  # prefix sums of base (length K + 1)
    sig_of: list[int]  # collective -> signature index
    index: dict[int, int]  # op id -> position in kernels + colls
    counts: np.ndarray  # (K + 1) x shapes: how many kernels of each shape precede kernel k
    # estimate -> prefix lists, keyed by value (a frozen dataclass): an id() key outlived its estimate
    # and a new one at the same address read the old one's sums
    per_estimate: dict[CollectiveEstimate, tuple] = field(default_factory=dict)


def build_jump_static(op_ids: list[int], is_coll: list[bool], next_on_stream: list[int],
                      succs: list[tuple[int, ...]], n_preds: list[int], busy: list[bool], shape_id: list[int],
                      base_us: list[float], sig_of: list[int], stream_of: list[int]) -> JumpStatic | None:
    """The jump timeline's static data, or None when the workload is not of its form."""
    n = len(op_ids)
    kernel_streams = {stream_of[k] for k in range(n) if not is_coll[k]}
    coll_streams = {stream_of[k] for k in range(n) if is_coll[k]}
    if len(kernel_streams) > 1 or len(coll_streams) > 1 or (kernel_streams & coll_streams):
        return None
    if not all(busy[k] for k in range(n) if not is_coll[k]):
        return None
    kernels = [k for k in range(n) if not is_coll[k]]
    colls = [k for k in range(n) if is_coll[k]]
    korder = {k: i for i, k in enumerate(kernels)}
    xorder = {k: j for j, k in enumerate(colls)}
    kdep = [-1] * len(kernels)
    cdep = [-1] * len(colls)
    for a in range(n):
        for b in succs[a]:
            if is_coll[a] and not is_coll[b]:
                kdep[korder[b]] = max(kdep[korder[b]], xorder[a])
            elif not is_coll[a] and is_coll[b]:
                cdep[xorder[b]] = max(cdep[xorder[b]], korder[a])
            elif is_coll[a]:  # collective -> collective: fine only along stream order
                if xorder[b] <= xorder[a]:
                    return None
            elif korder[b] <= korder[a]:
                return None
    blockers = [i for i, d in enumerate(kdep) if d >= 0]
    # When kernel c ends and both kernel c+1 and a collective waiting for c become ready, the one
    # whose last pending edge comes first in c's successor list (stream successor first) starts
    # first: a collective started before the kernel does not wait for SMs.
    x_first = [False] * len(colls)
    for j, c in enumerate(cdep):
        if 0 <= c < len(kernels) - 1:
            seq = (next_on_stream[kernels[c]], *succs[kernels[c]])
            last_k = max((q for q, s in enumerate(seq) if s == kernels[c + 1]), default=-1)
            last_x = max((q for q, s in enumerate(seq) if s == colls[j]), default=-1)
            x_first[j] = 0 <= last_x < last_k
    base = [base_us[k] for k in kernels]
    shape_of = [shape_id[k] for k in kernels]
    counts = np.zeros((len(kernels) + 1, max(shape_of, default=-1) + 1))
    if kernels:
        counts[np.arange(1, len(kernels) + 1), shape_of] = 1.0
        counts = np.cumsum(counts, axis=0)
    return JumpStatic(
        kernels=kernels, colls=colls, kdep=kdep, cdep=cdep, blockers=blockers, x_first=x_first,
        shape_of=shape_of, base=base, cum_base=[0.0, *accumulate(base)], counts=counts,
        sig_of=[sig_of[k] for k in colls],
        index={**{op_ids[k]: i for i, k in enumerate(kernels)},
               **{op_ids[k]: len(kernels) + j for j, k in enumerate(colls)}},
    )


def _per_estimate(js: JumpStatic, e: CollectiveEstimate, pair_many) -> tuple:
    """(y, cum_y, p, cum_p, wait) for collective estimate ``e``: y (kernel time beside it), p (its
    progress during such a kernel) and wait (its start delay beside one) per shape id, and the
    prefix sums of y and p over the kernel order."""
    key = e
    hit = js.per_estimate.get(key)
    if hit is not None:
        return hit
    y, yx, wait = pair_many(e)
    p = np.where(yx > 0, y / np.where(yx > 0, yx, 1.0), 1.0)
    both = js.counts @ np.stack([y, p], axis=1)  # prefix sums over the kernel order, both at once
    hit = (y.tolist(), both[:, 0].tolist(), p.tolist(), both[:, 1].tolist(), wait.tolist())
    if len(js.per_estimate) > 4096:
        js.per_estimate.clear()
    js.per_estimate[key] = hit
    return hit


def jump_timeline(js: JumpStatic, ests: list[CollectiveEstimate], pair_many) -> tuple:
    """(starts, ends, compute busy, comm busy, exposed comm, iteration, fill): starts/ends in
    kernels + colls order, complete once ``fill()`` has run (the evaluator's Timing calls it on
    the first look at a kernel's time).

    ``pair_many(e)`` -> numpy arrays over shape ids: (kernel time beside ``e``, ``e``'s time
    beside the kernel, ``e``'s start delay beside the kernel).
    """
    K = len(js.kernels)
    X = len(js.colls)
    kdep, cdep, so, x_first = js.kdep, js.cdep, js.shape_of, js.x_first
    blockers = [*js.blockers, K]  # a sentinel that never clears
    bdep = [*(kdep[b] for b in js.blockers), X + 1]
    base, cum_base = js.base, js.cum_base
    kstart = [0.0] * K
    kend = [0.0] * K
    xstart = [0.0] * X
    xend = [0.0] * X
    x_est = [ests[s] for s in js.sig_of]
    per_sig = {}
    for e in ests:
        per_sig[id(e)] = _per_estimate(js, e, pair_many)
    x_pe = [per_sig[id(e)] for e in x_est]
    t = 0.0
    i = 0  # next unfinished kernel
    rc = 1.0  # its remaining fraction
    k_on = False  # kernel i has started
    j = 0  # next unfinished collective
    rx = 1.0
    x_on = False
    bp = 0  # first blocker not yet passed
    exposed = 0.0
    segments: list[tuple] = []  # runs of whole kernels: (first, end, offset, prefix sums), filled lazily
    last_was_kernel = True  # which kind of op ended at time t (orders simultaneous starts)
    while i < K or j < X:
        can_k = i < K and kdep[i] < j
        can_x = j < X and cdep[j] < i
        if can_k and not k_on and (not (can_x and not x_on) or (last_was_kernel and not x_first[j])):
            kstart[i] = t
            k_on = True
        if can_x and not x_on:
            xstart[j] = t
            x_on = True
            rx = 1.0
            e = x_est[j]
            if k_on:
                wait = x_pe[j][4][so[i]]
                if wait > 0.0:
                    rx += wait / max(e.time_us, 1e-9)
        if can_k and not k_on:
            kstart[i] = t
            k_on = True
        if k_on and x_on:
            e = x_est[j]
            y, cy, p, cp, _ = x_pe[j]
            yi = y[so[i]]
            pi = p[so[i]]
            pr0 = rc * pi
            if pr0 >= rx:  # the collective ends within kernel i
                dt = rx * yi / pi
                t += dt
                rc -= dt / yi
                xend[j] = t
                j += 1
                x_on = False
                last_was_kernel = False
                continue
            t += rc * yi
            rx -= pr0
            kend[i] = t
            if rx <= 1e-12:  # both end together
                i += 1
                rc = 1.0
                k_on = False
                xend[j] = t
                j += 1
                x_on = False
                last_was_kernel = True
                continue
            while blockers[bp] <= i or bdep[bp] < j:
                bp += 1
            b = blockers[bp]  # the first kernel that must wait for it (K: none)
            t0 = t
            c0 = cy[i + 1]
            q = bisect_left(cp, cp[i + 1] + rx, i + 2, b + 1)
            if q <= b:  # it ends during kernel q - 1
                m = q - 1
                if m > i + 1:
                    segments.append((i + 1, m, t0 - c0, cy))
                kstart[m] = t0 + cy[m] - c0
                ym = y[so[m]]
                into = (rx - (cp[m] - cp[i + 1])) * ym / p[so[m]]
                t = kstart[m] + into
                rc = 1.0 - into / ym
                i = m
                k_on = True
                xend[j] = t
                j += 1
                x_on = False
                last_was_kernel = False
            else:  # it outlasts every kernel that can run beside it
                if b > i + 1:
                    segments.append((i + 1, b, t0 - c0, cy))
                t = t0 + cy[b] - c0
                rx -= cp[b] - cp[i + 1]
                i = b
                rc = 1.0
                k_on = False
                last_was_kernel = True
            continue
        if x_on:  # the collective alone
            e = x_est[j]
            dt = rx * e.time_us
            t += dt
            exposed += dt
            xend[j] = t
            j += 1
            x_on = False
            last_was_kernel = False
            continue
        if k_on:  # kernels alone, up to the one the next collective waits for
            stop = cdep[j] if j < X else K - 1
            while blockers[bp] <= i or bdep[bp] < j:
                bp += 1
            stop = max(min(stop, blockers[bp] - 1), i)
            t += rc * base[i]
            kend[i] = t
            t0 = t
            c0 = cum_base[i + 1]
            if stop > i:
                segments.append((i + 1, stop + 1, t0 - c0, cum_base))
            t = t0 + cum_base[stop + 1] - c0
            i = stop + 1
            rc = 1.0
            k_on = False
            last_was_kernel = True
            continue
        stuck = js.kernels[i] if i < K else js.colls[j]
        raise LagomError(f"workload: op at position {stuck} can never start (cyclic dependencies)")
    starts = kstart + xstart
    ends = kend + xend

    def fill() -> None:
        """Write the runs' kernel times into ``starts`` and ``ends`` (once, when someone asks)."""
        for lo, hi, d, cum in segments:
            starts[lo:hi] = [d + v for v in cum[lo:hi]]
            ends[lo:hi] = [d + v for v in cum[lo + 1:hi + 1]]
        segments.clear()

    busy_comm = sum(xend) - sum(xstart)
    return starts, ends, t - exposed, busy_comm, exposed, t, fill
