"""One collective across the ranks that recorded it, on one clock (issue 26).

A folder holds one trace per rank, each on its own host's clock; hosts' clocks differ by
hundreds of microseconds, as much as a collective's wait. This module joins the ranks:

- **Matching.** A collective's instances are matched across the ranks of its process
  group (Kineto's ``Process Group Name`` and ``Process Group Ranks``) and type, in their
  order on each rank (PyTorch issues one group's collectives in the same order on every
  member), allowing for instances a rank's profiling window cut off or a sampled trace
  dropped: a first offset per rank comes from the shift of each collective's sequence
  whose end differences agree best, and on that clock an instance joins the collective
  whose members end within half the sequence's shortest spacing of it. A send and its
  recv are one collective of their two ranks: where the trace names the peer (Kineto's
  ``Src Rank`` / ``Dst Rank``, kept as the op's :class:`~traces.workload.P2PLink`), the
  k-th send from a to b in a group is the k-th recv on b from a (NCCL pairs them in order
  per peer), in a group of any size, each side's sequence shifted (by at most
  ``SHIFT_TRIES``) to where its ends agree best; where it does not, a send/recv of a
  two-rank group is matched like any collective and one in a larger group with nothing. A CPU-side collective (a gloo
  job's, at the backend's worker span) ends when its thread returns, not when the data
  arrived, so its members' ends do not line up: those are matched by order alone, the
  k-th instance on each rank, each rank's sequence shifted (by at most ``SHIFT_TRIES``)
  to where its starts on the first clock agree best with the lowest rank's.
- **Clock alignment.** The members of one collective end together (each kernel ends once
  the data moved, a transfer after the last member arrived), within the collective's own
  skew. Each rank's offset is the one that best lines up the ends of every collective it
  shares with other ranks: alternating, per collective the mean of its members' aligned
  ends, per rank the median of (that mean - its own end), until the offsets settle; the
  lowest rank's clock is the reference. The residual skew is the spread of a matched
  collective's aligned ends (median and largest over collectives). With nothing matched
  the offsets are zero.
- **Waits.** On the aligned clock a member's wait for its peers is from its kernel's start
  to the last recorded member's start (clipped to its duration), and it waited for that
  member. Where the group has members without a trace (2 of 128 ranks recorded), those
  members' arrival is taken from the recorded ones' pattern: per rank and collective key
  the transfer is the ``TRANSFER_PERCENTILE``-th percentile of the instances' time less
  their recorded wait, and an instance that took longer than wait + transfer waited as
  long for a member the folder lacks (:data:`UNRECORDED`). That pattern needs several
  instances: with fewer than :data:`MIN_PATTERN_INSTANCES` of a key on a rank (one: its
  10th percentile is its own time, all transfer), the transfer is bounded by what the
  collective's size needs on the cluster under any setting NCCL could use (a
  :data:`TransferFloor` the caller gives where the cluster is known: this package knows
  no cluster), and the rest is wait for the members not recorded (:attr:`RankJoin.bounded`).

Linear in ranks x collectives (the offsets: a few dozen passes over the matched instances).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from nccl_env.knobs import CollectiveType
from traces.comm_split import TRANSFER_PERCENTILE, UNRECORDED, CommKey, RankComm

ALIGN_PASSES = 60  # the offsets' alternating passes (each halves a two-rank error at least)
ALIGN_SETTLED_US = 0.01  # offsets moving less than this in a pass have settled
CLOCK_RESOLUTION_US = 0.001  # Kineto's timestamps are in ns: less than this apart is the same time
SHIFT_TRIES = 3  # instances a rank's window may have cut off either end of a collective's sequence
SPARSE_PENALTY_US = 1e6  # fewer than three instances in common: agreement there is weak evidence
# a key's TRANSFER_PERCENTILE-th percentile is an instance's own time only from this many instances
# on (100 / 10): below it the pattern of unrecorded members' arrivals is not read, it is bounded
MIN_PATTERN_INSTANCES = round(100 / TRANSFER_PERCENTILE)

# (collective key, group size) -> the least time (us) the collective can take on the cluster under
# any setting NCCL could use, or None where that is not known (a CPU-side or unsized collective)
TransferFloor = Callable[[CommKey, int], "float | None"]

Pair = tuple[int, int]  # a send/recv's (src, dst) ranks
MatchKey = tuple[str, CollectiveType, Pair | None]  # (process group, collective type, a send/recv's ends)


@dataclass(frozen=True)
class ClockAlignment:
    """Per rank, what to add to its trace's times to reach the reference clock (the lowest rank's)."""

    offsets_us: dict[int, float]
    residual_us: float  # median over matched collectives of their aligned ends' spread
    residual_max_us: float  # the largest such spread
    matched: int  # collectives matched on two ranks or more (the evidence)

    def to_dict(self) -> dict:
        return {"offsets_us": {str(r): round(o, 3) for r, o in sorted(self.offsets_us.items())},
                "residual_skew_us": round(self.residual_us, 3), "residual_skew_max_us": round(self.residual_max_us, 3),
                "matched_collectives": self.matched}


@dataclass
class Match:
    """One collective: its recorded members (rank, op id) and its group's size."""

    group: str
    collective: CollectiveType
    group_size: int
    members: list[tuple[int, int]]  # (rank, op id), ranks ascending

    @property
    def modelled(self) -> int:
        """Members of its group without a trace."""
        return max(0, self.group_size - len(self.members))


