"""Every rank at once: the ranks' execution graphs joined at their collectives (issue 26).

Each rank's graph is scheduled as :mod:`costmodel.replay.schedule` schedules one rank
(the same rules: CPU threads as chains moving with their last wait, a GPU op at
``max(call' + latency, ready' + gap)``), and the ranks meet at every collective
:mod:`traces.rank_join` matched:

- a collective's kernel starts on a rank when that rank launched it and its stream and
  producers were done (its *arrival*, on the rank's own clock);
- it ends, on every recorded member, a transfer after the last member's arrival on the
  aligned clock: ``end_m = max_j(arrival_j + offset_j) - offset_m + transfer_m``. The
  wait for peers is not held: it emerges from the peers' schedules;
- members without a trace (a folder with 2 of 128 ranks): the measured instance says how
  much later than the last recorded member they arrived (``delta``, from the recorded
  members' waits, :mod:`traces.rank_join`); in a replay they arrive ``delta`` after the
  recorded members' measured last arrival, moved as much as the least-moved recorded
  member moved (a what-if scoped to some ranks leaves the unrecorded ones alone; one on
  every rank moves them with the rest). A collective only one rank has is thus today's
  held wait.

What every joint replay of one job shares is built once, on a :class:`JointData`: each
rank's :class:`~costmodel.replay.data.ReplayData`, its graph's successor edges, the
ranks' join (:mod:`traces.rank_join`) and per matched collective its members, measured
last arrival and transfers. Its lifetime is its holder's (:class:`lagom.orchestration.joint_run.JointEvaluator`
holds one per folder for every plan it judges; a test builds one per job); nothing is
kept anywhere else.

The per-op time source is explicit and small: ``durations[rank]``, one duration per op in
:attr:`~costmodel.replay.schedule.ReplayStatic.op_ids` order, as a one-rank replay under
the plan would use them (:func:`costmodel.replay.anchor.durations_under` on the rank's
anchor): a collective's duration there holds its wait (the graph's ``comm_wait_us``) plus
its transfer under the plan, so its transfer under the plan is ``duration - held wait``.
Rank-scoped what-ifs (:class:`RankScale`) then scale a rank's compute kernels, its
collectives' transfers (a collective no other recorded rank has: its whole time, as a
one-rank what-if does) and its CPU's own time. With the measured durations and no scale
every rank's schedule is its trace (checked by tests/test_joint_replay.py).

Each rank's figures (steps, collectives, exposed) are its own one-rank replay with each
op's joint duration, so they follow the one-rank definitions exactly (and its Timing's
``replay`` is the rank's ReplayData, for the export); the job's step is the slowest
rank's. One pass over every rank's nodes: linear in ranks x ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodel.evaluator import StepTiming, Timing
from costmodel.replay.data import ReplayData
from costmodel.replay.schedule import GraphArrays, ReplayStatic, graph_edges, replay
from nccl_env.errors import LagomError
from traces.comm_split import rank_comm
from traces.gc_pause import no_cyclic_gc
from traces.rank_join import ClockAlignment, RankJoin, join_ranks
from traces.workload import Workload

_NO = -1


@dataclass(frozen=True)
class RankScale:
    """A what-if on one rank: its compute kernels', collectives' transfers' and CPU's time x F."""

    compute: float = 1.0
    comm: float = 1.0
    cpu: float = 1.0


@dataclass
class JointTiming:
    ranks: dict[int, Timing]  # each rank's own replay (its steps, collectives, exposed)
    steps: list[StepTiming]  # the job's: per step, the slowest rank's
    slowest: list[int]  # per job step, the rank it is
    alignment: ClockAlignment
    modelled_members: int  # member-instances of collectives taken from the pattern, not read
    matched: int  # collectives joining two recorded ranks or more
    held: int = 0  # matched collectives whose members' order contradicted their graphs: waits held as measured
    timing: Timing = field(init=False)  # the job's figures (per step means of ``steps``)

    def __post_init__(self) -> None:
        steps = self.steps
        count = max(1, len(steps))
        self.timing = Timing(
            iteration_us=sum(s.iteration_us for s in steps) / count,
            compute_us=sum(s.compute_us for s in steps) / count,
            comm_us=sum(s.comm_us for s in steps) / count,
            exposed_comm_us=sum(s.exposed_comm_us for s in steps) / count,
            compute_uncontended_us=sum(s.compute_us for s in steps) / count,
            steps=steps,
        )


@dataclass
class _Rank:
    """One rank's graph with its successors (the edges :func:`costmodel.replay.schedule.replay` follows), as
    :func:`_flatten` lays it into the joint graph."""

    st: ReplayStatic
    succ: list[list[int]]
    indeg: list[int]  # the in-degrees before any node ran (a replay counts down a copy)
    offset_us: float


class JointData:
    """One job's ranks as every joint replay of them schedules them, built once (the module
    docstring): per rank its :class:`ReplayData` (``data``; ``held`` gives ones already built)
    and graph edges, the join, and per matched collective its recorded members (rank, op
    index), measured last arrival on the aligned clock, the lag of members without a trace,
    and each member's measured transfer. Do not mutate the workloads while it is held."""

    def __init__(self, workloads: list[Workload], joined: RankJoin | None = None,
                 held: Mapping[int, ReplayData] | None = None) -> None:
        if not workloads:
            raise LagomError("joint replay: no rank to replay")
        with no_cyclic_gc():  # millions of small containers, no cycles (traces/gc_pause.py)
            self._build(workloads, joined, held or {})

    def _build(self, workloads: list[Workload], joined: RankJoin | None, held: Mapping[int, ReplayData]) -> None:
        self.data: dict[int, ReplayData] = {}
        for w in sorted(workloads, key=lambda w: w.rank):
            d = held.get(w.rank)
            self.data[w.rank] = d if d is not None and d.serves(w) else ReplayData(w)
        if joined is None:
            joined = join_ranks([rank_comm(w, cpu_job=True) for w in workloads], max(w.world_size for w in workloads))
        self.joined = joined
        off = joined.alignment.offsets_us
        self.ranks: dict[int, _Rank] = {}
        for r, d in self.data.items():
            succ, indeg = _succ(d.static)
            self.ranks[r] = _Rank(d.static, succ, indeg, off.get(r, 0.0))
        index = {r: {op: k for k, op in enumerate(rk.st.op_ids)} for r, rk in self.ranks.items()}
        self.members: list[list[tuple[int, int]]] = []
        self.last_meas: list[float] = []
        self.lag_unrec: list[float] = []
        self.transfer: dict[tuple[int, int], float] = {}  # measured; a replay scales a copy
        for m in joined.matches:
            mem = [(r, index[r][op]) for r, op in m.members if r in index and op in index[r]]
            if not mem:
                continue
            self.members.append(mem)
            arrivals = [self.ranks[r].st.measured_start[k] + self.ranks[r].offset_us for r, k in mem]
            waits = [joined.wait_us[r][self.ranks[r].st.op_ids[k]] for r, k in mem]
            recorded_last = max(arrivals)
            last = max([recorded_last] + [a + w for a, w in zip(arrivals, waits)])
            self.last_meas.append(last)
            self.lag_unrec.append(last - recorded_last if m.modelled else 0.0)
            for r, k in mem:
                st = self.ranks[r].st
                end_aligned = st.measured_start[k] + st.measured_dur[k] + self.ranks[r].offset_us
                self.transfer[(r, k)] = end_aligned - last
        self.flat = _flatten(self)

    def measured_durations(self) -> dict[int, list[float]]:
        """Per rank its ops' measured durations (the time source with which every rank is its trace)."""
        return {r: list(d.static.measured_dur) for r, d in self.data.items()}


