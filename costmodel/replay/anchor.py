"""Per-op durations of a replayed trace under a plan, anchored at what the trace measured.

Both evaluators replay a trace's execution graph (:mod:`costmodel.replay`); they differ
only in the mechanism that says how a time changes when the settings do. That
mechanism never replaces a measured time, it scales it:

- **a collective**: measured = wait for the slowest peer + transfer
  (:mod:`traces.comm_split`). Under a plan its time is ``wait + transfer x T(new) /
  T(recorded)``: ``T`` the mechanism's collective time, ``recorded`` the settings the
  trace shows (channels = the kernel's grid, threads = its block, algorithm/protocol
  from the kernel name where reliable, the rest NCCL's own choice on the cluster).
  A plan's ``None`` fields mean "as NCCL decided in the trace", so ``Plan()`` replays
  the trace as measured. A collective NCCL's knobs do not reach (``CollectiveOp.tunable``
  False: a communication kernel that is not NCCL's, or one whose size the trace did not
  record) keeps its measured time under every plan, and so does the compute beside it.
- **a compute kernel** a collective overlapped in the trace, for a fraction ``f`` of
  its time: ``measured x (1 - f + f x S(new) / S(recorded))``, ``S`` the mechanism's
  slowdown of that kernel beside that collective. The trace's own slowdowns of
  same-shape kernels alone and overlapped (:mod:`traces.contention`) are therefore what
  the model moves from, not what it predicts. Overlap is the trace's: a plan that
  moves a collective away from a kernel does not (yet) remove the slowdown. Its time
  without contention (``Timing.uncontended_us``, the compute slowdown's denominator)
  takes out the slowdown the trace measured for the same kernel shape, alone against
  overlapped (:func:`traces.contention.measured_slowdowns`, what ``lagom analyze``
  reports), moved by ``S(new) / S(recorded)`` under another plan; where the shape never
  ran alone, the mechanism's slowdown over the overlapped part.

The mechanism is anything with ``collective_time_us(signature, config)`` and
``slowdown_beside(op, signature, config)`` (:class:`~costmodel.replay.mechanism.ReplayMechanism`;
both evaluators have them). :func:`build_anchor` is built once per trace and cluster node size
(:class:`~costmodel.replay.data.ReplayData` holds it); :func:`durations_under` gives every op's
duration under a plan from it, the mechanism and a bounded memo of its answers
(:class:`ReplayMemo`).

A :class:`DurationScale` asks a plain what-if first: every collective's measured time
(wait and transfer) times ``comm``, every compute kernel's (not memcpy/memset) times
``compute``; the plan's ratios then apply to the scaled times, and the schedule follows.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from costmodel.evaluator import DurationScale
from costmodel.replay.mechanism import ReplayMechanism
from costmodel.replay.ratio_cache import LruCache
from costmodel.replay.schedule import ReplayStatic
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, CHANNELS, PATH, PROTOCOL, THREADS, config_from
from nccl_env.knobs import CommConfig, CommPath
from nccl_env.plan import Plan, Signature
from traces.contention import measured_slowdowns
from traces.workload import CollectiveOp, ComputeOp, Op, Workload


def check_scale(workload: Workload, scale: DurationScale | None) -> None:
    """A what-if scale applies to a trace's measured times: LagomError for any other workload."""
    if scale is not None and not scale.is_identity and workload.exec_graph is None:
        raise LagomError(f"{workload.source or 'workload'}: a duration scale applies to a trace's measured times; "
                         f"this workload is not a trace")
    if scale is not None and not (0 < scale.comm < 1e6 and 0 < scale.compute < 1e6 and 0 < scale.cpu < 1e6):
        raise LagomError(f"duration scale comm={scale.comm:g}, compute={scale.compute:g}, cpu={scale.cpu:g}: "
                         f"each factor must be > 0")


