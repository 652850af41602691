"""Wait versus transfer: how much of each NCCL kernel's measured time was waiting for peers.

An NCCL kernel starts on a rank when that rank launches it, but moves data only once
every peer has arrived: its measured time is the wait for the slowest peer plus the
transfer. Only the transfer answers to NCCL settings (channels, protocol, chunk...).

Per collective key (process group, collective type, message bytes) the transfer time is
estimated from the trace:

- **one rank's trace**: the fastest instances of the key: the transfer is the
  ``TRANSFER_PERCENTILE``-th percentile of the instances' durations (an instance that
  found every peer already there took about this long), and each instance's wait is its
  duration above that (never negative);
- **several ranks' traces of one job**: the k-th instance of a key on each rank is the
  same collective; it could move data only once the last rank launched it, so a rank's
  wait is ``max(start over ranks) - its start`` (clipped to its duration) and its
  transfer the rest. The key's transfer is the median of those.

``basis`` says which estimate a key got.
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass

import numpy as np

from nccl_env.knobs import CollectiveType
from traces.workload import CollectiveOp, Workload

TRANSFER_PERCENTILE = 10.0  # the fastest tenth of a key's instances found their peers ready

CommKey = tuple[str, CollectiveType, int | None, bool]  # (group, collective, message bytes, nccl_tunable)


@dataclass(frozen=True)
class CommSplitRow:
    """One collective key on one rank: its instances' time split into wait and transfer."""

    group: str
    collective: CollectiveType
    message_bytes: int | None  # None: not recorded
    count: int
    total_us: float
    wait_us: float  # summed over the instances
    transfer_us: float  # summed over the instances
    transfer_per_call_us: float  # the key's estimated transfer time of one instance
    basis: str  # traces.exec_graph.WAIT_BASIS_FASTEST or WAIT_BASIS_RANKS

    def to_dict(self) -> dict:
        return {
            "group": self.group, "collective": self.collective.value, "message_bytes": self.message_bytes,
            "count": self.count, "total_us": round(self.total_us, 3), "wait_us": round(self.wait_us, 3),
            "transfer_us": round(self.transfer_us, 3), "transfer_per_call_us": round(self.transfer_per_call_us, 3),
            "basis": self.basis,
        }


def comm_key(op: CollectiveOp) -> CommKey:
    return (op.group, op.collective, op.message_bytes, op.nccl_tunable)


@dataclass
class KeyInstances:
    """One collective key's on-GPU instances on one rank, in start order, as flat arrays."""

    op_ids: array[int]
    start_us: array[float]
    duration_us: array[float]


@dataclass
class RankComm:
    """What the wait/transfer split needs of one rank: its on-GPU collectives per key (keys in the
    order of their first instance). About 24 bytes a collective, so the ranks of a large job
    fit in one process where their Workloads would not (lagom.rank_pool)."""

    rank: int
    keys: dict[CommKey, KeyInstances]


def rank_comm(workload: Workload) -> RankComm:
    keys: dict[CommKey, KeyInstances] = {}
    for c in sorted((c for c in workload.collectives if c.on_gpu), key=lambda c: (c.start_us, c.op_id)):
        key = comm_key(c)
        inst = keys.get(key)
        if inst is None:
            inst = keys[key] = KeyInstances(array("q"), array("d"), array("d"))
        inst.op_ids.append(c.op_id)
        inst.start_us.append(c.start_us)
        inst.duration_us.append(c.duration_us)
    return RankComm(workload.rank, keys)


def key_waits(ranks: list[RankComm]) -> dict[int, dict[CommKey, list[float]]]:
    """rank -> key -> each instance's wait (us), in the order of :class:`KeyInstances`.

    The k-th instances of a key on the ranks that have it are one collective: each waited
    ``max(start over those ranks) - its start``; a key only one rank has gets the
    fastest-instances estimate. One pass over the instances: linear in ranks x collectives."""
    holders: dict[CommKey, list[KeyInstances]] = {}
    for rc in ranks:
        for key, inst in rc.keys.items():
            holders.setdefault(key, []).append(inst)
    last_start: dict[CommKey, list[float]] = {}
    for key, insts in holders.items():
        if len(insts) > 1:
            last = list(insts[0].start_us)
            for inst in insts[1:]:
                starts = inst.start_us
                shared = min(len(last), len(starts))
                last[:shared] = [a if a >= b else b for a, b in zip(last[:shared], starts[:shared])]
                if len(starts) > shared:
                    last.extend(starts[shared:])
            last_start[key] = last
    out: dict[int, dict[CommKey, list[float]]] = {}
    for rc in ranks:
        waits: dict[CommKey, list[float]] = {}
        for key, inst in rc.keys.items():
            if key in last_start:
                last = last_start[key]
                waits[key] = [min(d, max(0.0, t - s)) for s, d, t in zip(inst.start_us, inst.duration_us, last)]
            else:
                transfer = float(np.percentile(inst.duration_us, TRANSFER_PERCENTILE))
                waits[key] = [max(0.0, d - transfer) for d in inst.duration_us]
        out[rc.rank] = waits
    return out


def op_waits(comm: RankComm, waits: dict[CommKey, list[float]]) -> dict[int, float]:
    """collective op id -> wait us, for one rank."""
    return {op: w for key, inst in comm.keys.items() for op, w in zip(inst.op_ids, waits[key])}


def split_waits(workloads: list[Workload]) -> dict[int, dict[int, float]]:
    """rank -> (collective op id -> wait us) for every on-GPU collective of every workload."""
    comms = [rank_comm(w) for w in workloads]
    by_key = key_waits(comms)
    return {c.rank: op_waits(c, by_key[c.rank]) for c in comms}


def split_rows(workload: Workload, waits: dict[int, float], basis: str) -> list[CommSplitRow]:
    """One row per collective key of ``workload``, largest total time first."""
    groups: dict[CommKey, list[tuple[float, float]]] = {}
    for c in workload.collectives:
        if c.on_gpu and c.nccl_tunable and c.op_id in waits:  # NCCL's kernels: the only ones a setting tunes
            groups.setdefault(comm_key(c), []).append((c.duration_us, waits[c.op_id]))
    return _rows(groups, basis)


def split_rows_compact(comm: RankComm, waits: dict[CommKey, list[float]], keep: set[int] | None,
                       basis: str) -> list[CommSplitRow]:
    """:func:`split_rows` from one rank's compact data: the instances whose op id is in ``keep``
    (all when None), e.g. those of a trimmed view of the workload."""
    groups: dict[CommKey, list[tuple[float, float]]] = {}
    for key, inst in comm.keys.items():
        if key[3]:
            triples = zip(inst.op_ids, inst.duration_us, waits[key])
            pairs = [(d, w) for op, d, w in triples if keep is None or op in keep]
            if pairs:
                groups[key] = pairs
    return _rows(groups, basis)


def _rows(groups: dict[CommKey, list[tuple[float, float]]], basis: str) -> list[CommSplitRow]:
    """One row per key from its instances' (duration, wait) in start order."""
    rows = []
    for (group, coll, size, _), pairs in groups.items():
        wait = sum(w for _, w in pairs)
        total = sum(d for d, _ in pairs)
        per_call = statistics.median(d - w for d, w in pairs)
        rows.append(CommSplitRow(group, coll, size, len(pairs), total, wait, total - wait, per_call, basis))
    rows.sort(key=lambda r: (-r.total_us, r.collective.value, -1 if r.message_bytes is None else r.message_bytes))
    return rows
