"""How long a collective takes: a chunk pipeline over channels, limited by links, protocol,
threads, per-step synchronisation, DRAM bandwidth and L2 room.

For one rank of a ring-family collective with ``n`` ranks, ``NC`` channels and chunk ``C``:

* payload each rank puts on the wire: ``W = wire_factor x S`` (AllReduce ``2(n-1)/n``,
  AllGather/ReduceScatter/AlltoAll ``(n-1)/n``, Broadcast/Reduce ``1``);
* each channel is one CTA that moves its share chunk-step by chunk-step: ``N = K x loops``
  steps of ``c = min(C x payload fraction, S / (n NC))`` bytes, each costing
  ``c / r_ch + sync`` where ``r_ch`` is the CTA's copy rate (a per-channel figure scaled by
  threads up to saturation) and ``sync`` the per-step flag handshake of the protocol;
* all channels together cannot beat the link: payload rate ``R = min(NC x r_ch, link x
  payload fraction, DRAM share / DRAM bytes per payload byte)``; a cross-node group's link
  is its share of the node's NICs;
* ``time = launch + K x hop latency + one step of pipeline fill + max(W / R, N x step)``.

The FIFO data in flight is ``fifo_resident_chunks x NC x c`` bytes (``c`` the chunk really used,
so at most the rank's share of the message).

Two other paths (``nccl_env.rules.collective_mechanism``) hold no FIFO and no chunk pipeline:
NCCL's symmetric kernels (:meth:`CollectiveModel.symmetric`) hold the few CTAs NCCL picks
and move the bus bytes of NCCL's own model at ``min(CTAs x CTA rate, NCCL's peak, link)``;
copy-engine collectives (:meth:`CollectiveModel.copy_engine`) hold no SM and do not wait for
one, and move their wire bytes at the copy engines' rate over the link. Both copy straight
between registered buffers: ``direct_dram_bytes_per_payload_byte`` per wire byte.

NVLS and NVLSTree (:meth:`CollectiveModel.nvls`) let the switch reduce and multicast: each GPU's
NVLink carries about its buffer once, NCCL's NVLS channels hold the SMs, two NVLS buffers' slices
sit in L2. CollNetDirect (:meth:`CollectiveModel.collnet_direct`) lets the network's switches
reduce: the node's NICs carry its buffer once. PAT is the chunk pipeline with ceil(log2 n)
network rounds per loop instead of n-1.

The chunk pipeline makes time fall with C (fewer syncs) until the fill step dominates
(unimodal), and saturate in NC once the link is the limit. The FIFO data in flight,
``fifo_resident_chunks x NC x C`` bytes, sits in L2; what does not fit spills to DRAM and
costs extra DRAM traffic per payload byte. That footprint is what the compute model loses
from its L2 (see :mod:`costmodel.sim.compute`).
"""

from __future__ import annotations

import math

from costmodel.cluster import ClusterSpec
from costmodel.nccl_algorithms import (
    COLLNET_ARITY_US,
    COLLNET_INTRA_LATENCY_FACTOR,
    COLLNET_NET_LATENCY_FACTOR,
    NVLS_CHUNK_BYTES,
    NVLS_FAMILY,
    NVLS_SWITCH_LATENCY_FACTOR,
    NVLS_TREE_NET_LATENCY_FACTOR,
    log2_steps,
    nvls_efficiency,
)
from costmodel.nccl_defaults import SymmetricKernel, nccl_graph, protocol_base_excess_us, protocol_hop_factors
from costmodel.sim.memo import StateMemo
from costmodel.sim.params import SimParams
from nccl_env.knob_table import ALGORITHM
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import Mechanism


def _protocol_figures(protocol: Protocol, params: SimParams) -> tuple[float, float, float]:
    """(per-channel copy rate GB/s, payload fraction of the bytes moved, per-step sync us)."""
    if protocol is Protocol.LL:
        return params.ll_bw_per_channel_gb_per_s, params.ll_payload_fraction, params.step_sync_us_ll
    if protocol is Protocol.LL128:
        return params.ll128_bw_per_channel_gb_per_s, params.ll128_payload_fraction, params.step_sync_us_ll128
    return params.simple_bw_per_channel_gb_per_s, 1.0, params.step_sync_us_simple


