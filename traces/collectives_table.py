"""The collectives of a Workload, grouped by (type, group size, message size), with exposed time.

A collective whose size the trace did not record has ``message_bytes`` None (shown as
"unknown"); communication kernels that are not NCCL's get rows of their own
(``nccl_tunable`` False), and so do collectives NCCL moved off its ring/tree kernels
(``recorded_path``: symmetric kernels, or the copy engines, which hold no SM).

Exposed time is the part of a collective's duration during which no compute kernel
(memcpy/memset excluded) runs on the rank: the communication the iteration waits for.
CPU-side collectives (``on_gpu=False``) are measured against the same compute kernels;
in a CPU-only trace there are none, so all their time is exposed.
"""

from __future__ import annotations

from dataclasses import dataclass

from nccl_env.knobs import CollectiveType, CommPath
from traces.intervals import CoverIndex, union
from traces.workload import Workload


@dataclass(frozen=True)
class CollectiveRow:
    collective: CollectiveType
    group_size: int
    message_bytes: int | None  # None: not recorded
    count: int
    total_us: float
    exposed_us: float
    on_gpu: bool
    nccl_tunable: bool = True  # False: not an NCCL kernel, NCCL's knobs do not reach it
    recorded_path: CommPath | None = None  # NCCL's symmetric kernels or copy engines; None: its kernels

    @property
    def exposed_pct(self) -> float:
        return 100.0 * self.exposed_us / self.total_us if self.total_us > 0 else 0.0


def compute_cover(workload: Workload) -> CoverIndex:
    """Merged busy time of the compute kernels (memory ops excluded)."""
    return CoverIndex(union((o.start_us, o.end_us) for o in workload.compute_ops if not o.is_memory_op))


def exposed_us(workload: Workload) -> dict[int, float]:
    """Collective op id -> time (us) not overlapped by any compute kernel."""
    cover = compute_cover(workload)
    return {c.op_id: c.duration_us - cover.covered(c.start_us, c.end_us) for c in workload.collectives}


def collectives_table(workload: Workload) -> list[CollectiveRow]:
    """One row per (type, group size, message bytes, on_gpu, nccl_tunable, recorded_path), largest total time first."""
    exposed = exposed_us(workload)
    rows: dict[tuple, list] = {}
    for c in workload.collectives:
        key = (c.collective, workload.group_size(c.group), c.message_bytes, c.on_gpu, c.nccl_tunable, c.recorded_path)
        acc = rows.setdefault(key, [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += c.duration_us
        acc[2] += exposed[c.op_id]
    out = [CollectiveRow(k[0], k[1], k[2], n, total, exp, k[3], k[4], k[5]) for k, (n, total, exp) in rows.items()]
    out.sort(key=lambda r: (-r.total_us, r.collective.value, -1 if r.message_bytes is None else r.message_bytes))
    return out