def _succ(st: ReplayStatic) -> tuple[list[list[int]], list[int]]:
    return graph_edges(len(st.op_ids), len(st.wait_end), st.preds, st.launch_wait, st.wait_awaited,
                       st.wait_prev, st.wait_cause)


def joint_replay(data: JointData, durations: Mapping[int, Sequence[float] | np.ndarray],
                 scales: dict[int, RankScale] | None = None,
                 uncontended: Mapping[int, np.ndarray] | None = None) -> JointTiming:
    """Every rank of ``data`` (one job's) scheduled at once, each op's time from ``durations``
    (``uncontended``: the same with no collective beside it, for the compute slowdown)."""
    with no_cyclic_gc():  # per rank and node a few floats and lists, no cycles to find
        return _joint_replay(data, durations, scales, uncontended)


def _joint_replay(data: JointData, durations: Mapping[int, Sequence[float] | np.ndarray],
                  scales: dict[int, RankScale] | None,
                  uncontended: Mapping[int, np.ndarray] | None) -> JointTiming:
    from costmodel.replay.schedule_kernel import joint_pass  # numba: loaded by the first replay, not by imports

    f = data.flat
    scales = scales or {}
    parts = []
    for r, rk in data.ranks.items():
        d = np.asarray(durations[r], dtype=np.float64)
        if d.shape != (len(rk.st.op_ids),):
            raise LagomError(f"joint replay: rank {r}: {d.size} durations for {len(rk.st.op_ids)} ops")
        parts.append(d)
    plan = np.concatenate(parts)
    per_rank = [scales.get(r, RankScale()) for r in f.ranks]
    compute = np.repeat([sc.compute for sc in per_rank], f.op_count)
    comm = np.repeat([sc.comm for sc in per_rank], f.op_count)
    cpu = np.array([sc.cpu for sc in per_rank], dtype=np.float64)
    dur = np.where(f.is_compute, plan * compute, plan)
    # a collective no other recorded rank has: its time as a one-rank what-if scales it
    dur = np.where(f.alone_coll, dur * comm, dur)
    # a matched collective's transfer under the plan and its rank's scale: the measured transfer x the
    # plan's (duration - the wait the source held) over the measured one's
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(f.base > 0, (plan - f.kept) / f.base, 1.0)
    transfer = np.where(f.match_of >= 0, f.transfer * (ratio * comm), f.transfer)
    args = (f.n, f.succ_ptr, f.succ_idx, f.indeg, *f.graph.rule_arrays(), cpu[f.op_rank], cpu[f.wait_rank],
            f.match_of, f.mem_ptr, f.mem_idx, f.op_offset, f.last_meas, f.lag_unrec, transfer, dur)
    starts, ends, _, held, stuck = joint_pass(*args)
    if stuck:
        raise LagomError(f"joint replay: {stuck} of {f.n + f.graph.wait_end.size} nodes never ran: the ranks' graphs "
                         "contradict each other")
    timings = {}
    for i, r in enumerate(f.ranks):
        lo, hi = f.op_base[i], f.op_base[i + 1]
        u = None
        if uncontended is not None:
            u = np.array(uncontended[r], dtype=np.float64)
            u = np.where(f.is_compute[lo:hi], u * per_rank[i].compute, u)
        t = replay(data.ranks[r].st, ends[lo:hi] - starts[lo:hi], u, cpu=per_rank[i].cpu)
        t.replay = data.data[r]
        timings[r] = t
    return _job(timings, data.joined, int(held.sum()))


