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

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from costmodel.evaluator import StepTiming, Timing
from costmodel.replay.data import ReplayData
from costmodel.replay.schedule import ReplayStatic, graph_edges, replay
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
    """One rank's graph with its successors (the edges :func:`costmodel.replay.schedule.replay` follows)."""

    st: ReplayStatic
    succ: list[list[int]]
    indeg: list[int]  # the in-degrees before any node ran (a replay counts down a copy)
    offset_us: float
    match_of: dict[int, int]  # op index -> match index (collectives of the join)


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
            self.ranks[r] = _Rank(d.static, succ, indeg, off.get(r, 0.0), {})
        index = {r: {op: k for k, op in enumerate(rk.st.op_ids)} for r, rk in self.ranks.items()}
        self.members: list[list[tuple[int, int]]] = []
        self.last_meas: list[float] = []
        self.lag_unrec: list[float] = []
        self.transfer: dict[tuple[int, int], float] = {}  # measured; a replay scales a copy
        for m in joined.matches:
            mem = [(r, index[r][op]) for r, op in m.members if r in index and op in index[r]]
            if not mem:
                continue
            i = len(self.members)
            self.members.append(mem)
            arrivals = [self.ranks[r].st.measured_start[k] + self.ranks[r].offset_us for r, k in mem]
            waits = [joined.wait_us[r][self.ranks[r].st.op_ids[k]] for r, k in mem]
            recorded_last = max(arrivals)
            last = max([recorded_last] + [a + w for a, w in zip(arrivals, waits)])
            self.last_meas.append(last)
            self.lag_unrec.append(last - recorded_last if m.modelled else 0.0)
            for r, k in mem:
                self.ranks[r].match_of[k] = i
                st = self.ranks[r].st
                end_aligned = st.measured_start[k] + st.measured_dur[k] + self.ranks[r].offset_us
                self.transfer[(r, k)] = end_aligned - last

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
    joined = data.joined
    scales = scales or {}
    ranks = {r: _Rank(rk.st, rk.succ, list(rk.indeg), rk.offset_us, rk.match_of) for r, rk in data.ranks.items()}
    members, last_meas, lag_unrec = data.members, data.last_meas, data.lag_unrec
    transfer = dict(data.transfer)
    # the transfer under the plan and the rank's scale
    dur: dict[int, list[float]] = {}
    unc: dict[int, np.ndarray | None] = {}
    for r, rk in ranks.items():
        st = rk.st
        d = [float(x) for x in durations[r]]
        if len(d) != len(st.op_ids):
            raise LagomError(f"joint replay: rank {r}: {len(d)} durations for {len(st.op_ids)} ops")
        sc = scales.get(r, RankScale())
        graph = data.data[r].graph
        u = None if uncontended is None else np.array(uncontended[r], dtype=np.float64)
        for k in range(len(d)):
            if st.is_compute[k]:
                d[k] *= sc.compute
                if u is not None:
                    u[k] *= sc.compute
            elif k in rk.match_of:
                measured = st.measured_dur[k]
                kept = min(measured, graph.comm_wait_us.get(st.op_ids[k], 0.0))  # the wait the source held
                base = measured - kept
                ratio = (d[k] - kept) / base if base > 0 else 1.0
                transfer[(r, k)] *= ratio * sc.comm
            elif st.is_coll[k]:  # no recorded peer: its time as a one-rank what-if scales it
                d[k] *= sc.comm
        dur[r] = d
        unc[r] = u
    cpu_of = {r: scales.get(r, RankScale()).cpu for r in ranks}
    starts = {r: [0.0] * len(rk.st.op_ids) for r, rk in ranks.items()}
    ends = {r: [0.0] * len(rk.st.op_ids) for r, rk in ranks.items()}
    new_end = {r: list(rk.st.wait_end) for r, rk in ranks.items()}
    queue: deque[tuple[int, int]] = deque((r, v) for r, rk in ranks.items() for v in range(len(rk.indeg))
                                          if rk.indeg[v] == 0)
    done = 0
    total = sum(len(rk.indeg) for rk in ranks.values())

    def release(r: int, v: int) -> None:
        rk = ranks[r]
        for s in rk.succ[v]:
            rk.indeg[s] -= 1
            if rk.indeg[s] == 0:
                queue.append((r, s))

    def at(r: int, thread: int, j: int, t: float) -> float:
        st, cpu = ranks[r].st, cpu_of[r]
        if j >= 0:
            return new_end[r][j] + cpu * (t - st.wait_end[j])
        if cpu == 1.0:
            return t
        a = st.thread_anchor.get(thread, t)
        return a + cpu * (t - a)

    def _step(r: int, v: int) -> int:
        """Schedule node ``v`` of rank ``r`` (the rules of costmodel.replay.schedule); 1: one node done."""
        rk = ranks[r]
        st = rk.st
        n = len(st.op_ids)
        if v < n:
            ready, by = -math.inf, _NO
            e = ends[r]
            for p in st.preds[v]:
                if e[p] > ready:
                    ready, by = e[p], p
            call = st.launch_call[v]
            if call == call:
                t = at(r, st.launch_thread[v], st.launch_wait[v], call) + st.launch_latency[v]
                if by >= 0 and ready + st.gap[v] > t:
                    t = ready + st.gap[v]
            elif by >= 0:
                t = ready + st.gap[v]
            else:
                t = st.measured_start[v]
            starts[r][v] = t
            i = rk.match_of.get(v, _NO)
            if i < 0:
                ends[r][v] = t + dur[r][v]
                release(r, v)
                return 1
            if i in held:
                hold(r, v, i)
                return 1
            came[i].append((r, v))
            if len(came[i]) < len(members[i]):
                return 1
            mem = members[i]
            aligned = [starts[q][k] + ranks[q].offset_us for q, k in mem]
            last = max(aligned)
            if lag_unrec[i] > 0:
                moved = min(starts[q][k] - ranks[q].st.measured_start[k] for q, k in mem)
                last = max(last, last_meas[i] + moved)
            for q, k in mem:
                ends[q][k] = max(starts[q][k], last - ranks[q].offset_us + transfer[(q, k)])
                release(q, k)
        else:
            j = v - n
            finish = -math.inf
            begin = st.wait_begin[j]
            cpu = cpu_of[r]
            if begin == begin:
                finish = at(r, st.wait_thread[j], st.wait_prev[j], begin) + cpu * st.wait_own[j]
            for a in st.wait_awaited[j]:
                finish = max(finish, ends[r][a] + st.wait_return[j])
            cause_us = st.wait_cause_us[j]
            if cause_us == cause_us:
                finish = max(finish, at(r, st.wait_cause_thread[j], st.wait_cause[j], cause_us) + st.wait_return[j])
            new_end[r][j] = finish if finish != -math.inf else st.wait_end[j]
            release(r, v)
        return 1

    held: set[int] = set()  # matches whose members' order contradicts their graphs: waits held as measured
    came: list[list[tuple[int, int]]] = [[] for _ in members]  # per match, its members arrived so far

    def hold(q: int, k: int, i: int) -> None:
        """A member of a held match ends as it would with its measured wait (the one-rank replay)."""
        st = ranks[q].st
        wait = max(0.0, last_meas[i] - st.measured_start[k] - ranks[q].offset_us)
        ends[q][k] = max(starts[q][k], starts[q][k] + wait + transfer[(q, k)])
        release(q, k)

    while True:
        while queue:
            done += _step(*queue.popleft())
        if done == total:
            break
        stalled = [i for i in range(len(members)) if came[i] and len(came[i]) < len(members[i]) and i not in held]
        if not stalled:
            raise LagomError(f"joint replay: {total - done} of {total} nodes never ran: the ranks' graphs "
                             "contradict each other")
        for i in stalled:  # break the cycle: these collectives keep their measured waits
            held.add(i)
            for q, k in came[i]:
                hold(q, k, i)

    timings = {}
    for r in sorted(ranks):
        t = replay(ranks[r].st, [e - s for s, e in zip(starts[r], ends[r])], unc[r],
                   cpu=cpu_of[r])
        t.replay = data.data[r]
        timings[r] = t
    return _job(timings, joined, len(held))


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
