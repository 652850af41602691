"""Paired Kineto traces of N ranks of one job (issue 26): tests/kineto_world.py's world, every rank at once.

Each rank runs its own program on its own CPU thread and GPU (a compute stream and an
NCCL stream) under kineto_world's rules; what joins them is NCCL's:

- a collective is matched across the ranks of its process group by the group and the
  order of the group's collectives on each rank (Kineto records ``Process Group Name``,
  ``Process Group Ranks`` and ``Seq``); a send and its recv are one collective of their
  two-rank group;
- its kernel starts on a rank when that rank launched it and its stream was free (the
  ``kineto_world`` start rule), and moves data only once the last member's kernel has
  started: every member's kernel ends at ``max(members' starts) + transfer``. The wait
  for peers is not an input: it emerges from the peers.

Each rank's host clock is off by a few hundred microseconds (``offsets_us``), as real
hosts' are: every timestamp of rank r's trace is shifted by ``offsets_us[r]``. The truth
comes from this module's own simulation in one true clock, never from the traces.

Programs (``PROGRAMS``): ``straggler`` (data parallel, one rank's compute slower),
``pipeline`` (four stages, GPipe micro-batches, send/recv between neighbours; ``_1f1b``:
in Megatron's 1F1B order; ``_strided``: one pipeline group [0, 8, 16, 24] of a world of 32,
only those ranks recorded) and ``moe`` (imbalanced expert compute between all-to-alls). A
send/recv's peer is written as PyTorch 2.5+ writes it (:func:`peer_metadata`). ``paired_ranks`` runs one twice:
the second time with rank-scoped factors (``compute={rank: F}``, ``comm=F``), and
returns both folders (one file per rank) with every rank's truth of both runs.
This module imports nothing of Lagom.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import kineto_world as kw

ALL_REDUCE = kw.Kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                       (4, 1, 1), (512, 1, 1), 96, 87568)
SEND_RECV = kw.Kernel("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", (2, 1, 1), (512, 1, 1), 96,
                      87568)  # NCCL 2.19+: one kernel for send, recv and all-to-all (grouped send/recv)


@dataclass(frozen=True)
class RankProgram:
    """One job's program. Times are mean durations on an A100 (jittered per instance)."""

    name: str
    kind: str  # "straggler" | "pipeline" | "moe"
    ranks: int = 4
    layers: int = 3
    compute_us: float = 300.0  # one GEMM
    comm_us: float = 250.0  # one collective's transfer
    micro_batches: int = 4  # pipeline
    p2p_world: bool = False  # pipeline: its send/recv in the global group of every rank, not one group per pair
    schedule: str = "gpipe"  # pipeline: "gpipe" (every forward, then every backward) | "1f1b" (Megatron's order)
    stage_ranks: tuple[int, ...] = ()  # pipeline: each stage's global rank, in one pipeline group of them all
    # (torchtitan/Megatron's [0, 8, 16, 24] of 32 ranks); () = ranks 0..ranks-1
    world: int = 0  # the job's world size (0: ``ranks``); ranks outside ``stage_ranks`` have no trace
    slow: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0)  # per rank: its compute kernels x this (a slow GPU, more tokens)
    offsets_us: tuple[float, ...] = (0.0, 310.0, -240.0, 470.0)  # per rank: its host clock's offset
    warmup_steps: int = 2
    steps: int = 6  # profiled ProfilerStep annotations (steps - 1 complete steps)
    jitter: float = 0.03

    def global_rank(self, stage: int) -> int:
        """Rank ``stage``'s (this module's index) global rank: its file's ``distributedInfo.rank``."""
        return self.stage_ranks[stage] if self.stage_ranks else stage

    @property
    def world_size(self) -> int:
        return self.world or (max(self.stage_ranks) + 1 if self.stage_ranks else self.ranks)

    def carrier(self) -> kw.Program:
        """What kineto_world's writer and truth read of a program."""
        return kw.Program(self.name, launch_threads=1, world_size=self.ranks, warmup_steps=self.warmup_steps,
                          steps=self.steps, jitter=self.jitter, cpu_op_us=15.0)


