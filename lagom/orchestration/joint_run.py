"""``lagom simulate DIR`` and ``lagom tune DIR``: every rank of a folder replayed at once.

A folder of two traces or more is one job's ranks: they are replayed jointly
(:mod:`costmodel.replay.joint`, docs/replay.md "Every rank at once") and a step's time
is the job's, the slowest rank's; ``--rank N`` keeps the one-rank replay of rank N.
What-ifs take a rank set: ``--scale compute=1.3@5``, ``--scale comm=0.5@0-3``
(``@A-B+C`` joins sets); without one a factor applies to every rank.

The per-op time source of the joint replay is the command's evaluator: each rank's ops'
durations under the plan, as its one-rank replay takes them (its mechanism, anchor and memo:
:func:`costmodel.replay.anchor.durations_under`). The folder's replay data
(:class:`costmodel.replay.joint.JointData`) are built once, when the
:class:`JointEvaluator` is, and live as long as it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import DurationScale, Timing, TraceEvaluator, check_plan
from costmodel.replay.anchor import durations_under
from costmodel.replay.joint import JointData, JointTiming, RankScale, joint_replay
from costmodel.replay.trace_evaluator import ReplayEvaluator
from costmodel.replay.transfer_floor import transfer_floor
from lagom.args.rank_args import ExecutorKind, RankReading
from nccl_env.errors import LagomError
from nccl_env.plan import Plan
from traces.comm_split import rank_comm
from traces.rank_join import MIN_PATTERN_INSTANCES, RankJoin, join_ranks
from traces.trace_job import set_comm_waits
from traces.workload import Workload

SCALE_KEYS = ("comm", "compute", "cpu")


@dataclass(frozen=True)
class ScaleItem:
    key: str  # comm | compute | cpu
    factor: float
    ranks: frozenset[int] | None  # None: every rank


def parse_scale_items(items: list[str]) -> list[ScaleItem]:
    """``key=F`` or ``key=F@SET`` parts (comma-separated or the flag repeated); SET is ``N``, ``A-B``
    or such sets joined with ``+``. A key given twice for one rank is refused."""
    out: list[ScaleItem] = []
    for item in items:
        for part in item.split(","):
            key, eq, value = part.strip().partition("=")
            if key not in SCALE_KEYS or not eq:
                raise LagomError(f"--scale {item}: expected comm=F, compute=F or cpu=F, optionally @RANKS "
                                 "(e.g. --scale comm=0.5 or --scale compute=1.3@5)")
            value, at, ranks_text = value.partition("@")
            try:
                factor = float(value)
            except ValueError:
                raise LagomError(f"--scale {item}: {value!r} is not a number") from None
            if not (math.isfinite(factor) and 0 < factor <= 1000):
                raise LagomError(f"--scale {item}: the factor must be > 0 and at most 1000")
            ranks = _rank_set(ranks_text, item) if at else None
            for other in out:
                if other.key == key and (other.ranks is None or ranks is None or other.ranks & ranks):
                    raise LagomError(f"--scale: {key} given twice for one rank")
            out.append(ScaleItem(key, factor, ranks))
    return out


def _rank_set(text: str, item: str) -> frozenset[int]:
    ranks: set[int] = set()
    for piece in text.split("+"):
        lo, dash, hi = piece.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise LagomError(f"--scale {item}: {text!r} is not a rank set (N, A-B, joined with +)") from None
        if a < 0 or b < a:
            raise LagomError(f"--scale {item}: {piece!r} is not a rank range")
        ranks.update(range(a, b + 1))
    return frozenset(ranks)


def scale_for_rank(items: list[ScaleItem], rank: int) -> DurationScale | None:
    """The one-rank replay's what-if: the factors whose rank set holds ``rank``."""
    factors = {i.key: i.factor for i in items if i.ranks is None or rank in i.ranks}
    return DurationScale(**factors) if factors else None


def check_scale_ranks(items: list[ScaleItem], ranks: list[int], source: str) -> None:
    """Refuse a rank set naming a rank the input (``source``, holding ``ranks``) lacks: a what-if
    on a rank that is not there would change nothing and pass for an answer."""
    for i in items:
        absent = sorted(i.ranks - set(ranks)) if i.ranks is not None else []
        if absent:
            raise LagomError(f"--scale {i.key}={i.factor:g}@{_ranges(absent)}: {source} holds no rank "
                             f"{_ranges(absent)} (it holds rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)})")


def rank_scales(items: list[ScaleItem], ranks: list[int]) -> dict[int, RankScale]:
    """Per rank of the folder its what-if; a rank set naming a rank the folder lacks is refused."""
    check_scale_ranks(items, ranks, "the folder")
    out = {}
    for r in ranks:
        f = {i.key: i.factor for i in items if i.ranks is None or r in i.ranks}
        out[r] = RankScale(compute=f.get("compute", 1.0), comm=f.get("comm", 1.0), cpu=f.get("cpu", 1.0))
    return out