@dataclass
class RankJoin:
    alignment: ClockAlignment
    matches: list[Match]
    wait_us: dict[int, dict[int, float]] = field(default_factory=dict)  # rank -> op id -> wait on the aligned clock
    waited_for: dict[int, dict[int, int]] = field(default_factory=dict)  # rank -> op id -> the rank it waited for
    # (its own rank: it waited for nobody; UNRECORDED: a member without a trace)
    # rank -> op id -> the transfer (us) the cluster bounded it to: a key seen too few times on the rank
    # for the pattern (MIN_PATTERN_INSTANCES), in a group with members not recorded
    bounded: dict[int, dict[int, float]] = field(default_factory=dict)

    @property
    def bounded_members(self) -> int:
        """Member-instances whose transfer the cluster bounded (the rest of their time: wait)."""
        return sum(len(ops) for ops in self.bounded.values())

    def bounded_wait_us(self) -> float:
        """The wait the bound found, summed over those member-instances (us)."""
        return sum(self.wait_us[r][op] for r, ops in self.bounded.items() for op in ops)

    @property
    def modelled_members(self) -> int:
        """Member-instances modelled rather than read, summed over the collectives."""
        return sum(m.modelled for m in self.matches)


@dataclass
class _Seq:
    """One rank's instances of one (group, collective), in start order."""

    op_ids: list[int]
    start_us: list[float]
    duration_us: list[float]
    keys: list[CommKey]


def _sequences(comm: RankComm) -> dict[MatchKey, _Seq]:
    rows: dict[MatchKey, list[tuple[float, int, float, CommKey]]] = {}
    for key, inst in comm.keys.items():
        for s, op, d in zip(inst.start_us, inst.op_ids, inst.duration_us):
            rows.setdefault((key[0], key[1], comm.p2p.get(op)), []).append((s, op, d, key))
    seqs = {}
    for mk, items in rows.items():
        items.sort(key=lambda x: (x[0], x[1]))
        seqs[mk] = _Seq([op for _, op, _, _ in items], [s for s, _, _, _ in items], [d for _, _, d, _ in items],
                        [k for _, _, _, k in items])
    return seqs