PROGRAMS: dict[str, RankProgram] = {p.name: p for p in (
    RankProgram("straggler", "straggler", slow=(1.0, 1.0, 1.45, 1.0)),
    RankProgram("pipeline", "pipeline", compute_us=250.0, comm_us=120.0),
    RankProgram("moe", "moe", slow=(1.0, 1.7, 0.8, 1.2), comm_us=200.0),
    RankProgram("pipeline_world", "pipeline", compute_us=250.0, comm_us=120.0, p2p_world=True),
    # issue 32's held-out pipelines: Megatron's 1F1B order, neighbours in two-rank groups; and one
    # pipeline group of four stages strided over a world of 32 (only the stages recorded)
    RankProgram("pipeline_1f1b", "pipeline", compute_us=250.0, comm_us=120.0, schedule="1f1b"),
    RankProgram("pipeline_strided", "pipeline", compute_us=250.0, comm_us=120.0, schedule="1f1b",
                stage_ranks=(0, 8, 16, 24), world=32),
)}


def peer_metadata(kind: str, group_ranks: list[int], own: int, peer: int) -> dict:
    """What PyTorch 2.5+ writes on a send/recv (torch/csrc/profiler/util.cpp saveNcclMeta, with
    ParamCommsDebugInfo's group ranks; docs/reference.md): ``Rank`` is the peer's rank in the
    group; a group whose ranks are evenly spaced lists them and names the peer's GLOBAL rank in
    ``Dst Rank`` (a send) or ``Src Rank`` (a recv); any other group lists none ("[]") and names
    no global peer."""
    stride = group_ranks[1] - group_ranks[0] if len(group_ranks) > 1 else 0
    even = stride > 0 and all(g == group_ranks[0] + i * stride for i, g in enumerate(group_ranks))
    meta: dict = {"Rank": group_ranks.index(peer), "Process Group Ranks": str(group_ranks) if even else "[]"}
    if even:
        meta["Dst Rank" if kind == "send" else "Src Rank"] = peer
        meta.update({"Global rank start": group_ranks[0], "Global rank stride": stride})
    return meta


# the generator's own keys in a collective's metadata (its members and peer as stage indices, the
# group's global ranks): what the simulation meets at, stripped from the traces it writes
_HIDDEN = ("_members", "_peer", "_group_ranks")
# what Kineto does not copy from record_param_comms onto the kernel (libkineto output_json.cpp
# appendCollectiveArgs): a kernel's peer without Dst/Src Rank is read through its External id
_NOT_ON_KERNELS = ("Rank", "Global rank start", "Global rank stride")


