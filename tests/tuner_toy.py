"""A small closed-form contention evaluator and hand-built workloads for the tuner's tests.

Not a stand-in for the simulator: it exists so that the search methods can be
checked against exhaustive ground truth on spaces where the simulator would be too
slow to enumerate. It has the two mechanisms the tuning problem rests on:
collective time falls with channels (saturating) and is unimodal in chunk size,
and a collective slows the compute it overlaps by the SMs its channels hold and by
the L2 its chunks occupy. Paths (nccl_env.rules): a copy-engine collective holds no SM
(slows nothing) but runs at 0.9 of the link plus 30 us; a symmetric kernel holds 8 SMs and
runs at the link.
"""

from __future__ import annotations

import math

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import OpTiming, Timing
from nccl_env.knobs import CollectiveType, CommConfig, Protocol
from nccl_env.plan import Plan
from nccl_env.rules import Mechanism, collective_mechanism
from traces.intervals import intersection, union
from traces.workload import CollectiveOp, ComputeOp, Dependency, Op, ProcessGroup, Stream, StreamKind, Workload

_PROTO_EFF = {Protocol.LL: 0.5, Protocol.LL128: 0.92, Protocol.SIMPLE: 1.0}
_PROTO_STEP_US = {Protocol.LL: 0.8, Protocol.LL128: 1.5, Protocol.SIMPLE: 3.0}


class ToyEvaluator:
    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.evaluations = 0

    def mechanism(self, workload: Workload, op: CollectiveOp, cfg: CommConfig) -> Mechanism:
        sig = workload.signature(op, self.cluster.gpus_per_node)
        return collective_mechanism(cfg.comm_path, sig.collective, sig.nodes, self.cluster.nccl_version,
                                    self.cluster.path_topology())

    def collective_us(self, workload: Workload, op: CollectiveOp, cfg: CommConfig) -> float:
        sig = workload.signature(op, self.cluster.gpus_per_node)
        mechanism = self.mechanism(workload, op, cfg)
        if mechanism is not Mechanism.SM_KERNEL:
            link = self.cluster.intra_node.bw_gb_per_s * 1e3
            n = max(2, sig.ranks)
            factor = 2 * (n - 1) / n if sig.collective is CollectiveType.ALLREDUCE else (n - 1) / n
            assert op.message_bytes is not None
            traffic = op.message_bytes * factor
            if mechanism is Mechanism.COPY_ENGINE:
                return 30.0 + traffic / (0.9 * link)
            return 8.0 + traffic / link
        nc = cfg.channels or 8
        chunk = cfg.chunk_bytes or (2 << 20)
        nt = cfg.threads or 512
        proto = cfg.protocol or Protocol.SIMPLE
        link = self.cluster.intra_node.bw_gb_per_s * 1e3  # bytes per us
        if sig.nodes > 1:
            link = min(link, self.cluster.inter_node.nic_bw_gb_per_s * 1e3 * self.cluster.inter_node.nics_per_node)
        per_channel = link / 6.0 * math.sqrt(nt / 512)
        bw = min(link, nc * per_channel) * _PROTO_EFF[proto]
        n = max(2, sig.ranks)
        factor = 2 * (n - 1) / n if sig.collective is CollectiveType.ALLREDUCE else (n - 1) / n
        assert op.message_bytes is not None  # the toy workloads give every collective its size
        traffic = op.message_bytes * factor
        steps = math.ceil(traffic / (chunk * nc))
        return 5.0 + traffic / bw + steps * _PROTO_STEP_US[proto] + chunk / per_channel

    def slowdown(self, cfg: CommConfig, mechanism: Mechanism = Mechanism.SM_KERNEL) -> float:
        if mechanism is Mechanism.COPY_ENGINE:
            return 1.0
        nc = 8 if mechanism is Mechanism.SYMMETRIC_KERNEL else (cfg.channels or 8)
        chunk = 0 if mechanism is Mechanism.SYMMETRIC_KERNEL else (cfg.chunk_bytes or (2 << 20))
        sm = self.cluster.gpu.sm_count
        l2 = self.cluster.gpu.l2_bytes
        return sm / max(1, sm - nc) * (1 + 0.3 * min(1.0, nc * chunk / l2))

    def evaluate(self, workload: Workload, plan: Plan) -> Timing:
        self.evaluations += 1
        configs = {c.op_id: plan.config_for(workload.signature(c, self.cluster.gpus_per_node))
                   for c in workload.collectives}
        coll_dur = {c.op_id: self.collective_us(workload, c, configs[c.op_id]) for c in workload.collectives}
        mechanisms = {c.op_id: self.mechanism(workload, c, configs[c.op_id]) for c in workload.collectives}
        deps: dict[int, list[int]] = {}
        for d in workload.dependencies:
            deps.setdefault(d.after, []).append(d.before)
        ops: list[Op] = sorted([*workload.compute_ops, *workload.collectives], key=lambda o: (o.start_us, o.op_id))
        coll_spans: list[tuple[float, float, int]] = []
        timing: dict[int, OpTiming] = {}
        for _ in range(3):  # fixed point: compute slowdown depends on where collectives landed
            free: dict[int, float] = {}
            timing = {}
            for op in ops:
                start = max([free.get(op.stream, 0.0)]
                            + [timing[b].end_us for b in deps.get(op.op_id, []) if b in timing])
                if isinstance(op, CollectiveOp):
                    dur = coll_dur[op.op_id]
                else:
                    dur = op.duration_us
                    end_guess = start + dur
                    for s, e, cid in coll_spans:
                        overlap = max(0.0, min(end_guess, e) - max(start, s))
                        if overlap > 0:
                            dur += overlap * (self.slowdown(configs[cid], mechanisms[cid]) - 1)
                timing[op.op_id] = OpTiming(start, dur)
                free[op.stream] = start + dur
            coll_spans = [(timing[c.op_id].start_us, timing[c.op_id].end_us, c.op_id) for c in workload.collectives]
        comp = union((timing[o.op_id].start_us, timing[o.op_id].end_us) for o in workload.compute_ops)
        comm = union((s, e) for s, e, _ in coll_spans)
        both = _length(intersection(comp, comm))
        return Timing(
            iteration_us=max(t.end_us for t in timing.values()) - min(t.start_us for t in timing.values()),
            compute_us=_length(comp),
            comm_us=_length(comm),
            exposed_comm_us=_length(comm) - both,
            compute_uncontended_us=sum(o.duration_us for o in workload.compute_ops),
            ops=timing,
        )