def join_ranks(ranks: list[RankComm], world_size: int | None = None,
               transfer_floor: TransferFloor | None = None) -> RankJoin:
    """Match, align and split every rank's collectives (the module docstring's rules);
    ``transfer_floor``: the cluster's bound on a thinly seen collective's transfer (None: not
    bounded, the pattern as it stands)."""
    seqs = {rc.rank: _sequences(rc) for rc in sorted(ranks, key=lambda rc: rc.rank)}  # any order of reading
    where: dict[tuple[int, int], tuple[float, float, CommKey]] = {}  # (rank, op) -> (start, duration, key)
    holders: dict[MatchKey, list[int]] = {}
    for rank, by_key in seqs.items():
        for mk, seq in by_key.items():
            holders.setdefault(mk, []).append(rank)
            for op, s, d, k in zip(seq.op_ids, seq.start_us, seq.duration_us, seq.keys):
                where[(rank, op)] = (s, d, k)
    sizes: dict[str, int] = {}
    for rc in ranks:
        for g, n in rc.group_sizes.items():
            sizes[g] = max(sizes.get(g, 0), n)
    default_size = world_size or len(ranks)
    order = sorted(seqs)
    cpu = {rc.rank for rc in ranks if rc.on_cpu}
    coarse = _coarse_offsets(seqs, order)
    matches: list[Match] = []
    for mk, rs in holders.items():
        pair = mk[2]
        size = 2 if pair is not None else sizes.get(mk[0], default_size)
        pairable = mk[1] is not CollectiveType.SENDRECV or size == 2
        stray = [r for r in rs if pair is not None and r not in pair]  # names a pair it is not an end of
        rs = sorted(r for r in rs if r not in stray)
        if not pairable or len(rs) <= 1:
            for r in rs + stray:
                matches.extend(Match(mk[0], mk[1], size, [(r, op)]) for op in seqs[r][mk].op_ids)
            continue
        by_order = all(r in cpu for r in rs)
        if pair is not None:  # NCCL's order per peer pair; kernels' ends agree, CPU-side ops' starts do
            found = _in_order([(r, seqs[r][mk]) for r in rs], coarse, by_ends=not by_order)
        else:
            found = (_in_order if by_order else _clusters)([(r, seqs[r][mk]) for r in rs], coarse)
        for members in found:
            matches.append(Match(mk[0], mk[1], max(size, len(members)), members))
        for r in stray:
            matches.extend(Match(mk[0], mk[1], size, [(r, op)]) for op in seqs[r][mk].op_ids)
    alignment = align_clocks(matches, where, order)
    out = RankJoin(alignment, matches)
    _split(out, where, sizes, default_size, transfer_floor, cpu)
    return out


def _ends(seq: _Seq) -> np.ndarray:
    return np.asarray(seq.start_us, dtype=float) + np.asarray(seq.duration_us, dtype=float)


def _coarse_offsets(seqs: dict[int, dict[MatchKey, _Seq]], order: list[int]) -> dict[int, float]:
    """Per rank, a first offset to the lowest rank's clock: per shared (group, collective), the
    instance shift (a window cuts a few instances off either end) whose end differences agree
    best (least median deviation); the rank's offset is that of its best-agreeing collective
    with a rank already placed (a pipeline's last stage shares nothing with the first)."""
    out = {order[0]: 0.0}
    left = order[1:]
    while left:
        found: dict[int, tuple[float, float]] = {}  # rank -> (deviation, offset) against a placed rank
        for r in left:
            for ref, ref_off in out.items():  # the lowest placed rank first: one comparison for most ranks
                hit = _best_shift(seqs[ref], seqs[r])
                if hit is not None and (r not in found or hit[0] < found[r][0]):
                    found[r] = (hit[0], ref_off + hit[1])
                    if hit[0] < SPARSE_PENALTY_US:  # three or more instances in common: good enough
                        break
        if not found:  # shares no collective with the placed ranks: its clock as recorded
            out.update(dict.fromkeys(left, 0.0))
            break
        out.update({r: o for r, (_, o) in found.items()})
        left = [r for r in left if r not in found]
    return out