@dataclass
class _FlatGraph:
    """Every rank's graph as one (ops of rank ``ranks[i]`` at ``op_base[i]:op_base[i + 1]``, its waits after
    the ranks' before; node ``n + j`` is wait ``j``) in the arrays one rank's graph has (``graph``), with the
    successors Kahn's order walks and the join: what :func:`costmodel.replay.schedule_kernel.joint_pass` reads."""

    ranks: list[int]
    op_base: np.ndarray
    op_count: np.ndarray
    n: int
    op_rank: np.ndarray  # op -> index into ranks
    wait_rank: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    indeg: np.ndarray
    graph: GraphArrays  # threads renumbered per rank (a thread a rank's anchors lack: -1)
    is_compute: np.ndarray
    alone_coll: np.ndarray  # an on-GPU collective no other recorded rank joins
    match_of: np.ndarray  # op -> its match (-1: none)
    mem_ptr: np.ndarray
    mem_idx: np.ndarray
    op_offset: np.ndarray  # op -> its rank's clock offset
    last_meas: np.ndarray
    lag_unrec: np.ndarray
    transfer: np.ndarray  # op -> its measured transfer (matched ops)
    kept: np.ndarray  # op -> the wait a one-rank source holds in its duration (matched ops)
    base: np.ndarray  # op -> its measured duration less that wait