class _RankBuilder(kw._Builder):
    """One rank's actions; collectives carry their match key (group, sequence) in their metadata."""

    def __init__(self, p: RankProgram, rank: int, seed: int) -> None:
        super().__init__(p.carrier(), seed * 1000 + rank)
        self.rp, self.rank = p, rank
        self.group_seq: dict[str, int] = {}

    def gemm(self, name: str, share: float = 1.0) -> None:
        with self.op(kw.MAIN, name):
            self.launch(kw.MAIN, kw.GEMM, self.rp.compute_us * share * self.rp.slow[self.rank])

    def comm(self, name: str, group: str, ranks: list[int], kernel: kw.Kernel, nelems: int,
             share: float = 1.0, extra: dict | None = None, stream: int = kw.NCCL) -> None:
        """c10d's pattern: the NCCL stream waits for the compute stream, the kernel, then the
        compute stream waits for the NCCL stream. ``ranks``: the group's members (stage indices)."""
        m = kw.MAIN
        seq = self.group_seq[group] = self.group_seq.get(group, 0) + 1
        global_ranks = [self.rp.global_rank(x) for x in ranks]
        meta = {"Collective name": name, "In msg nelems": nelems, "Out msg nelems": nelems,
                "Group size": len(ranks), "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                "Process Group Name": group, "Process Group Description": group,
                "Process Group Ranks": str(global_ranks), "Rank": ranks.index(self.rank), "Seq": seq,
                **(extra or {}), "_members": list(ranks), "_group_ranks": global_ranks}
        key = f"{group}.{seq}"
        with self.op(m, f"c10d::{name}_"), self.op(m, "record_param_comms", args=meta, share=0.3):
            self.record(m, key + ".in", kw.COMPUTE)
            self.wait(m, stream, key + ".in")
            with self.op(m, f"nccl:{name}", cat="user_annotation", share=0.2):
                self.launch(m, kernel, self.rp.comm_us * share, stream, meta)
            self.record(m, key, stream)
        self.wait(m, kw.COMPUTE, key)

    def step(self, n: int) -> None:
        p, m, r = self.rp, kw.MAIN, self.rank
        self.threads[m].append(kw.Action("begin", name=f"ProfilerStep#{n}", cat="user_annotation"))
        world = list(range(p.ranks))
        if p.kind == "straggler":
            for _i in range(p.layers):
                self.gemm("aten::linear")
                self.gemm("aten::linear", 0.5)
            for _i in range(p.layers):
                self.gemm("aten::mm", 1.5)
                self.comm("allreduce", "0", world, ALL_REDUCE, 4 << 20)
        elif p.kind == "pipeline":
            mb = p.micro_batches

            def p2p(kind: str, peer: int) -> None:
                """A send/recv to ``peer``, its metadata as PyTorch writes it (peer_metadata). The
                1F1B programs run each peer pair on its own NCCL stream, as ProcessGroupNCCL's
                unbatched send/recv do (a communicator and stream per pair)."""
                if p.stage_ranks:
                    ranks, group = world, "pp"
                else:
                    ranks = world if p.p2p_world else sorted((r, peer))
                    group = "0" if p.p2p_world else f"pp{ranks[0]}{ranks[1]}"
                stream = kw.NCCL + 1 + min(r, peer) if p.schedule == "1f1b" else kw.NCCL
                meta = peer_metadata(kind, [p.global_rank(x) for x in ranks], p.global_rank(r), p.global_rank(peer))
                self.comm(kind, group, ranks, SEND_RECV, 2 << 20, extra={**meta, "_peer": peer}, stream=stream)

            def forward(recv: bool = True, send: bool = True) -> None:
                if r > 0 and recv:
                    p2p("recv", r - 1)
                self.gemm("aten::linear")
                if r + 1 < p.ranks and send:
                    p2p("send", r + 1)

            def backward(recv: bool = True, send: bool = True) -> None:
                if r + 1 < p.ranks and recv:
                    p2p("recv", r + 1)
                self.gemm("aten::mm", 2.0)
                if r > 0 and send:
                    p2p("send", r - 1)

            if p.schedule == "1f1b":
                # Megatron-LM's forward_backward_pipelining_without_interleaving: warm-up forwards,
                # then one forward and one backward at a time, then the remaining backwards; its
                # fused send_backward_recv_forward posts the recv first (NCCL groups them), so each
                # pair's ops come in the same order on both ends
                warm = min(p.ranks - r - 1, mb)
                for _k in range(warm):
                    forward()
                if r > 0 and warm < mb:
                    p2p("recv", r - 1)
                for k in range(mb - warm):
                    forward(recv=False)
                    backward(send=False)
                    if r > 0 and k < mb - warm - 1:
                        p2p("recv", r - 1)
                    if r > 0:
                        p2p("send", r - 1)
                for _k in range(warm):
                    backward()
            else:
                for _k in range(mb):
                    forward()
                for _k in range(mb):
                    backward()
        else:  # moe: attention, dispatch, experts (this rank's tokens), combine; forward then backward
            tokens = int((2 << 20) * p.slow[r])
            for _i in range(p.layers):
                self.gemm("aten::linear", 0.5 / p.slow[r])
                self.comm("all_to_allv", "0", world, SEND_RECV, tokens)
                self.gemm("aten::mm")
                self.comm("all_to_allv", "0", world, SEND_RECV, tokens)
            for _i in range(p.layers):
                self.comm("all_to_allv", "0", world, SEND_RECV, tokens)
                self.gemm("aten::mm", 2.0)
                self.comm("all_to_allv", "0", world, SEND_RECV, tokens)
                self.gemm("aten::mm", 1.0 / p.slow[r])
        with self.op(m, "Optimizer.step#AdamW.step", cat="user_annotation"):
            self.launch(m, kw.ADAM, 60.0)
        self.item(m)
        self.cpu(m)
        self.threads[m].append(kw.Action("end"))