def _shifted_differences(a: np.ndarray, b: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """For each shift of ``b``'s instances against ``a``'s (up to :data:`SHIFT_TRIES` either way:
    a profiling window may cut a few off either end), the shift and the time differences of the
    instances it pairs (a minus b); shifts that pair none are skipped."""
    for shift in range(-SHIFT_TRIES, SHIFT_TRIES + 1):
        x, y = a[max(0, shift):], b[max(0, -shift):]
        n = min(x.size, y.size)
        if n:
            yield shift, x[:n] - y[:n]


def _best_shift(ref: dict[MatchKey, _Seq], other: dict[MatchKey, _Seq]) -> tuple[float, float] | None:
    """(deviation, offset) of ``other``'s clock to ``ref``'s from their best-agreeing shared collective."""
    best: tuple[float, float] | None = None
    for mk, seq in other.items():
        if mk not in ref:
            continue
        for _, d in _shifted_differences(_ends(ref[mk]), _ends(seq)):
            n = d.size
            med = float(np.median(d))
            dev = float(np.median(np.abs(d - med))) + (0.0 if n >= 3 else SPARSE_PENALTY_US)
            if best is None or dev < best[0]:
                best = (dev, med)
    return best


def _clusters(holders: list[tuple[int, _Seq]], coarse: dict[int, float]) -> list[list[tuple[int, int]]]:
    """One (group, collective)'s instances on several ranks grouped into collectives: sorted by
    their end on the roughly aligned clock, an instance joins the open collective when it ends
    within half the key's shortest spacing of it and its rank is not in it yet."""
    items: list[tuple[float, int, int]] = []
    spacing = math.inf
    for r, seq in holders:
        ends = _ends(seq) + coarse.get(r, 0.0)
        if ends.size >= 2:
            spacing = min(spacing, float(np.min(np.diff(np.sort(ends)))))
        items.extend(zip(ends.tolist(), [r] * ends.size, seq.op_ids))
    tol = 0.5 * spacing if spacing < math.inf else math.inf
    items.sort()
    out: list[list[tuple[int, int]]] = []
    first = -math.inf
    ranks_in: set[int] = set()
    for end, r, op in items:
        if out and end - first <= tol and r not in ranks_in:
            out[-1].append((r, op))
            ranks_in.add(r)
        else:
            out.append([(r, op)])
            first, ranks_in = end, {r}
    for members in out:
        members.sort()
    return out


def _in_order(holders: list[tuple[int, _Seq]], coarse: dict[int, float],
              by_ends: bool = False) -> list[list[tuple[int, int]]]:
    """One (group, collective)'s instances on several ranks grouped by their order: the k-th of
    each rank's sequence, shifted to agree best (least median start difference's deviation on
    the roughly aligned clock; ``by_ends``: the ends') with the first holder's."""

    def times(seq: _Seq) -> np.ndarray:
        return _ends(seq) if by_ends else np.asarray(seq.start_us, dtype=float)

    (r0, ref), rest = holders[0], holders[1:]
    a = times(ref) + coarse.get(r0, 0.0)
    out: dict[int, list[tuple[int, int]]] = {i: [(r0, op)] for i, op in enumerate(ref.op_ids)}
    for r, seq in rest:
        b = times(seq) + coarse.get(r, 0.0)
        best = (math.inf, 0)
        for shift, d in _shifted_differences(a, b):
            best = min(best, (float(np.median(np.abs(d - np.median(d)))) + abs(shift) * CLOCK_RESOLUTION_US, shift))
        shift = best[1]
        for j, op in enumerate(seq.op_ids):
            out.setdefault(j + shift, []).append((r, op))  # past the first holder's ends: its own collective
    return [sorted(m) for _, m in sorted(out.items())]


def align_clocks(matches: list[Match], where: dict[tuple[int, int], tuple[float, float, CommKey]],
                 ranks: list[int]) -> ClockAlignment:
    """Offsets that line up matched collectives' ends (module docstring)."""
    shared = [m for m in matches if len(m.members) >= 2]
    offsets = dict.fromkeys(ranks, 0.0)
    if not shared:
        return ClockAlignment(offsets, 0.0, 0.0, 0)
    match_of, rank_of, ends = [], [], []
    for i, m in enumerate(shared):
        for r, op in m.members:
            s, d, _ = where[(r, op)]
            match_of.append(i)
            rank_of.append(r)
            ends.append(s + d)
    mi, end = np.asarray(match_of), np.asarray(ends, dtype=float)
    ri = np.asarray([ranks.index(r) for r in rank_of])
    counts = np.bincount(mi, minlength=len(shared)).astype(float)
    per_rank = [np.flatnonzero(ri == j) for j in range(len(ranks))]
    off = np.zeros(len(ranks))
    for _ in range(ALIGN_PASSES):
        aligned = end + off[ri]
        mean = np.bincount(mi, weights=aligned, minlength=len(shared)) / counts
        gap = mean[mi] - aligned
        step = np.array([float(np.median(gap[idx])) if idx.size else 0.0 for idx in per_rank])
        off += step
        off -= off[0]
        if np.max(np.abs(step)) < ALIGN_SETTLED_US:
            break
    aligned = end + off[ri]
    hi = np.full(len(shared), -np.inf)
    lo = np.full(len(shared), np.inf)
    np.maximum.at(hi, mi, aligned)
    np.minimum.at(lo, mi, aligned)
    spread = hi - lo
    return ClockAlignment({r: float(off[j]) for j, r in enumerate(ranks)}, float(np.median(spread)),
                          float(np.max(spread)), len(shared))


def _split(out: RankJoin, where: dict[tuple[int, int], tuple[float, float, CommKey]], sizes: dict[str, int],
           default_size: int, floor: TransferFloor | None, cpu: set[int]) -> None:
    """Each instance's wait on the aligned clock and whom it waited for; then the members without
    a trace, from each rank's key pattern, or where it has too few instances from ``floor``
    (module docstring)."""
    off = out.alignment.offsets_us
    partial: list[tuple[int, int]] = []
    for m in out.matches:
        arrivals = [(where[(r, op)][0] + off[r], r) for r, op in m.members]
        last, who = max(arrivals)
        for (arrival, r), (_, op) in zip(arrivals, m.members):
            s, d, _ = where[(r, op)]
            wait = min(d, max(0.0, last - arrival))
            if wait < CLOCK_RESOLUTION_US:  # the aligned clocks' rounding, not a wait
                wait = 0.0
            out.wait_us.setdefault(r, {})[op] = wait
            out.waited_for.setdefault(r, {})[op] = who if wait > 0.0 else r
            if m.modelled:
                partial.append((r, op))
    by_key: dict[tuple[int, CommKey], list[tuple[int, float]]] = {}  # (rank, key) -> (op, time less wait)
    for (r, op), (_, d, key) in where.items():
        by_key.setdefault((r, key), []).append((op, d - out.wait_us[r][op]))
    transfer = {rk: float(np.percentile([t for _, t in items], TRANSFER_PERCENTILE)) for rk, items in by_key.items()}
    floors: dict[CommKey, float | None] = {}
    for r, op in partial:
        _, d, key = where[(r, op)]
        least = transfer[(r, key)]
        bound = None
        if floor is not None and r not in cpu and len(by_key[(r, key)]) < MIN_PATTERN_INSTANCES:
            if key not in floors:
                floors[key] = floor(key, sizes.get(key[0], default_size))
            bound = floors[key]
        if bound is not None and bound < least:
            least = bound
        extra = d - least
        if extra > out.wait_us[r][op]:
            out.wait_us[r][op] = min(d, extra)
            out.waited_for[r][op] = UNRECORDED
            if least is bound:
                out.bounded.setdefault(r, {})[op] = least
