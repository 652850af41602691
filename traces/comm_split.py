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
- **several ranks' traces of one job**: each collective's instances are matched across
  the ranks of its group and the ranks' clocks aligned (:mod:`traces.rank_join`); it
  could move data only once the last member launched it, so a rank's wait is ``max(start
  over members) - its start`` on the aligned clock (clipped to its duration), plus, where
  the group has members without a trace, what the rank's own pattern says they kept it
  waiting; its transfer is the rest. The key's transfer is the median of those.

``basis`` says which estimate a key got.
"""

from __future__ import annotations

import statistics
from array import array
from dataclasses import dataclass, field, replace

from nccl_env.knobs import CollectiveType
from traces.workload import CollectiveOp, Workload

TRANSFER_PERCENTILE = 10.0  # the fastest tenth of a key's instances found their peers ready
UNRECORDED = -1  # a collective waited for a member of its group whose trace the folder lacks

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
    waited_for: str = "-"  # whom its instances waited for most often (:func:`waited_for_label`)
    bounded: int = 0  # instances whose transfer the cluster bounded (traces.rank_join.RankJoin.bounded)

    def to_dict(self) -> dict:
        return {
            "group": self.group, "collective": self.collective.value, "message_bytes": self.message_bytes,
            "count": self.count, "total_us": round(self.total_us, 3), "wait_us": round(self.wait_us, 3),
            "transfer_us": round(self.transfer_us, 3), "transfer_per_call_us": round(self.transfer_per_call_us, 3),
            "basis": self.basis, "waited_for": self.waited_for, "transfer_bounded": self.bounded,
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
    fit in one process where their Workloads would not (lagom.orchestration.rank_pool)."""

    rank: int
    keys: dict[CommKey, KeyInstances]
    group_sizes: dict[str, int] = field(default_factory=dict)  # the size of each group of its collectives
    on_cpu: bool = False  # its collectives are CPU-side ones (a gloo job's; ``rank_comm(cpu_job=True)``)
    p2p: dict[int, tuple[int, int]] = field(default_factory=dict)  # op id -> a send/recv's (src, dst) where known


def rank_comm(workload: Workload, cpu_job: bool = False) -> RankComm:
    """One rank's on-GPU collectives. ``cpu_job``: where none ran on the GPU (a gloo job: one
    CPU-side op per collective, at the backend's worker span), those instead: the joint replay
    matches them across ranks; the wait/transfer split reads NCCL's kernels only."""
    keys: dict[CommKey, KeyInstances] = {}
    p2p: dict[int, tuple[int, int]] = {}
    on_cpu = cpu_job and not any(c.on_gpu for c in workload.collectives)
    for c in sorted((c for c in workload.collectives if c.on_gpu or on_cpu), key=lambda c: (c.start_us, c.op_id)):
        key = comm_key(c)
        inst = keys.get(key)
        if inst is None:
            inst = keys[key] = KeyInstances(array("q"), array("d"), array("d"))
        inst.op_ids.append(c.op_id)
        inst.start_us.append(c.start_us)
        inst.duration_us.append(c.duration_us)
        if c.p2p is not None:
            p2p[c.op_id] = (c.p2p.src, c.p2p.dst)
    return RankComm(workload.rank, keys, {g: workload.group_size(g) for g in {k[0] for k in keys}}, on_cpu, p2p)


def key_waits(ranks: list[RankComm]) -> dict[int, dict[CommKey, list[float]]]:
    """rank -> key -> each instance's wait (us), in the order of :class:`KeyInstances`:
    matched across ranks on aligned clocks (:func:`traces.rank_join.join_ranks`); a
    collective only one rank has gets the fastest-instances estimate. Linear in ranks x
    collectives."""
    from traces.rank_join import join_ranks  # rank_join builds on this module's types

    return join_waits(ranks, join_ranks(ranks).wait_us)


def join_waits(ranks: list[RankComm], wait_us: dict[int, dict[int, float]]) -> dict[int, dict[CommKey, list[float]]]:
    """rank -> key -> waits, from op id -> wait per rank."""
    return {rc.rank: {key: [wait_us[rc.rank][op] for op in inst.op_ids] for key, inst in rc.keys.items()}
            for rc in ranks}


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
                       basis: str, waited_for: dict[int, int] | None = None,
                       bounded: dict[int, float] | None = None) -> list[CommSplitRow]:
    """:func:`split_rows` from one rank's compact data: the instances whose op id is in ``keep``
    (all when None), e.g. those of a trimmed view of the workload. ``waited_for``: op id -> the
    rank it waited for (:mod:`traces.rank_join`), named per key; ``bounded``: the op ids whose
    transfer the cluster bounded, counted per key."""
    groups: dict[CommKey, list[tuple[float, float]]] = {}
    whom: dict[CommKey, str] = {}
    held: dict[CommKey, int] = {}
    for key, inst in comm.keys.items():
        if key[3]:
            triples = zip(inst.op_ids, inst.duration_us, waits[key])
            pairs = [(d, w) for op, d, w in triples if keep is None or op in keep]
            if pairs:
                groups[key] = pairs
                kept = [op for op in inst.op_ids if keep is None or op in keep]
                held[key] = sum(1 for op in kept if op in (bounded or {}))
                if waited_for is not None:
                    whom[key] = waited_for_label([waited_for.get(op, comm.rank) for op in kept], comm.rank)
    rows = _rows(groups, basis)
    return [replace(r, waited_for=whom.get(k, "-"), bounded=held.get(k, 0))
            for r, k in ((r, (r.group, r.collective, r.message_bytes, True)) for r in rows)]


def waited_for_label(ranks: list[int], own: int) -> str:
    """Whom a key's instances waited for most often: ``rank N (k/n)``, ``no trace (k/n)`` (a member
    whose trace the folder lacks, :data:`UNRECORDED`), ``-`` when none waited."""
    waited = [r for r in ranks if r != own]
    if not waited:
        return "-"
    who = statistics.mode(waited)
    name = "no trace" if who == UNRECORDED else f"rank {who}"
    return f"{name} ({waited.count(who)}/{len(ranks)})"


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
