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


def split_waits(workloads: list[Workload]) -> dict[int, dict[int, float]]:
    """rank -> (collective op id -> wait us) for every on-GPU collective of every workload."""
    by_rank: dict[int, dict[CommKey, list[CollectiveOp]]] = {}
    for w in workloads:
        seqs: dict[CommKey, list[CollectiveOp]] = {}
        for c in sorted((c for c in w.collectives if c.on_gpu), key=lambda c: (c.start_us, c.op_id)):
            seqs.setdefault(comm_key(c), []).append(c)
        by_rank[w.rank] = seqs
    out: dict[int, dict[int, float]] = {}
    for rank, seqs in by_rank.items():
        waits: dict[int, float] = {}
        for key, ops in seqs.items():
            peers = [s[key] for r, s in by_rank.items() if r != rank and key in s]
            if peers:
                for i, op in enumerate(ops):
                    last = max([op.start_us, *(p[i].start_us for p in peers if i < len(p))])
                    waits[op.op_id] = min(op.duration_us, max(0.0, last - op.start_us))
            else:
                transfer = float(np.percentile([o.duration_us for o in ops], TRANSFER_PERCENTILE))
                for op in ops:
                    waits[op.op_id] = max(0.0, op.duration_us - transfer)
        out[rank] = waits
    return out


def split_rows(workload: Workload, waits: dict[int, float], basis: str) -> list[CommSplitRow]:
    """One row per collective key of ``workload``, largest total time first."""
    groups: dict[CommKey, list[CollectiveOp]] = {}
    for c in workload.collectives:
        if c.on_gpu and c.nccl_tunable and c.op_id in waits:  # NCCL's kernels: the only ones a setting tunes
            groups.setdefault(comm_key(c), []).append(c)
    rows = []
    for (group, coll, size, _), ops in groups.items():
        wait = sum(waits[o.op_id] for o in ops)
        total = sum(o.duration_us for o in ops)
        per_call = statistics.median(o.duration_us - waits[o.op_id] for o in ops)
        rows.append(CommSplitRow(group, coll, size, len(ops), total, wait, total - wait, per_call, basis))
    rows.sort(key=lambda r: (-r.total_us, r.collective.value, -1 if r.message_bytes is None else r.message_bytes))
    return rows