def build(p: RankProgram, rank: int, seed: int) -> list[kw.Action]:
    b = _RankBuilder(p, rank, seed)
    for n in range(p.warmup_steps + p.steps):
        b.step(n)
    b.cpu(kw.MAIN)
    b.sync(kw.MAIN, "cudaDeviceSynchronize")  # torch.profiler's stop synchronizes the device
    return b.threads[kw.MAIN]


@dataclass
class _Pending:
    op: kw.GpuOp
    rank: int
    earliest_us: float
    prev: kw.GpuOp | None
    deps: list[kw.GpuOp]
    dur_us: float  # compute: its time; collective: its transfer
    key: tuple[str, int] | None  # a collective: what its members meet at ((group, sequence); a p2p pair's own)
    members: tuple[int, ...] = ()
    label: tuple[str, int] | None = None  # a collective: its (group, sequence) in this rank's trace


@dataclass
class _Rank:
    actions: list[kw.Action]
    schedule: kw.Schedule
    pc: int = 0
    now: float = 0.0
    corr: int = 0
    stack: list[kw.Span] = field(default_factory=list)
    tail: dict[int, kw.GpuOp] = field(default_factory=dict)
    stream_deps: dict[int, list[kw.GpuOp]] = field(default_factory=dict)
    events: dict[str, tuple[kw.GpuOp | None, int, int]] = field(default_factory=dict)
    blocked: tuple[kw.Call, list[kw.GpuOp], float] | None = None  # a call waiting for GPU ops' ends


@dataclass
class RankRun:
    schedule: kw.Schedule
    waits_us: dict[tuple[str, int], float]  # collective (group, seq) -> this rank's true wait for its last peer


def _p2p_ends(args: dict, rank: int) -> tuple[int, int] | None:
    """A send/recv's (src, dst) stage indices (None: not a send/recv)."""
    if "_peer" not in args:
        return None
    peer = int(args["_peer"])
    return (rank, peer) if args["Collective name"] == "send" else (peer, rank)


def _known(op: kw.GpuOp | None) -> bool:
    return op is None or not math.isnan(op.end_us)