def _shifted(values: np.ndarray, by: int) -> np.ndarray:
    """Indexes moved by ``by``, -1 (none) kept."""
    return np.where(values >= 0, values + by, values)


def _ptr(parts: list[np.ndarray]) -> np.ndarray:
    """CSR pointers of ranks' CSR pointers laid end to end."""
    out, at = [np.zeros(1, dtype=np.int64)], 0
    for p in parts:
        out.append(p[1:] + at)
        at += int(p[-1])
    return np.concatenate(out)


def _flatten(data: JointData) -> _FlatGraph:
    ranks = sorted(data.ranks)
    sts = [data.ranks[r].st for r in ranks]
    arrs = [st.graph_arrays for st in sts]
    op_count = np.array([len(st.op_ids) for st in sts], dtype=np.int64)
    wait_count = np.array([len(st.wait_end) for st in sts], dtype=np.int64)
    thread_count = np.array([a.anchor.shape[0] for a in arrs], dtype=np.int64)
    op_base = np.concatenate([[0], np.cumsum(op_count)]).astype(np.int64)
    wait_base = np.concatenate([[0], np.cumsum(wait_count)]).astype(np.int64)
    thread_base = np.concatenate([[0], np.cumsum(thread_count)]).astype(np.int64)
    n = int(op_base[-1])

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(a, name) for a in arrs])

    def thread_ids(name: str) -> np.ndarray:  # a thread the rank's anchors do not hold stays out of range (-1)
        return np.concatenate([np.where((getattr(a, name) >= 0) & (getattr(a, name) < thread_count[i]),
                                        getattr(a, name) + thread_base[i], -1) for i, a in enumerate(arrs)])

    def node(i: int, v: int) -> int:  # rank i's node v (ops, then waits) in the joint graph
        k = int(op_count[i])
        return int(op_base[i]) + v if v < k else n + int(wait_base[i]) + v - k

    succ_rows: list[list[int]] = []
    indeg: list[int] = []
    for part in (0, 1):  # every op, then every wait
        for i, r in enumerate(ranks):
            rk = data.ranks[r]
            k = int(op_count[i])
            nodes = range(k) if part == 0 else range(k, k + int(wait_count[i]))
            succ_rows.extend([node(i, s) for s in rk.succ[v]] for v in nodes)
            indeg.extend(rk.indeg[v] for v in nodes)
    succ_ptr = np.zeros(len(succ_rows) + 1, dtype=np.int64)
    succ_ptr[1:] = np.cumsum([len(row) for row in succ_rows])
    succ_idx = np.fromiter((x for row in succ_rows for x in row), dtype=np.int64, count=int(succ_ptr[-1]))
    match_of = np.full(n, -1, dtype=np.int64)
    transfer = np.zeros(n)
    kept = np.zeros(n)
    base = np.zeros(n)
    mem_rows: list[list[int]] = []
    index = {r: i for i, r in enumerate(ranks)}
    for m, mem in enumerate(data.members):
        mem_rows.append([int(op_base[index[r]]) + k for r, k in mem])
        for r, k in mem:
            g = int(op_base[index[r]]) + k
            match_of[g] = m
            transfer[g] = data.transfer[(r, k)]
            st = data.ranks[r].st
            measured = st.measured_dur[k]
            held_wait = min(measured, data.data[r].graph.comm_wait_us.get(st.op_ids[k], 0.0))
            kept[g] = held_wait
            base[g] = measured - held_wait
    mem_ptr = np.zeros(len(mem_rows) + 1, dtype=np.int64)
    mem_ptr[1:] = np.cumsum([len(row) for row in mem_rows])
    mem_idx = np.fromiter((x for row in mem_rows for x in row), dtype=np.int64, count=int(mem_ptr[-1]))
    graph = GraphArrays(
        order=np.zeros(0, dtype=np.int64), pred_ptr=_ptr([a.pred_ptr for a in arrs]),
        pred_idx=np.concatenate([a.pred_idx + op_base[i] for i, a in enumerate(arrs)]),
        launch_call=cat("launch_call"), launch_latency=cat("launch_latency"), launch_thread=thread_ids("launch_thread"),
        launch_wait=np.concatenate([_shifted(a.launch_wait, int(wait_base[i])) for i, a in enumerate(arrs)]),
        gap=cat("gap"), measured_start=cat("measured_start"), wait_thread=thread_ids("wait_thread"),
        wait_prev=np.concatenate([_shifted(a.wait_prev, int(wait_base[i])) for i, a in enumerate(arrs)]),
        wait_begin=cat("wait_begin"), wait_own=cat("wait_own"), wait_end=cat("wait_end"),
        wait_return=cat("wait_return"), awaited_ptr=_ptr([a.awaited_ptr for a in arrs]),
        awaited_idx=np.concatenate([a.awaited_idx + op_base[i] for i, a in enumerate(arrs)]),
        wait_cause_thread=thread_ids("wait_cause_thread"),
        wait_cause=np.concatenate([_shifted(a.wait_cause, int(wait_base[i])) for i, a in enumerate(arrs)]),
        wait_cause_us=cat("wait_cause_us"), anchor=cat("anchor"), is_coll=cat("is_coll"))
    return _FlatGraph(
        ranks=ranks, op_base=op_base, op_count=op_count, n=n,
        op_rank=np.repeat(np.arange(len(ranks)), op_count), wait_rank=np.repeat(np.arange(len(ranks)), wait_count),
        succ_ptr=succ_ptr, succ_idx=succ_idx, indeg=np.asarray(indeg, dtype=np.int64), graph=graph,
        is_compute=np.concatenate([np.asarray(st.is_compute, dtype=np.bool_) for st in sts]),
        alone_coll=graph.is_coll & (match_of < 0), match_of=match_of, mem_ptr=mem_ptr, mem_idx=mem_idx,
        op_offset=np.repeat([data.ranks[r].offset_us for r in ranks], op_count).astype(np.float64),
        last_meas=np.asarray(data.last_meas, dtype=np.float64), lag_unrec=np.asarray(data.lag_unrec, dtype=np.float64),
        transfer=transfer, kept=kept, base=base)


def _job(timings: dict[int, Timing], joined: RankJoin, held: int) -> JointTiming:
    """The job's steps: per step name (in the lowest rank's order), the slowest rank's step, its
    measured time the slowest rank's measured step."""
    names: list[str] = []
    for t in timings.values():
        names.extend(s.name for s in t.steps if s.name not in names)
    steps, slowest = [], []
    for name in names:
        found = [(r, s) for r, t in timings.items() for s in t.steps if s.name == name]
        if len(found) < len(timings):
            continue  # a step not every rank completed
        r, step = max(found, key=lambda x: (x[1].iteration_us, -x[0]))
        measured = max(s.measured_iteration_us for _, s in found)
        steps.append(StepTiming(step.name, step.iteration_us, step.comm_us, step.exposed_comm_us, measured,
                                step.measured_comm_us, step.measured_exposed_comm_us, step.compute_us,
                                step.measured_compute_us, step.critical_comm_us, step.measured_critical_comm_us,
                                step.unexplained_idle_us))
        slowest.append(r)
    matched = sum(1 for m in joined.matches if len(m.members) >= 2)
    return JointTiming(timings, steps, slowest, joined.alignment, joined.modelled_members, matched, held)