def recorded_configs(workload: Workload, gpus_per_node: int | None) -> dict[Signature, CommConfig]:
    """Per signature, the settings its NCCL kernels ran with (the most frequent), None where unknown."""
    graph = workload.exec_graph
    if graph is None:
        return {}
    seen: dict[Signature, Counter] = {}
    for c in workload.collectives:
        r = graph.recorded.get(c.op_id)
        if r is not None and c.on_gpu and c.tunable:
            sig = workload.signature(c, gpus_per_node)
            # off NCCL's SM kernels the trace ran another path: its grid is not Lagom's channels knob
            # (a symmetric kernel's CTAs are NCCL's pick; a copy-engine collective has none)
            cta_path = c.recorded_path if c.recorded_path in (CommPath.SYMMETRIC, CommPath.COPY_ENGINE) else None
            grid = r.recorded_channels if cta_path is None else None
            block = r.recorded_threads if cta_path is not CommPath.COPY_ENGINE else None
            seen.setdefault(sig, Counter())[(r.recorded_algorithm, r.recorded_protocol, grid, block, cta_path)] += 1
    return {sig: config_from(zip(_RECORDED_KNOBS, counts.most_common(1)[0][0])) for sig, counts in seen.items()}


# The knobs a trace records, in the order recorded_configs counts them.
_RECORDED_KNOBS = (ALGORITHM, PROTOCOL, CHANNELS, THREADS, PATH)


@dataclass
class Anchor:
    """One trace's measured times in replay order, and what the mechanism's ratios apply to."""

    durations: list[float]  # measured, in replay order
    coll_sig: list[int]  # op -> signature index (-1: not an on-GPU collective)
    wait: list[float]
    signatures: list[Signature]
    recorded: list[CommConfig]
    overlapped: list[tuple[int, int, float, ComputeOp]]  # (op index, signature index, fraction, op)
    measured_slowdown: list[float]  # op index -> the slowdown the trace measured for its shape (0: none)
    # the same as arrays (durations_under's arithmetic, one operation over every op at once)
    durations_arr: np.ndarray = field(init=False, repr=False)
    wait_arr: np.ndarray = field(init=False, repr=False)
    coll_k: np.ndarray = field(init=False, repr=False)  # on-GPU tunable collectives (op index)
    coll_j: np.ndarray = field(init=False, repr=False)  # their signature index
    over_k: np.ndarray = field(init=False, repr=False)  # overlapped compute kernels (op index)
    over_j: np.ndarray = field(init=False, repr=False)  # the signature each overlapped most
    over_f: np.ndarray = field(init=False, repr=False)  # the fraction it overlapped
    over_pair: np.ndarray = field(init=False, repr=False)  # index into pairs
    over_measured: np.ndarray = field(init=False, repr=False)  # its measured slowdown (0: none)
    pairs: list[tuple[tuple, int, ComputeOp]] = field(init=False, repr=False)
    # (kernel shape, signature index, the first op of that shape): one slowdown question each
    sig_pairs: list[np.ndarray] = field(init=False, repr=False)  # signature index -> its pairs
    token: object = field(init=False, repr=False, compare=False)  # names these pairs in a ReplayMemo

    def __post_init__(self) -> None:
        self.durations_arr = np.asarray(self.durations, dtype=np.float64)
        self.wait_arr = np.asarray(self.wait, dtype=np.float64)
        coll = np.asarray(self.coll_sig, dtype=np.int64)
        self.coll_k = np.flatnonzero(coll >= 0)
        self.coll_j = coll[self.coll_k]
        pair_index: dict[tuple[tuple, int], int] = {}
        self.pairs = []
        over_pair = []
        for _, j, _, op in self.overlapped:
            key = ((op.name, op.grid, op.block, op.duration_us), j)
            p = pair_index.get(key)
            if p is None:
                p = pair_index[key] = len(self.pairs)
                self.pairs.append((key[0], j, op))
            over_pair.append(p)
        self.over_k = np.array([k for k, _, _, _ in self.overlapped], dtype=np.int64)
        self.over_j = np.array([j for _, j, _, _ in self.overlapped], dtype=np.int64)
        self.over_f = np.array([f for _, _, f, _ in self.overlapped], dtype=np.float64)
        self.over_pair = np.array(over_pair, dtype=np.int64)
        self.over_measured = np.asarray(self.measured_slowdown, dtype=np.float64)[self.over_k]
        self.sig_pairs = [np.array([p for p, (_, j, _) in enumerate(self.pairs) if j == i], dtype=np.int64)
                          for i in range(len(self.signatures))]
        self.token = object()