def simulate(p: RankProgram, comm: float = 1.0, compute: dict[int, float] | None = None,
             seed: int = 0) -> list[RankRun]:
    """Run every rank in one true clock: collectives' transfer x ``comm``, rank r's compute
    kernels x ``compute[r]``. One :class:`RankRun` per rank."""
    factors = {r: (compute or {}).get(r, 1.0) for r in range(p.ranks)}
    pair_counts: list[dict[tuple[str, int, int], int]] = [{} for _ in range(p.ranks)]  # NCCL's p2p order per pair
    carrier = p.carrier()
    ranks = [_Rank(build(p, r, seed), kw.Schedule(carrier)) for r in range(p.ranks)]
    pending: list[_Pending] = []
    arrivals: dict[tuple[str, int], dict[int, tuple[float, float]]] = {}  # key -> rank -> (start, transfer)
    true_waits: list[dict[tuple[str, int], float]] = [{} for _ in range(p.ranks)]

    def advance(r: int) -> bool:
        st = ranks[r]
        moved = False
        while st.pc < len(st.actions):
            if st.blocked is not None:
                call, blocking, ret = st.blocked
                if not all(_known(o) for o in blocking):
                    return moved
                done = max((o.end_us for o in blocking), default=0.0)
                call.end_us = max(call.end_us, done + ret)
                call.awaited_us = done
                st.schedule.calls.append(call)
                st.now, st.blocked = call.end_us, None
                st.pc += 1
                moved = True
                continue
            a = st.actions[st.pc]
            at = st.now
            moved = True
            if a.kind == "cpu":
                st.now = at + a.us
            elif a.kind == "begin":
                span = kw.Span(kw.MAIN, a.name, a.cat, at, a.args, a.flow)
                st.stack.append(span)
                st.schedule.spans.append(span)
            elif a.kind == "end":
                st.stack.pop().end_us = at
            else:
                st.corr += 1
                owner = next((s for s in reversed(st.stack) if s.cat == "cpu_op"), None)
                call = kw.Call(kw.MAIN, a.name, at, at + a.us, st.corr, owner)
                s = a.stream
                awaited: list[kw.GpuOp] = []
                if a.kind == "launch":
                    assert a.work is not None
                    w = a.work
                    op = kw.GpuOp(st.corr, w, s, at, math.nan, math.nan, "launch")
                    key = label = None
                    members: tuple[int, ...] = ()
                    dur = w.dur_us
                    if w.comm_args is not None:
                        key = label = (str(w.comm_args["Process Group Name"]), int(w.comm_args["Seq"]))
                        members = tuple(w.comm_args["_members"])
                        ends = _p2p_ends(w.comm_args, r)
                        if ends is not None and len(members) > 2:  # a send/recv meets its peer alone
                            pk = (key[0], *ends)
                            n = pair_counts[r][pk] = pair_counts[r].get(pk, 0) + 1
                            key, members = (f"{key[0]}:{ends[0]}>{ends[1]}", n), ends
                        dur *= comm
                    elif w.kernel is not None:
                        dur *= factors[r]
                    pending.append(_Pending(op, r, at + a.latency_us, st.tail.get(s), st.stream_deps.pop(s, []),
                                            dur, key, members, label))
                    st.tail[s] = op
                    st.schedule.ops.append(op)
                    call.op = op
                    if a.blocking:
                        awaited = [op]
                elif a.kind == "record":
                    st.events[a.event] = (st.tail.get(s), s, st.corr)
                elif a.kind == "wait":
                    ev_op, producer, record_corr = st.events[a.event]
                    if ev_op is not None:
                        st.stream_deps.setdefault(s, []).append(ev_op)
                    call.sync = {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": producer,
                                 "wait_on_cuda_event_record_corr_id": record_corr, "stream": s}
                elif a.name == "cudaStreamSynchronize":
                    awaited = [o for o in (st.tail.get(s),) if o is not None] + st.stream_deps.get(s, [])
                    call.sync = {"cuda_sync_kind": "Stream Sync", "stream": s}
                else:  # cudaDeviceSynchronize
                    awaited = list(st.tail.values())
                    call.sync = {"cuda_sync_kind": "Context Sync", "stream": -1}
                if a.kind in ("sync",) or (a.kind == "launch" and a.blocking):
                    st.blocked = (call, awaited, a.return_us)
                    continue
                st.schedule.calls.append(call)
                st.now = call.end_us
            st.pc += 1
        return moved

    def resolve() -> bool:
        moved = False
        keep: list[_Pending] = []
        for q in pending:
            op = q.op
            if math.isnan(op.start_us):
                if not (_known(q.prev) and all(_known(d) for d in q.deps)):
                    keep.append(q)
                    continue
                ready = max([q.prev.end_us if q.prev is not None else -math.inf]
                            + [d.end_us for d in q.deps])
                op.start_us = max(q.earliest_us, ready)
                op.bound = "launch" if q.earliest_us >= ready else "stream"
                moved = True
                if q.key is None:
                    op.end_us = op.start_us + q.dur_us
                    continue
                arrivals.setdefault(q.key, {})[q.rank] = (op.start_us, q.dur_us)
            assert q.key is not None
            arrived = arrivals[q.key]
            if all(m in arrived for m in q.members):
                # one transfer for every member (the lowest member's draw)
                last = max(arrived[m][0] for m in q.members)
                op.end_us = last + arrived[min(q.members)][1]
                true_waits[q.rank][q.label or q.key] = last - op.start_us
                moved = True
            else:
                keep.append(q)
        pending[:] = keep
        return moved

    while True:
        moved = False
        for r in range(p.ranks):
            moved |= advance(r)
        moved |= resolve()
        if not moved:
            break
    if pending or any(st.pc < len(st.actions) for st in ranks):
        raise ValueError(f"{p.name}: the ranks' collectives do not match (a rank waits forever)")
    out = []
    for st, w in zip(ranks, true_waits):
        s = st.schedule
        stop = s.calls[-1]  # the profiler's cudaDeviceSynchronize
        s.window = (s.steps()[0].start_us, stop.end_us + 2.0)
        out.append(RankRun(s, w))
    return out