def _ranges(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return str(ranks[0])
    return f"{min(ranks)}-{max(ranks)}" if ranks == list(range(min(ranks), max(ranks) + 1)) else str(sorted(ranks))


@dataclass
class WorkloadInput:
    """``simulate``'s and ``tune``'s WORKLOAD as read."""

    workload: Workload  # the workload replayed or reported
    from_trace: bool
    workloads: list[Workload] | None  # every rank of a folder when they are replayed jointly, else None
    ranks: list[int]  # the ranks the input holds: what a what-if's rank set and --rank may name
    read: list[Workload]  # every rank read (a folder's with --rank too): whose collectives split the waits
    # (empty: a folder read as one rank, whose waits stay as read)


def read_workload_or_ranks(text: str, rank: int | None, reading: RankReading, joint: bool = True) -> WorkloadInput:
    """``simulate``'s and ``tune``'s WORKLOAD. ``joint`` False (``--unprofiled-cpu``) reads a
    folder as one rank, as before. ``--rank N`` naming a rank the input lacks is refused, on a
    file as on a folder."""
    folder = read_folder_ranks(text, rank, reading) if joint else None
    if folder is not None:
        chosen, every = folder
        ranks = sorted(w.rank for w in every)
        return WorkloadInput(chosen, True, every if rank is None else None, ranks, every)
    from lagom.orchestration.workload_arg import read_workload_arg

    workload, from_trace = read_workload_arg(text, reading)
    if rank is not None and (not from_trace or workload.rank != rank):
        held = f"holds rank {workload.rank} (the rank replayed)" if from_trace else "is not a trace"
        raise LagomError(f"--rank {rank}: {text} {held}")
    # a folder read as its lowest rank (--unprofiled-cpu): that rank's waits were split among all
    # the folder's ranks as it was read; split again alone they would lose the others
    from traces.reader import trace_files

    alone = not (Path(text).is_dir() and len(trace_files(text)) > 1)
    return WorkloadInput(workload, from_trace, None, [workload.rank], [workload] if alone else [])


def read_folder_ranks(text: str, rank: int | None,
                      reading: RankReading | None = None) -> tuple[Workload, list[Workload]] | None:
    """A trace folder of two ranks or more: (the rank replayed or reported first: ``--rank``'s, else
    the lowest; every rank), read on ``reading``'s executor. None: not such a folder (read as before)."""
    path = Path(text)
    if not text.strip() or not path.is_dir():
        return None
    from traces.reader import read_trace, trace_files

    files = trace_files(path)
    if len(files) < 2:
        return None
    if reading is not None and reading.executor is not ExecutorKind.LOCAL:
        from lagom.orchestration.rank_pool import read_all_ranks

        workloads = read_all_ranks(path, reading)
    else:
        workloads = read_trace(path)
    if rank is not None:
        chosen = [w for w in workloads if w.rank == rank]
        if not chosen:
            raise LagomError(f"--rank {rank}: {path} holds ranks {_ranges([w.rank for w in workloads])}")
        return chosen[0], workloads
    lowest = min(workloads, key=lambda w: w.rank)
    for w in workloads:  # what the reader said of every rank (each line names its file), printed with the lowest's
        if w is not lowest:
            lowest.input_warnings.extend(w.input_warnings)
    return lowest, workloads


def bound_transfers(read: list[Workload], cluster: ClusterSpec) -> RankJoin | None:
    """Every rank's NCCL kernels split again into wait and transfer, now that the cluster is known:
    a collective a rank saw too few times for the pattern of its unrecorded members' arrivals has
    its transfer bounded by the least time the cluster allows it (:mod:`costmodel.replay.transfer_floor`)
    and the rest is wait for the ranks not recorded. Sets each workload's waits (its execution
    graph's, as the reader did) and returns the join for :class:`JointData`; None where nothing is
    split (no NCCL kernel: a gloo job's CPU-side collectives keep the reader's split)."""
    comms = [rank_comm(w) for w in read if w.exec_graph is not None]
    if not comms or len(comms) < len(read) or not any(c.keys for c in comms):
        return None
    joined = join_ranks(comms, max(w.world_size for w in read), transfer_floor(cluster))
    for w in read:
        set_comm_waits(w, joined.wait_us.get(w.rank, {}), len(read))
    return joined


def bounded_line(joined: RankJoin | None, cluster_name: str) -> str | None:
    """The one line that says where a collective's transfer is the cluster's bound, not the trace's."""
    if joined is None or not joined.bounded_members:
        return None
    n = joined.bounded_members
    return (f"{n} collective instance{'s' if n > 1 else ''} in groups with ranks not recorded, seen fewer than "
            f"{MIN_PATTERN_INSTANCES} times on a rank (too few to read the unrecorded ranks' arrivals from): "
            f"transfer bounded by the least time {cluster_name} allows under any NCCL setting (the analytic "
            f"model), the rest, {joined.bounded_wait_us() / 1e3:,.2f} ms, called wait for ranks not recorded")


class JointEvaluator:
    """An evaluator over a folder's ranks: a plan's Timing is the job's (its steps the slowest
    rank's), each rank's op durations under the plan from ``inner``'s mechanism (the tuner
    sees a plain Evaluator). It holds the folder's :class:`JointData`, built here once."""

    def __init__(self, inner: TraceEvaluator, workloads: list[Workload],
                 scales: dict[int, RankScale] | None = None, joined: RankJoin | None = None) -> None:
        if not isinstance(inner, ReplayEvaluator):  # a folder's ranks are traces: make_evaluator gives a replay
            raise LagomError("joint replay: the ranks' times come from a trace's replay evaluator")
        self.inner: ReplayEvaluator = inner
        self.workloads, self.scales = workloads, scales or {}
        # every plan's joint replay reads it; lives as long as this evaluator. ``joined``: the ranks'
        # join already made (bound_transfers), else made here
        self.data = JointData(workloads, joined)
        self.last: JointTiming | None = None

    @property
    def evaluations(self) -> int:
        return self.inner.evaluations

    @evaluations.setter
    def evaluations(self, value: int) -> None:
        self.inner.evaluations = value

    def durations(self, plan: Plan) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
        """Per rank, its ops' durations under ``plan`` and the same with no collective beside them
        (one evaluation of each rank's ops counted on ``inner``)."""
        check_plan(plan, getattr(self.inner.mechanism, "cluster", None))
        inner = self.inner
        durations, uncontended = {}, {}
        for r, d in self.data.data.items():
            durations[r], uncontended[r] = durations_under(inner.mechanism, d.anchor(inner.gpus_per_node), plan,
                                                           inner.memo)
        inner.evaluations += len(self.data.data)
        return durations, uncontended

    def joint(self, plan: Plan, scales: dict[int, RankScale] | None = None) -> JointTiming:
        durations, uncontended = self.durations(plan)
        self.last = joint_replay(self.data, durations, self.scales if scales is None else scales, uncontended)
        return self.last

    def evaluate(self, workload: Workload, plan: Plan, scale: DurationScale | None = None) -> Timing:
        """The job's figures under ``plan``, with ``workload``'s rank's ops (what the tuner's
        objective reads) and its share of compute time uncontended. The what-if is the rank
        scales given at construction; a ``scale`` here is refused."""
        if scale is not None and not scale.is_identity:
            raise LagomError("joint replay: give the what-if as rank scales (JointEvaluator(..., scales))")
        return self.timing_of(self.joint(plan), workload.rank)

    @staticmethod
    def timing_of(joint: JointTiming, rank: int) -> Timing:
        own = joint.ranks[rank]
        share = own.compute_uncontended_us / own.compute_us if own.compute_us > 0 else 1.0
        return replace(joint.timing, ops=own.ops, uncontended_us=own.uncontended_us,
                       compute_uncontended_us=joint.timing.compute_us * share)


def joint_identity(jev: JointEvaluator) -> Timing:
    """The job replayed under the trace's own settings and times (the replay's fidelity)."""
    return jev.joint(Plan(), scales={}).timing


def ranks_json(joint: JointTiming) -> dict:
    """``"ranks": {"0": {"steps": [...], "clock_offset_us": ...}, ...}``."""
    return {str(r): {"steps": [s.to_dict() for s in t.steps],
                     "clock_offset_us": round(joint.alignment.offsets_us.get(r, 0.0), 3)}
            for r, t in sorted(joint.ranks.items())}


def joint_json(joint: JointTiming) -> dict:
    return {"ranks": len(joint.ranks), "matched_collectives": joint.matched,
            "modelled_members": joint.modelled_members, "held_collectives": joint.held,
            "slowest_rank_per_step": joint.slowest,
            **joint.alignment.to_dict()}


def joint_line(joint: JointTiming) -> str:
    a = joint.alignment
    offsets = ", ".join(f"{r}: {o:+.1f}" for r, o in sorted(a.offsets_us.items()))
    return (f"{len(joint.ranks)} ranks replayed jointly; step = the slowest rank's (per step: ranks "
            f"{', '.join(map(str, joint.slowest))}); clock offsets (us) {{{offsets}}} from {a.matched} matched "
            f"collectives, residual skew median {a.residual_us:.1f} us, max {a.residual_max_us:.1f} us; "
            f"{joint.modelled_members} members of partly recorded groups modelled, not read"
            + (f"; {joint.held} collectives whose ranks' order contradicts their graphs keep their measured waits"
               if joint.held else ""))