def _ring_shape(collective: CollectiveType, ranks: int) -> tuple[float, int]:
    """(wire bytes per message byte, chunk-steps per loop) of one rank."""
    n = ranks
    if n == 1:
        return 0.0, 1
    if collective is CollectiveType.ALLREDUCE:
        return 2.0 * (n - 1) / n, 2 * (n - 1)
    if collective in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER):
        return (n - 1) / n, n - 1
    if collective in (CollectiveType.ALLTOALL, CollectiveType.SENDRECV):
        return ((n - 1) / n if collective is CollectiveType.ALLTOALL else 1.0), max(1, n - 1)
    return 1.0, 1  # broadcast / reduce: a pipeline through n-1 hops


def _link_bytes_per_us(signature: Signature, algorithm: Algorithm, cluster: ClusterSpec, params: SimParams) -> float:
    """The bandwidth one rank's ring has, payload bytes/us per direction: the intra-node link, or
    for a cross-node group the smaller of it and the group's share of the node's NICs."""
    n = max(1, signature.ranks)
    if n == 1:
        return float("inf")
    nodes = max(1, signature.nodes)
    ppn = max(1, n // nodes)
    intra = cluster.intra_node.bw_gb_per_s * 1e3
    nic_share = (cluster.inter_node.nics_per_node * cluster.inter_node.nic_bw_gb_per_s * 1e3
                 * min(1.0, ppn / cluster.gpus_per_node))
    if signature.collective is CollectiveType.ALLTOALL and nodes > 1:
        local = (ppn - 1) / (n - 1)
        remote = 1.0 - local
        link = 1.0 / max(local / intra if ppn > 1 else 0.0, remote / nic_share)
    elif nodes > 1:
        link = min(intra, nic_share) if ppn > 1 else nic_share
    else:
        link = intra
    if algorithm is Algorithm.TREE:
        link *= params.tree_bw_fraction
    return link


def _hop_latency_us(signature: Signature, algorithm: Algorithm, cluster: ClusterSpec, protocol: Protocol) -> float:
    """Latency of the hops one loop crosses (intra-node and network hops at their own latency, for
    the protocol: costmodel.nccl_defaults.protocol_hop_factors; with LL's latency on every step the
    ring alone on 8 x H100 came out 31 us for an 8 MiB ReduceScatter against Megatron-LM #5596's
    47.0, fitting set)."""
    n = max(1, signature.ranks)
    nodes = max(1, signature.nodes)
    ppn = max(1, n // nodes)
    coll = signature.collective
    if coll is CollectiveType.ALLREDUCE:
        inter_hops = 2 * nodes if nodes > 1 else 0
        hops = 2 * (n - 1)
    elif coll in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER):
        inter_hops, hops = nodes - 1, n - 1
    else:
        inter_hops, hops = (1 if nodes > 1 else 0), 1
    if algorithm is Algorithm.TREE:
        hops = 2 * (ppn - 1 + int(math.log2(nodes)))
        inter_hops = 2 * int(math.log2(nodes))
    if algorithm is Algorithm.PAT:  # one GPU per node: ceil(log2 n) rounds, each a network hop
        hops = inter_hops = log2_steps(n)
    intra_factor, net_factor = protocol_hop_factors(cluster, algorithm, protocol)
    return ((hops - inter_hops) * cluster.intra_node.latency_us * intra_factor
            + inter_hops * cluster.inter_node.latency_us * net_factor)


class CollectiveModel:
    """One collective under one resolved CommConfig; :meth:`time_us` is the hot path.

    Built by :meth:`chunk_pipeline`; the constructor only stores the figures."""

    __slots__ = ("ctas", "footprint_bytes", "fixed_us", "steps_us", "wire_bytes", "rate_cap", "dram_base",
                 "dram_fifo", "link_class", "config", "alone_us", "mechanism", "_memo", "_host")

    def __init__(self, *, config: CommConfig, ctas: int, link_class: str, wire_bytes: float, rate_cap: float,
                 fixed_us: float, steps_us: float, footprint_bytes: float, dram_base: float, dram_fifo: float,
                 alone_us: float = 0.0, mechanism: Mechanism = Mechanism.SM_KERNEL):
        self.config = config
        self.ctas = ctas  # SMs held (one CTA per channel)
        self.link_class = link_class  # "net" or "intra": collectives on one class share its link
        self.wire_bytes = wire_bytes  # payload one rank puts on the wire
        self.rate_cap = rate_cap  # payload bytes/us: min(channels x copy rate, link x payload fraction)
        self.fixed_us = fixed_us  # launch + hop latency + pipeline fill
        self.steps_us = steps_us  # one channel's chunk-steps back to back (copy + per-step sync)
        self.footprint_bytes = footprint_bytes  # FIFO bytes in flight (held in L2)
        self.dram_base = dram_base  # DRAM bytes per payload byte (input read, result write)
        self.dram_fifo = dram_fifo  # extra DRAM bytes per payload byte for FIFO data spilled out of L2
        self.alone_us = alone_us  # on an idle GPU
        self.mechanism = mechanism  # what moves the data (SM kernel, symmetric kernel, copy engines)
        self._memo = StateMemo()
        self._host: CollectiveModel | None = None

    @classmethod
    def chunk_pipeline(cls, signature: Signature, config: CommConfig, cluster: ClusterSpec,
                       params: SimParams) -> CollectiveModel:
        """The collective as a chunk pipeline over channels (the module docstring's mechanism)."""
        gpu = cluster.gpu
        n = max(1, signature.ranks)
        nodes = max(1, signature.nodes)
        size = float(max(1, signature.message_bytes))
        coll = signature.collective
        proto = config.protocol if config.protocol is not None else Protocol.SIMPLE
        algo = config.algorithm if config.algorithm is not None else Algorithm.RING
        nc = max(1, min(int(config.channels or 1), gpu.sm_count - 1))
        threads = int(config.threads or 512)
        chunk = float(config.chunk_bytes or (1 << 21))
        per_ch, payload, sync = _protocol_figures(proto, params)
        r_ch = per_ch * 1e3 * min(1.0, threads / max(1, params.channel_saturation_threads))  # payload bytes/us
        wire_factor, steps_per_loop = _ring_shape(coll, n)
        link = _link_bytes_per_us(signature, algo, cluster, params)
        # chunk pipeline
        c = chunk * payload
        per_channel_share = size / (max(1, n) * nc) if coll not in (CollectiveType.BROADCAST, CollectiveType.REDUCE) \
            else size / nc
        c_eff = max(1.0, min(c, per_channel_share))
        loops = max(1, math.ceil(per_channel_share / c_eff - 1e-9))
        step_us = c_eff / r_ch + sync
        if n > 1:  # the hops, and the protocol's base latency beyond the launch's (NCCL's LL128: +5.6 us)
            latency = _hop_latency_us(signature, algo, cluster, proto) + protocol_base_excess_us(proto)
            fill = step_us * (n - 2 if coll in (CollectiveType.BROADCAST, CollectiveType.REDUCE) else 1)
        else:
            latency, fill = 0.0, 0.0
        model = cls(
            config=config,
            ctas=nc,
            link_class="net" if nodes > 1 else "intra",
            wire_bytes=wire_factor * size,
            rate_cap=min(nc * r_ch, link * payload),
            fixed_us=params.launch_us + latency + fill,
            # NCCL's last loop uses a smaller chunk (realChunkSize), so only the syncs are quantised; PAT
            # aggregates a loop's n-1 sends into ceil(log2 n) synchronised steps
            steps_us=steps_per_loop * per_channel_share / r_ch
            + (log2_steps(n) if algo is Algorithm.PAT else steps_per_loop) * loops * sync,
            # NCCL shrinks the chunk to the channel's share of a small message (realChunkSize), so the
            # FIFO bytes in flight are the chunk actually used, in buffer bytes (LL: twice the payload)
            footprint_bytes=params.fifo_resident_chunks * nc * (c_eff / payload) if n > 1 else 0.0,
            dram_base=params.dram_bytes_per_payload_byte,
            dram_fifo=params.fifo_dram_bytes_per_payload_byte,
        )
        model.alone_us = model.time_us(float(gpu.l2_bytes), gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency, 1.0)
        return model

    @classmethod
    def nvls(cls, signature: Signature, config: CommConfig, cluster: ClusterSpec,
             params: SimParams) -> CollectiveModel:
        """NVLS (NVLink SHARP; ``config`` settled by costmodel.nccl_algorithms.algorithm_settings):
        the switch reduces and multicasts. An AllReduce is a reduce-scatter through the switch (each
        rank's CTAs ``multimem.ld_reduce`` their 1/n of every chunk: the switch reads it from all n
        GPUs and returns the sum) then a multicast all-gather (``multimem.st``: one store, the switch
        writes it to every GPU). Each GPU's NVLink carries about its buffer once per direction,
        ``S (n+1)/n`` (it serves the switch's reads of its whole buffer and sends its 1/n share up;
        it receives its reduced share and the whole multicast result), against the ring's
        ``2(n-1)/n S``; AllGather and ReduceScatter carry ``S``. The SMs do no reduction math: a
        channel's CTA moves data at ``nvls_efficiency`` of a Simple channel's copy rate (NCCL's own
        figure, tuning.cc nvlsEfficiency). The NVLS buffers (nvls.cc: a scatter and a multicast
        buffer of ``NCCL_STEPS`` steps per channel) hold one slice each in L2; DRAM sees the input
        read once and the result written once. Its fixed cost is a launch, NCCL's own latency of the
        switch path (tuning.cc hwLat NVLS 25 us over the ring's LL 0.6, times the preset's
        ``latency_us``) and one chunk step. NVLSTree (several nodes, AllReduce): the same inside
        the node, the node's data up and down a tree between nodes (``S`` per direction on the node's
        NICs, at the tree's share of them), ``2 log2(nodes)`` network hops at NCCL's NVLSTree network
        latency (20.9 us over the ring's LL 2.7)."""
        n = max(1, signature.ranks)
        nodes = max(1, signature.nodes)
        local = max(1, n // nodes)
        size = float(max(1, signature.message_bytes))
        coll = signature.collective
        graph = nccl_graph(cluster)
        eff = params.nvls_efficiency or nvls_efficiency(graph.compute_capability)
        nc = max(1, min(int(config.channels or 1), cluster.gpu.sm_count - 1))
        r_ch = params.simple_bw_per_channel_gb_per_s * 1e3 * eff  # NVLink bytes/us one NVLS channel moves
        allreduce = coll is CollectiveType.ALLREDUCE
        wire_per_byte = (local + 1) / local if allreduce else 1.0  # NVLink bytes per buffer byte, busiest direction
        rate = min(nc * r_ch, cluster.intra_node.bw_gb_per_s * 1e3) / wire_per_byte  # buffer bytes/us
        phases = 2 if allreduce else 1  # reduce-scatter, then multicast all-gather
        latency = cluster.intra_node.latency_us * NVLS_SWITCH_LATENCY_FACTOR
        if nodes > 1:  # NVLSTree: up and down a tree of nodes
            latency += 2 * log2_steps(nodes) * cluster.inter_node.latency_us * NVLS_TREE_NET_LATENCY_FACTOR
            node_net = cluster.inter_node.nics_per_node * cluster.inter_node.nic_bw_gb_per_s * 1e3
            rate = min(rate, node_net * params.tree_bw_fraction)  # the node's S over all its NICs
        chunk = float(config.chunk_bytes or NVLS_CHUNK_BYTES)
        c_eff = max(1.0, min(chunk, size / (local * nc)))
        loops = max(1, math.ceil(size / (local * nc * c_eff) - 1e-9))
        sync = params.step_sync_us_simple
        io_bytes = 2.0 if allreduce else (local + 1) / local  # input read + result written, per buffer byte
        model = cls(
            config=config, ctas=nc, link_class="net" if nodes > 1 else "intra",
            wire_bytes=size, rate_cap=rate,
            fixed_us=params.launch_us + latency + c_eff / r_ch + sync,
            steps_us=wire_per_byte * size / (nc * r_ch) + phases * loops * sync,
            footprint_bytes=2 * params.fifo_resident_chunks * nc * c_eff if n > 1 else 0.0,
            dram_base=io_bytes, dram_fifo=params.fifo_dram_bytes_per_payload_byte * wire_per_byte,
        )
        model.alone_us = model.time_us(float(cluster.gpu.l2_bytes),
                                       cluster.gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency, 1.0)
        return model

    @classmethod
    def collnet_direct(cls, signature: Signature, config: CommConfig, cluster: ClusterSpec,
                       params: SimParams) -> CollectiveModel:
        """CollNetDirect AllReduce (``config`` settled by costmodel.nccl_algorithms.algorithm_settings):
        the network's switches reduce (SHARP). Inside the node each GPU scatters its buffer's shares to
        the node's heads over NVLink and gathers the results back (``2 (p-1)/p S`` per GPU and
        direction, p GPUs per node, at its channels' copy rate); each head sends its share up to the
        network and gets the reduced share back, so the node's NICs carry ``S`` per direction, once,
        where a ring crosses them ``2(n-1)/n`` times per rank. Holds its channels' CTAs and a
        ring-like FIFO; DRAM as NVLS (input read and result written once). Fixed cost: a launch, two
        NVLink hops and a network round at NCCL's CollNetDirect latencies (tuning.cc: 3.7 us NVLink,
        31 us network, 0.4 us per local peer), one chunk step."""
        n = max(1, signature.ranks)
        nodes = max(1, signature.nodes)
        local = max(1, n // nodes)
        size = float(max(1, signature.message_bytes))
        nc = max(1, min(int(config.channels or 1), cluster.gpu.sm_count - 1))
        threads = int(config.threads or 512)
        r_ch = (params.simple_bw_per_channel_gb_per_s * 1e3
                * min(1.0, threads / max(1, params.channel_saturation_threads)))
        intra_wire = 2.0 * (local - 1) / local  # NVLink bytes per buffer byte, each direction
        node_net = cluster.inter_node.nics_per_node * cluster.inter_node.nic_bw_gb_per_s * 1e3
        rate = node_net * min(1.0, local / cluster.gpus_per_node)  # the group's share of the node's NICs
        if intra_wire > 0:
            rate = min(rate, min(nc * r_ch, cluster.intra_node.bw_gb_per_s * 1e3) / intra_wire)
        latency = (2 * (min(1, local - 1) * cluster.intra_node.latency_us * COLLNET_INTRA_LATENCY_FACTOR
                        + (local - 1) * COLLNET_ARITY_US)
                   + cluster.inter_node.latency_us * COLLNET_NET_LATENCY_FACTOR)
        chunk = float(config.chunk_bytes or (1 << 19))
        c_eff = max(1.0, min(chunk, size / (local * nc)))
        loops = max(1, math.ceil(size / (local * nc * c_eff) - 1e-9))
        sync = params.step_sync_us_simple
        model = cls(
            config=config, ctas=nc, link_class="net", wire_bytes=size, rate_cap=rate,
            fixed_us=params.launch_us + latency + c_eff / r_ch + sync,
            steps_us=max(intra_wire, 1.0 / local) * size / (nc * r_ch) + 2 * loops * sync,
            footprint_bytes=params.fifo_resident_chunks * nc * c_eff,
            dram_base=2.0, dram_fifo=params.fifo_dram_bytes_per_payload_byte * max(intra_wire, 1.0 / local),
        )
        model.alone_us = model.time_us(float(cluster.gpu.l2_bytes),
                                       cluster.gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency, 1.0)
        return model

    @property
    def waits_for_sms(self) -> bool:
        """A kernel's CTAs wait for SMs beside a GPU-filling kernel; copy engines need none."""
        return self.mechanism is not Mechanism.COPY_ENGINE

    @classmethod
    def copy_engine(cls, signature: Signature, config: CommConfig, cluster: ClusterSpec,
                    params: SimParams) -> CollectiveModel:
        """NCCL's copy-engine collective (CTA policy ZERO, registered buffers): a barrier with every
        peer, one batch of copies (each rank writes its share to every peer, over the link at the
        copy engines' rate), a second barrier (ce_coll.cc ncclPrepUCSync / ncclCeLaunchBatchOps).
        Holds no SM and waits for none. A barrier writes a flag to each peer of the node with one
        small copy-engine copy after another on the stream, then waits on its own flags:
        (local peers) x ``ce_copy_latency_us`` plus a hop (NVLS multicast would make it one copy:
        not modelled). Across nodes (NCCL >= 2.30.6) the network part goes through the NICs'
        share, by a CPU proxy."""
        n = max(1, signature.ranks)
        nodes = max(1, signature.nodes)
        size = float(max(1, signature.message_bytes))
        wire_factor, _ = _ring_shape(signature.collective, n)
        link = cluster.intra_node.copy_engine_bw * 1e3
        local_peers = max(1, min(n, n // nodes) - 1)
        barrier = local_peers * params.ce_copy_latency_us + cluster.intra_node.latency_us
        fixed = params.launch_us + 2 * barrier
        if nodes > 1:
            ppn = max(1, n // nodes)
            nic_share = (cluster.inter_node.nics_per_node * cluster.inter_node.nic_bw_gb_per_s * 1e3
                         * min(1.0, ppn / cluster.gpus_per_node))
            link = min(link, nic_share)
            fixed += 2 * cluster.inter_node.latency_us
        model = cls(config=config, ctas=0, link_class="net" if nodes > 1 else "intra",
                    wire_bytes=wire_factor * size, rate_cap=link, fixed_us=fixed, steps_us=0.0, footprint_bytes=0.0,
                    dram_base=params.direct_dram_bytes_per_payload_byte, dram_fifo=0.0,
                    mechanism=Mechanism.COPY_ENGINE)
        model.alone_us = model.time_us(float(cluster.gpu.l2_bytes),
                                       cluster.gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency, 1.0)
        return model

    @classmethod
    def symmetric(cls, signature: Signature, config: CommConfig, kernel: SymmetricKernel, cluster: ClusterSpec,
                  params: SimParams) -> CollectiveModel:
        """NCCL's symmetric kernel on registered buffers (``kernel``: NCCL's own pick,
        costmodel.nccl_defaults.symmetric_kernel): holds its few CTAs, moves NCCL's bus bytes at
        min(CTAs x per-CTA rate, NCCL's peak, the link) after a kernel launch and one hop (it
        loads and stores peers' buffers directly: no FIFO, no chunk steps, no proxy). NCCL's own
        base latency (4.5-19.5 us) is a figure its picker compares kernels by, not what the kernel
        takes: Megatron-LM #5596 (fitting set) measured AllGather_ST at 10.9 us for 2 MiB on 8 x
        H100, where that base latency alone gives 13.1 us."""
        n = max(1, signature.ranks)
        wire_factor, _ = _ring_shape(signature.collective, n)
        wire = wire_factor * float(max(1, signature.message_bytes))
        link = cluster.intra_node.bw_gb_per_s * 1e3
        rate = min(kernel.ctas * kernel.cta_bw_bytes_per_us, kernel.peak_bw_bytes_per_us, link)
        model = cls(config=config, ctas=min(kernel.ctas, cluster.gpu.sm_count - 1), link_class="intra",
                    wire_bytes=kernel.bus_bytes, rate_cap=rate,
                    fixed_us=params.launch_us + cluster.intra_node.latency_us, steps_us=0.0,
                    footprint_bytes=0.0,
                    # DRAM follows the data really moved, not the LL kernels' padded bus bytes
                    dram_base=params.direct_dram_bytes_per_payload_byte * wire / max(1.0, kernel.bus_bytes),
                    dram_fifo=0.0, mechanism=Mechanism.SYMMETRIC_KERNEL)
        model.alone_us = model.time_us(float(cluster.gpu.l2_bytes),
                                       cluster.gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency, 1.0)
        return model

    def host_side(self) -> CollectiveModel:
        """The same collective run by the host (e.g. gloo in a CPU-only trace): same pace, but it
        holds no SMs, no L2 and no GPU DRAM bandwidth."""
        if self._host is None:
            host = CollectiveModel(config=self.config, ctas=0, link_class=self.link_class,
                                   wire_bytes=self.wire_bytes, rate_cap=self.rate_cap, fixed_us=self.fixed_us,
                                   steps_us=self.steps_us, footprint_bytes=0.0, dram_base=0.0, dram_fifo=0.0,
                                   alone_us=self.alone_us)
            host._host = host
            self._host = host
        return self._host

    def l2_held_beside(self, params: SimParams) -> float:
        """The L2 a kernel beside it loses in replay's slowdown ratio: ``fifo_resident_chunks`` x its
        CTAs x its configured chunk (not shrunk to a small message's share as :attr:`footprint_bytes` is)."""
        buffers = 2 if ALGORITHM.get(self.config) in NVLS_FAMILY else 1  # NVLS: scatter and multicast buffers
        return buffers * params.fifo_resident_chunks * self.ctas * (self.config.chunk_bytes or 0)

    def dram_per_byte(self, l2_for_comm: float) -> float:
        if self.footprint_bytes <= 0:
            return self.dram_base
        spill = max(0.0, self.footprint_bytes - max(0.0, l2_for_comm)) / self.footprint_bytes
        return self.dram_base + self.dram_fifo * spill

    def rate(self, l2_for_comm: float, bw_bytes_per_us: float, link_share: float) -> float:
        """Payload bytes/us."""
        cap = self.rate_cap * link_share if link_share < 1.0 else self.rate_cap
        per_byte = self.dram_per_byte(l2_for_comm)
        if per_byte <= 0.0:  # a host-side collective uses no GPU DRAM
            return cap
        return min(cap, max(bw_bytes_per_us, 1e-6) / per_byte)

    def time_us(self, l2_for_comm: float, bw_bytes_per_us: float, link_share: float) -> float:
        """Duration if the state held for the whole collective."""
        return self._memo.get_or((l2_for_comm, bw_bytes_per_us, link_share), self._time_us, l2_for_comm,
                                 bw_bytes_per_us, link_share)

    def _time_us(self, l2_for_comm: float, bw_bytes_per_us: float, link_share: float) -> float:
        if self.wire_bytes <= 0:
            return self.fixed_us
        return self.fixed_us + max(self.wire_bytes / self.rate(l2_for_comm, bw_bytes_per_us, link_share),
                                   self.steps_us)

    def dram_demand(self, l2_for_comm: float, link_share: float) -> float:
        """Bytes/us of DRAM traffic at its link-limited pace."""
        return self._memo.get_or((l2_for_comm, None, link_share), self._dram_demand, l2_for_comm, link_share)

    def _dram_demand(self, l2_for_comm: float, link_share: float) -> float:
        if self.wire_bytes <= 0:
            return 0.0
        rate = self.rate_cap * link_share
        total = self.fixed_us + max(self.wire_bytes / rate, self.steps_us)
        return self.wire_bytes / total * self.dram_per_byte(l2_for_comm)