def trace_doc(p: RankProgram, s: kw.Schedule, rank: int) -> dict:
    """Rank ``rank``'s (a stage index) Kineto trace, on its own host's clock."""
    doc = kw.trace_doc(s)
    off = p.offsets_us[rank % len(p.offsets_us)]
    for e in doc["traceEvents"]:
        if "ts" in e:
            e["ts"] = round(e["ts"] + off, 3)
        for key in _HIDDEN + (_NOT_ON_KERNELS if e.get("cat") == "kernel" else ()):
            e.get("args", {}).pop(key, None)
    groups = {"0": list(range(p.world_size))}
    for op in s.ops:
        if op.work.comm_args is not None:
            groups[str(op.work.comm_args["Process Group Name"])] = op.work.comm_args["_group_ranks"]
    info = doc["distributedInfo"]
    info["rank"] = p.global_rank(rank)
    info["world_size"] = p.world_size
    info["pg_count"] = len(groups)
    info["pg_config"] = [{"pg_name": g, "pg_desc": g, "backend_config": "cuda:nccl", "pg_size": len(rs),
                          "ranks": rs} for g, rs in groups.items()]
    doc["traceName"] = f"{p.name}_rank{p.global_rank(rank)}.json"
    return doc


def write_ranks(p: RankProgram, runs: list[RankRun], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for r, run in enumerate(runs):
        data = json.dumps(trace_doc(p, run.schedule, r)).encode()
        (folder / f"{p.name}_rank{p.global_rank(r)}.json.gz").write_bytes(gzip.compress(data, compresslevel=5))
    return folder


@dataclass(frozen=True)
class RanksTruth:
    """Every rank's truth of both runs; the job's step is the slowest rank's."""

    ranks: tuple[kw.PairTruth, ...]
    true_waits_us: tuple[dict[tuple[str, int], float], ...]  # first run, per rank: collective key -> its wait


def paired_ranks(p: RankProgram, directory: Path, *, comm: float = 1.0, compute: dict[int, float] | None = None,
                 seed: int = 0) -> tuple[Path, Path, RanksTruth]:
    """The program run as recorded and again with the factors: both folders, every rank's truths."""
    first = simulate(p, seed=seed)
    second = simulate(p, comm=comm, compute=compute, seed=seed)
    tag = "_".join(f"{r}x{f:g}" for r, f in sorted((compute or {}).items()))
    a = write_ranks(p, first, directory / f"{p.name}_s{seed}_first")
    b = write_ranks(p, second, directory / f"{p.name}_s{seed}_comm{comm:g}_compute{tag}_second")
    truths = tuple(kw.PairTruth(kw.truth(x.schedule), kw.truth(y.schedule)) for x, y in zip(first, second))
    return a, b, RanksTruth(truths, tuple(x.waits_us for x in first))