def scaled_anchor(a: Anchor, st: ReplayStatic, scale: DurationScale) -> Anchor:
    """The anchor of a what-if: measured collective and compute times scaled (every on-GPU
    collective, tunable or not; compute kernels, not memory ops)."""
    durations = list(a.durations)
    wait = list(a.wait)
    for k in range(len(durations)):
        if st.is_coll[k]:
            durations[k] *= scale.comm
            wait[k] *= scale.comm
        elif st.is_compute[k]:
            durations[k] *= scale.compute
    scaled = replace(a, durations=durations, wait=wait)
    scaled.token = a.token  # the same kernels beside the same signatures: the same slowdowns
    return scaled


def build_anchor(workload: Workload, st: ReplayStatic, gpus_per_node: int | None) -> Anchor:
    """The anchor of ``workload`` (its replay data ``st``) on a cluster of ``gpus_per_node``
    (a signature's scope depends on it)."""
    graph = workload.exec_graph
    assert graph is not None
    all_ops: list[Op] = [*workload.compute_ops, *workload.collectives]
    ops = {o.op_id: o for o in all_ops}
    recorded = recorded_configs(workload, gpus_per_node)
    sig_index: dict[Signature, int] = {}
    coll_sig = [-1] * len(st.op_ids)
    wait = [0.0] * len(st.op_ids)
    spans: list[tuple[float, float, int]] = []
    for k, op_id in enumerate(st.op_ids):
        op = ops[op_id]
        if isinstance(op, CollectiveOp) and st.is_coll[k] and op.tunable:
            sig = workload.signature(op, gpus_per_node)
            coll_sig[k] = sig_index.setdefault(sig, len(sig_index))
            wait[k] = min(op.duration_us, graph.comm_wait_us.get(op_id, 0.0))
            spans.append((op.start_us, op.end_us, coll_sig[k]))
    spans.sort()
    starts = [s for s, _, _ in spans]
    # reach[i]: the latest end among spans[:i + 1], so a backward scan from the first span
    # starting after an op stops as soon as no earlier span can reach the op
    reach = list(itertools.accumulate((e for _, e, _ in spans), max))
    overlapped = []
    for k, op_id in enumerate(st.op_ids):
        op = ops[op_id]
        if not isinstance(op, ComputeOp) or op.is_memory_op or op.duration_us <= 0:
            continue
        best, best_sig = 0.0, -1
        i = bisect.bisect_left(starts, op.end_us) - 1
        while i >= 0 and reach[i] > op.start_us:
            s, e, j = spans[i]
            amount = min(e, op.end_us) - max(s, op.start_us)
            if amount > best:
                best, best_sig = amount, j
            i -= 1
        if best_sig >= 0:
            overlapped.append((k, best_sig, min(1.0, best / op.duration_us), op))
    signatures = list(sig_index)
    measured = measured_slowdowns(workload)
    return Anchor(list(st.measured_dur), coll_sig, wait, signatures,
                   [recorded.get(s, CommConfig()) for s in signatures], overlapped,
                   [measured.get(op_id, 0.0) for op_id in st.op_ids])


RATIO_ENTRIES = 50_000  # (signature, new, recorded) -> time ratio: a long search's settings, many times over
SLOWDOWN_ENTRIES = 200_000  # (kernel shape, signature, settings) -> slowdown: the shapes x settings a search meets
SIGNATURE_ENTRIES = 20_000  # the same per signature of one trace, as a vector (a trace's signatures x settings)


@dataclass
class ReplayMemo:
    """The mechanism's answers a replay reuses, bounded (least recently used dropped past the sizes above).
    Valid for one mechanism: a :class:`~costmodel.replay.trace_evaluator.ReplayEvaluator` holds its own."""

    ratios: LruCache[tuple[Signature, CommConfig, CommConfig], float] = field(
        default_factory=lambda: LruCache(RATIO_ENTRIES))
    slowdowns: LruCache[tuple[tuple, Signature, CommConfig], float] = field(
        default_factory=lambda: LruCache(SLOWDOWN_ENTRIES))
    # (an anchor's token, signature index, settings) -> the slowdowns of that signature's pairs, in order
    signature_slowdowns: LruCache[tuple[object, int, CommConfig], np.ndarray] = field(
        default_factory=lambda: LruCache(SIGNATURE_ENTRIES))


