"""Closed-form time of one collective from its NCCL settings, alone or beside compute.

A pure function over plain numbers (the adapter that feeds it is
:mod:`costmodel.analytic`); the parameters ``p`` are :mod:`costmodel.analytic.params`.

A ring-family collective on ``n`` ranks moves, per rank, ``W`` payload bytes (the
nccl-tests bus factor x message: 2(n-1)/n for AllReduce, (n-1)/n for AllGather,
ReduceScatter and AlltoAll, 1 for Broadcast and Reduce). Its ``NC`` channels (one
CTA each) each carry 1/NC of it, chunk step by chunk step:

* a channel copies at ``r = channel bandwidth(protocol) x min(1, threads / saturation)``;
* a step moves ``c = min(chunk x payload share, message / (n x NC))`` bytes (NCCL shrinks the
  chunk to a small message's share) and costs ``c / r + sync(protocol)``; a channel's share
  takes ``steps per loop x (share / r + ceil(share / c) x sync)`` (steps per loop: 2(n-1)
  for AllReduce, n-1 for AllGather / ReduceScatter / AlltoAll);
* all channels together cannot beat the link: ``R = min(NC x r, link x payload share)``,
  the link being the slowest hop (a node's NICs, shared by its ranks, across nodes);
* ``time = launch + hop latencies + one step of pipeline fill + max(W / R, the steps' pace)``.

Two more paths (``nccl_env.rules.collective_mechanism``), with neither FIFO nor chunk steps:
NCCL's symmetric kernels (:func:`symmetric_estimate`) hold the few CTAs NCCL picks and move
its model's bus bytes at ``min(CTAs x CTA rate, NCCL's peak, link)``; copy-engine collectives
(:func:`copy_engine_estimate`) hold no SM (and wait for none), pay two barriers of one small
copy per local peer, and move the wire bytes at the copy engines' rate. Both copy between
registered buffers: ``direct_dram_per_byte`` DRAM bytes per wire byte.

NVLS and NVLSTree (:func:`nvls_estimate`) and PAT (ceil(log2 n) network rounds in
:func:`collective_estimate`) state the simulator's mechanisms for them in closed form.

So the time falls with the chunk (fewer synchronisations) until the pipeline fill
and the per-step cost of big chunks take over (unimodal), and saturates in channels
once the link is the limit. While it runs the collective holds ``NC`` SMs, keeps
``fifo_chunks x NC x c / payload share`` bytes in flight in L2 (its footprint), and moves
``coll_dram_per_byte`` DRAM bytes per payload byte, plus ``fifo_dram_per_byte`` for
the share of its footprint the L2 cannot hold. Beside compute it gets the DRAM
bandwidth and L2 compute leaves it (:meth:`CollectiveEstimate.time_under`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from costmodel.nccl_algorithms import (
    COLLNET_ARITY_US,
    COLLNET_INTRA_LATENCY_FACTOR,
    COLLNET_NET_LATENCY_FACTOR,
    NVLS_SWITCH_LATENCY_FACTOR,
    NVLS_TREE_NET_LATENCY_FACTOR,
    log2_steps,
)
from costmodel.nccl_defaults import protocol_base_excess_us
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol

# (algorithm, protocol) -> (intra-node, network) hop latency over LL's (nccl_defaults.protocol_hop_factors)
HopFactors = Callable[[Algorithm, Protocol], tuple[float, float]]

_GB = 1e9 / 1e6  # bytes per microsecond in one GB/s


@dataclass(frozen=True)
class CollectiveEstimate:
    """One collective under one resolved setting: what it costs and what it takes."""

    time_us: float  # alone
    fixed_us: float  # launch + hop latencies + pipeline fill
    steps_us: float  # N x step: the chunk pipeline's own pace
    wire_bytes: float  # payload bytes one rank sends (W)
    rate_cap: float  # min(NC x r, link x payload), payload bytes/us
    ctas: int  # SMs it holds (one CTA per channel)
    footprint_bytes: float  # L2 it keeps busy
    dram_base: float  # DRAM bytes per payload byte
    dram_fifo: float  # extra DRAM bytes per payload byte when the footprint spills
    crosses_net: bool = False  # its links are the network's (collectives on one class share it)
    copy_engine: bool = False  # moved by the copy engines: holds no SM and never waits for one

    @property
    def waits_for_sms(self) -> bool:
        """Beside a GPU-filling kernel its CTAs wait for SMs (a copy-engine collective has none)."""
        return not self.copy_engine

    def dram_per_byte(self, l2_bytes: float) -> float:
        """DRAM bytes per payload byte when ``l2_bytes`` of L2 are left to its footprint."""
        if self.footprint_bytes <= 0:
            return self.dram_base
        spill = max(0.0, self.footprint_bytes - max(0.0, l2_bytes)) / self.footprint_bytes
        return self.dram_base + self.dram_fifo * spill

    def time_under(self, l2_bytes: float, mem_bw: float, link_share: float = 1.0) -> float:
        """Its time with ``l2_bytes`` of L2 and ``mem_bw`` bytes/us of DRAM bandwidth left to it,
        and ``link_share`` of its links (other collectives on the same links take the rest)."""
        if self.wire_bytes <= 0:
            return self.fixed_us
        rate = min(self.rate_cap * link_share, max(mem_bw, 1e-6) / max(1e-9, self.dram_per_byte(l2_bytes)))
        return self.fixed_us + max(self.wire_bytes / rate, self.steps_us)

    def dram_demand(self, l2_bytes: float, link_share: float = 1.0) -> float:
        """DRAM bytes/us it pulls at its own (link-limited) pace."""
        if self.wire_bytes <= 0:
            return 0.0
        own = self.fixed_us + max(self.wire_bytes / (self.rate_cap * link_share), self.steps_us)
        return self.wire_bytes / own * self.dram_per_byte(l2_bytes)


def ring_shape(collective: CollectiveType, ranks: int) -> tuple[float, int]:
    """(bus factor, steps per loop) of a ring collective (nccl-tests; NCCL src/device/*.h)."""
    n = ranks
    if n <= 1:
        return 0.0, 1
    if collective is CollectiveType.ALLREDUCE:
        return 2.0 * (n - 1) / n, 2 * (n - 1)
    if collective in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER):
        return (n - 1) / n, n - 1
    if collective is CollectiveType.ALLTOALL:
        return (n - 1) / n, n - 1
    if collective is CollectiveType.SENDRECV:
        return 1.0, n - 1
    return 1.0, 1  # broadcast / reduce: one pipeline through n-1 hops


def hops(collective: CollectiveType, algorithm: Algorithm, ranks: int, nodes: int) -> tuple[int, int]:
    """(hops inside nodes, hops across nodes) on the collective's critical path."""
    n = ranks
    per_node = max(1, n // max(1, nodes))
    if algorithm is Algorithm.TREE and collective is CollectiveType.ALLREDUCE:
        net = 2 * int(math.log2(nodes)) if nodes > 1 else 0
        return 2 * (per_node - 1), net
    if algorithm is Algorithm.PAT:  # one GPU per node: ceil(log2 n) rounds, each a network hop
        return 0, log2_steps(n)
    if collective is CollectiveType.ALLREDUCE:
        net = 2 * nodes if nodes > 1 else 0
        return 2 * (n - 1) - net, net
    if collective in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER):
        net = nodes - 1
        return n - 1 - net, net
    net = 1 if nodes > 1 else 0
    return 1 - net, net


def link_bytes_per_us(p: dict, collective: CollectiveType, algorithm: Algorithm, ranks: int, nodes: int,
                      gpus_per_node: int) -> float:
    """The slowest hop's bandwidth for one rank's payload, bytes/us."""
    intra = p["intra_bw_gb_per_s"] * _GB
    per_node = max(1, ranks // max(1, nodes))
    nic_share = p["net_bw_gb_per_s"] * _GB * min(1.0, per_node / max(1, gpus_per_node))
    if nodes <= 1:
        link = intra
    elif collective is CollectiveType.ALLTOALL:
        local = (per_node - 1) / max(1, ranks - 1)
        remote = 1.0 - local
        link = 1.0 / max(local / intra if per_node > 1 else 0.0, remote / nic_share)
    else:
        link = min(intra, nic_share) if per_node > 1 else nic_share
    if algorithm is Algorithm.TREE:
        link *= p["tree_bw_factor"]
    return link


def protocol_numbers(p: dict, protocol: Protocol) -> tuple[float, float, float]:
    """(channel copy rate GB/s, payload share of the link, sync per step us)."""
    if protocol is Protocol.LL:
        return p["channel_bw_ll_gb_per_s"], p["ll_payload"], p["sync_ll_us"]
    if protocol is Protocol.LL128:
        return p["channel_bw_ll128_gb_per_s"], p["ll128_payload"], p["sync_ll128_us"]
    return p["channel_bw_simple_gb_per_s"], 1.0, p["sync_simple_us"]


def collective_estimate(
    p: dict,
    collective: CollectiveType,
    message_bytes: float,
    ranks: int,
    nodes: int,
    gpus_per_node: int,
    algorithm: Algorithm,
    protocol: Protocol,
    channels: int,
    threads: int,
    chunk_bytes: int,
    l2_bytes: float,
    mem_bw: float,
    hop_factors: tuple[float, float] = (1.0, 1.0),
) -> CollectiveEstimate:
    """The collective under a fully resolved setting; ``time_us`` alone on a GPU with
    ``l2_bytes`` of L2 and ``mem_bw`` bytes/us of DRAM bandwidth. ``hop_factors``: the protocol's
    (intra-node, network) hop latency over LL's (costmodel.nccl_defaults.protocol_hop_factors),
    as the simulator charges it."""
    nc = max(1, int(channels))
    n = max(1, int(ranks))
    nodes = max(1, int(nodes))
    size = float(max(1, message_bytes))
    if n <= 1:
        t = p["launch_us"]
        return CollectiveEstimate(t, t, 0.0, 0.0, 1.0, nc, 0.0, 0.0, 0.0, nodes > 1)
    ch_gb, payload, sync = protocol_numbers(p, protocol)
    r = ch_gb * _GB * min(1.0, max(1, threads) / p["saturation_threads"])
    bus, steps_per_loop = ring_shape(collective, n)
    link = link_bytes_per_us(p, collective, algorithm, n, nodes, gpus_per_node)
    rate_cap = min(nc * r, link * payload)
    rooted = collective in (CollectiveType.BROADCAST, CollectiveType.REDUCE)
    share = size / nc if rooted else size / (n * nc)
    c = max(1.0, min(max(1.0, chunk_bytes) * payload, share))
    loops = max(1, math.ceil(share / c - 1e-9))
    step = c / r + sync
    intra_hops, net_hops = hops(collective, algorithm, n, nodes)
    latency = intra_hops * p["intra_hop_us"] * hop_factors[0] + net_hops * p["net_hop_us"] * hop_factors[1]
    fill = step * (n - 2 if rooted else 1)
    fixed = p["launch_us"] + protocol_base_excess_us(protocol) + latency + fill  # as the simulator
    # NCCL's last loop runs a smaller chunk (realChunkSize): only the synchronisations are quantised,
    # and what a channel keeps in flight is the chunk it really uses (in buffer bytes)
    est = CollectiveEstimate(
        time_us=0.0, fixed_us=fixed, wire_bytes=bus * size,
        # PAT aggregates a loop's n-1 sends into ceil(log2 n) synchronised steps
        steps_us=steps_per_loop * share / r + (log2_steps(n) if algorithm is Algorithm.PAT else steps_per_loop)
        * loops * sync,
        rate_cap=rate_cap, ctas=nc, footprint_bytes=p["fifo_chunks"] * nc * c / payload,
        dram_base=p["coll_dram_per_byte"], dram_fifo=p["fifo_dram_per_byte"], crosses_net=nodes > 1,
    )
    return _with_time(est, est.time_under(l2_bytes, mem_bw))


def resolved_estimate(p: dict, collective: CollectiveType, message_bytes: float, ranks: int, nodes: int,
                      gpus_per_node: int, config: CommConfig, max_ctas: int, l2_bytes: float,
                      mem_bw: float, hop_factors: HopFactors) -> CollectiveEstimate:
    """:func:`collective_estimate` under ``config``, which sets every knob of NCCL's kernels
    (``costmodel.nccl_defaults.resolve_config``'s output); a channel is a CTA: at most ``max_ctas``."""
    assert (config.algorithm is not None and config.protocol is not None and config.channels is not None
            and config.threads is not None and config.chunk_bytes is not None)  # resolve_config sets every knob
    return collective_estimate(p, collective, message_bytes, ranks, nodes, gpus_per_node, config.algorithm,
                               config.protocol, min(config.channels, max_ctas), config.threads, config.chunk_bytes,
                               l2_bytes, mem_bw, hop_factors(config.algorithm, config.protocol))


def _with_time(est: CollectiveEstimate, time_us: float) -> CollectiveEstimate:
    object.__setattr__(est, "time_us", time_us)
    return est


def copy_engine_estimate(p: dict, collective: CollectiveType, message_bytes: float, ranks: int, nodes: int,
                         gpus_per_node: int, l2_bytes: float, mem_bw: float) -> CollectiveEstimate:
    """NCCL's copy-engine collective (CTA policy ZERO, registered buffers): two barriers of one
    small copy-engine write per peer of the node, one batch of copies at the copy engines' rate
    (across nodes, from NCCL 2.30.6, the network part at the NICs' share)."""
    n = max(1, int(ranks))
    nodes = max(1, int(nodes))
    bus, _ = ring_shape(collective, n)
    link = p["ce_bw_gb_per_s"] * _GB
    local_peers = max(1, min(n, n // nodes) - 1)
    barrier = local_peers * p["ce_copy_latency_us"] + p["intra_hop_us"]
    fixed = p["launch_us"] + 2 * barrier
    if nodes > 1:
        per_node = max(1, n // nodes)
        link = min(link, p["net_bw_gb_per_s"] * _GB * min(1.0, per_node / max(1, gpus_per_node)))
        fixed += 2 * p["net_hop_us"]
    est = CollectiveEstimate(time_us=0.0, fixed_us=fixed, steps_us=0.0, wire_bytes=bus * float(max(1, message_bytes)),
                             rate_cap=link, ctas=0, footprint_bytes=0.0, dram_base=p["direct_dram_per_byte"],
                             dram_fifo=0.0, crosses_net=nodes > 1, copy_engine=True)
    return _with_time(est, est.time_under(l2_bytes, mem_bw))


def symmetric_estimate(p: dict, collective: CollectiveType, message_bytes: float, ranks: int, ctas: int,
                       bus_bytes: float, cta_bw: float, peak_bw: float, l2_bytes: float,
                       mem_bw: float) -> CollectiveEstimate:
    """NCCL's symmetric kernel (its pick: ``ctas``, its model's bus bytes, per-CTA and peak
    bandwidth, bytes/us): holds its CTAs, no FIFO, no chunk steps; a launch and one hop before
    its data (NCCL's base latency is its picker's figure, not the kernel's time)."""
    bus, _ = ring_shape(collective, max(1, int(ranks)))
    wire = bus * float(max(1, message_bytes))
    rate = min(ctas * cta_bw, peak_bw, p["intra_bw_gb_per_s"] * _GB)
    est = CollectiveEstimate(time_us=0.0, fixed_us=p["launch_us"] + p["intra_hop_us"], steps_us=0.0,
                             wire_bytes=bus_bytes, rate_cap=rate,
                             ctas=ctas, footprint_bytes=0.0,
                             dram_base=p["direct_dram_per_byte"] * wire / max(1.0, bus_bytes), dram_fifo=0.0)
    return _with_time(est, est.time_under(l2_bytes, mem_bw))


def nvls_estimate(p: dict, collective: CollectiveType, message_bytes: float, ranks: int, nodes: int, channels: int,
                  chunk_bytes: int, l2_bytes: float, mem_bw: float) -> CollectiveEstimate:
    """NVLS (one node) or NVLSTree (AllReduce across nodes): the switch reduces and multicasts
    (the simulator's ``CollectiveModel.nvls``). Per GPU the NVLink carries ``S (n+1)/n`` for an
    AllReduce (``S`` for AllGather / ReduceScatter), its ``channels`` CTAs at ``nvls_channel_bw``
    each; across nodes the node's ``S`` goes up and down a tree over its NICs. No reduction math on
    the SMs; two NVLS buffers' slices per channel in L2; DRAM: input read, result written once."""
    n = max(1, int(ranks))
    nodes = max(1, int(nodes))
    local = max(1, n // nodes)
    size = float(max(1, message_bytes))
    nc = max(1, int(channels))
    r = p["nvls_channel_bw_gb_per_s"] * _GB
    allreduce = collective is CollectiveType.ALLREDUCE
    wire_per_byte = (local + 1) / local if allreduce else 1.0
    rate = min(nc * r, p["intra_bw_gb_per_s"] * _GB) / wire_per_byte
    latency = p["intra_hop_us"] * NVLS_SWITCH_LATENCY_FACTOR
    if nodes > 1:
        latency += 2 * log2_steps(nodes) * p["net_hop_us"] * NVLS_TREE_NET_LATENCY_FACTOR
        rate = min(rate, p["net_bw_gb_per_s"] * _GB * p["tree_bw_factor"])  # the node's S over all its NICs
    c = max(1.0, min(float(max(1, chunk_bytes)), size / (local * nc)))
    loops = max(1, math.ceil(size / (local * nc * c) - 1e-9))
    sync = p["sync_simple_us"]
    est = CollectiveEstimate(
        time_us=0.0, fixed_us=p["launch_us"] + latency + c / r + sync,
        steps_us=wire_per_byte * size / (nc * r) + (2 if allreduce else 1) * loops * sync,
        wire_bytes=size, rate_cap=rate, ctas=nc, footprint_bytes=2 * p["fifo_chunks"] * nc * c if n > 1 else 0.0,
        dram_base=2.0 if allreduce else (local + 1) / local, dram_fifo=p["fifo_dram_per_byte"] * wire_per_byte,
        crosses_net=nodes > 1)
    return _with_time(est, est.time_under(l2_bytes, mem_bw))


def collnet_estimate(p: dict, message_bytes: float, ranks: int, nodes: int, gpus_per_node: int, channels: int,
                     threads: int, chunk_bytes: int, l2_bytes: float, mem_bw: float) -> CollectiveEstimate:
    """CollNetDirect AllReduce (the simulator's ``CollectiveModel.collnet_direct``): the network
    reduces; inside the node ``2(p-1)/p S`` per GPU over NVLink, across it the node's ``S`` once over
    its NICs; a ring-like FIFO; DRAM as NVLS."""
    n = max(1, int(ranks))
    nodes = max(1, int(nodes))
    local = max(1, n // nodes)
    size = float(max(1, message_bytes))
    nc = max(1, int(channels))
    r = p["channel_bw_simple_gb_per_s"] * _GB * min(1.0, max(1, threads) / p["saturation_threads"])
    intra_wire = 2.0 * (local - 1) / local
    rate = p["net_bw_gb_per_s"] * _GB * min(1.0, local / max(1, gpus_per_node))  # the group's share of the NICs
    if intra_wire > 0:
        rate = min(rate, min(nc * r, p["intra_bw_gb_per_s"] * _GB) / intra_wire)
    latency = (2 * (min(1, local - 1) * p["intra_hop_us"] * COLLNET_INTRA_LATENCY_FACTOR
                    + (local - 1) * COLLNET_ARITY_US) + p["net_hop_us"] * COLLNET_NET_LATENCY_FACTOR)
    c = max(1.0, min(float(max(1, chunk_bytes)), size / (local * nc)))
    loops = max(1, math.ceil(size / (local * nc * c) - 1e-9))
    sync = p["sync_simple_us"]
    per_byte = max(intra_wire, 1.0 / local)
    est = CollectiveEstimate(
        time_us=0.0, fixed_us=p["launch_us"] + latency + c / r + sync,
        steps_us=per_byte * size / (nc * r) + 2 * loops * sync, wire_bytes=size, rate_cap=rate, ctas=nc,
        footprint_bytes=p["fifo_chunks"] * nc * c, dram_base=2.0, dram_fifo=p["fifo_dram_per_byte"] * per_byte,
        crosses_net=True)
    return _with_time(est, est.time_under(l2_bytes, mem_bw))