def _length(spans) -> float:
    return sum(e - s for s, e in spans)


def layered_workload(layers: int, sizes: list[int], gemm_us: float = 400.0, tail_bytes: int = 64 << 20) -> Workload:
    """FSDP-like: per layer a GEMM that needs its AllGather; the next layer's AllGather is
    prefetched during this GEMM (compute-bound windows); message sizes cycle through
    ``sizes`` (one signature each); a final, exposed AllReduce of ``tail_bytes``
    (a communication-bound window)."""
    compute: list[ComputeOp] = []
    colls: list[CollectiveOp] = []
    deps: list[Dependency] = []
    op_id = 0
    prev_gemm: ComputeOp | None = None
    for layer in range(layers):
        ag_start = 0.0 if layer == 0 else 100.0 + (layer - 1) * gemm_us  # prefetched during the previous GEMM
        op_id += 1
        ag = CollectiveOp(op_id, "ncclAllGather", CollectiveType.ALLGATHER, sizes[layer % len(sizes)], 2, ag_start,
                          100.0, "0")
        colls.append(ag)
        op_id += 1
        gemm = ComputeOp(op_id, "gemm", 1, 100.0 + layer * gemm_us, gemm_us, grid=(512, 1, 1), block=(256, 1, 1),
                         blocks_per_sm=2)
        compute.append(gemm)
        deps.append(Dependency(ag.op_id, gemm.op_id))
        prev_gemm = gemm
    t = 100.0 + layers * gemm_us
    op_id += 1
    tail = CollectiveOp(op_id, "ncclAllReduce", CollectiveType.ALLREDUCE, tail_bytes, 2, t + 200.0, 100.0, "0")
    colls.append(tail)
    assert prev_gemm is not None  # layers >= 1
    deps.append(Dependency(prev_gemm.op_id, tail.op_id))
    return Workload(
        rank=0,
        world_size=8,
        streams=[Stream(1, StreamKind.COMPUTE), Stream(2, StreamKind.COMMUNICATION)],
        compute_ops=compute,
        collectives=colls,
        groups={"0": ProcessGroup("0", tuple(range(8)), nodes=1)},
        dependencies=deps,
        source=f"toy:layers={layers}",
        gpus_per_node=8,
    )