def durations_under(mechanism: ReplayMechanism, a: Anchor, plan: Plan,
                    memo: ReplayMemo) -> tuple[np.ndarray, np.ndarray]:
    """Every op's duration under ``plan`` (replay order) and its duration with no collective
    beside it, from the anchor's measured times and the mechanism's ratios. The mechanism is
    asked once per signature and once per (kernel shape, signature); the per-op arithmetic
    runs over arrays, each op's the same operations in the same order as one at a time."""
    configs = [plan.config_for(s).merged_over(r) for s, r in zip(a.signatures, a.recorded)]
    changed = [new != rec for new, rec in zip(configs, a.recorded)]
    ratio = np.ones(len(a.signatures))
    for j, (sig, new, rec) in enumerate(zip(a.signatures, configs, a.recorded)):
        if not changed[j]:
            continue
        r = memo.ratios.get((sig, new, rec))
        if r is None:
            base = mechanism.collective_time_us(sig, rec)
            r = memo.ratios.put((sig, new, rec), mechanism.collective_time_us(sig, new) / base if base > 0 else 1.0)
        ratio[j] = r
    durations = a.durations_arr.copy()
    r_op = ratio[a.coll_j]
    moved = r_op != 1.0
    k, r_k = a.coll_k[moved], r_op[moved]
    durations[k] = a.wait_arr[k] + (durations[k] - a.wait_arr[k]) * r_k
    uncontended = durations.copy()
    if not a.pairs:
        return durations, uncontended
    s_rec = np.empty(len(a.pairs))
    s_new = np.empty(len(a.pairs))
    for j, pairs in enumerate(a.sig_pairs):
        if pairs.size:
            s_rec[pairs] = s_new[pairs] = _slowdowns(mechanism, memo, a, j, a.recorded[j])
            if changed[j]:
                s_new[pairs] = _slowdowns(mechanism, memo, a, j, configs[j])
    f, ks = a.over_f, a.over_k
    sr, sn = s_rec[a.over_pair], s_new[a.over_pair]
    kernel_changed = np.array(changed, dtype=np.bool_)[a.over_j]
    base = durations[ks]
    contended = np.where(kernel_changed, a.durations_arr[ks] * (1.0 - f + f * sn / sr), base)
    durations[ks] = contended
    # without contention: the slowdown the trace measured for this kernel shape (alone vs
    # overlapped) taken out where it has one, under the recorded settings and moved by the
    # mechanism's ratio under others; else the mechanism's slowdown, out of the overlapped part
    measured = np.where(a.over_measured > 0, a.over_measured * sn / sr, 0.0)
    uncontended[ks] = np.where(measured != 0, contended / np.maximum(1.0, measured),
                               contended * (1.0 - f + f / sn))
    return durations, uncontended


def _slowdowns(mechanism: ReplayMechanism, memo: ReplayMemo, a: Anchor, j: int, config: CommConfig) -> np.ndarray:
    """The slowdowns of signature ``j``'s pairs (kernel shapes beside it) under ``config``."""
    key = (a.token, j, config)
    out = memo.signature_slowdowns.get(key)
    if out is None:
        sig = a.signatures[j]
        out = memo.signature_slowdowns.put(key, np.array(
            [_slowdown(mechanism, memo, a.pairs[p][2], a.pairs[p][0], sig, config) for p in a.sig_pairs[j].tolist()],
            dtype=np.float64))
    return out


def _slowdown(mechanism: ReplayMechanism, memo: ReplayMemo, op: ComputeOp, shape: tuple, sig: Signature,
              config: CommConfig) -> float:
    s = memo.slowdowns.get((shape, sig, config))
    if s is None:
        s = memo.slowdowns.put((shape, sig, config), max(1.0, mechanism.slowdown_beside(op, sig, config)))
    return s
