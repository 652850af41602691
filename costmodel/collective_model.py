"""Closed-form time of one collective running alone, from its NCCL settings.

A pure function over plain numbers (the adapter that feeds it is
:mod:`costmodel.analytic`); parameters come from :mod:`costmodel.model_params`.

The collective is a pipeline of chunks over ``channels`` parallel channels:

* ``steps`` S: hops one piece of data makes (Ring AllReduce 2(n-1); AllGather,
  ReduceScatter, Broadcast, Reduce, AlltoAll n-1; Tree AllReduce twice the tree depth).
* ``wire`` W: bytes one rank sends (nccl-tests bus factor x message: 2(n-1)/n for
  AllReduce, (n-1)/n for AllGather / ReduceScatter / AlltoAll, 1 for Broadcast).
* Each channel moves W / (S * NC) bytes per step, in ``k`` chunks of ``c`` <= chunk bytes.
* Bandwidth B = min(link ceiling x protocol's payload share, NC x channel bandwidth
  (protocol, threads)): saturating in channels; the link ceiling is the slowest hop
  (the NICs across nodes).
* One pipeline stage costs ``alpha + c / (B / NC)`` (latency per step, plus the chunk
  over the channel's share of bandwidth); the pipeline runs S*k stages plus a fill of
  ``pipeline_fill x (S - 1)`` stages, so time is unimodal in the chunk size: small
  chunks pay latency per stage, large ones a long fill.
* Plus a fixed launch cost and a small cost per channel (too many channels is slower).

Latency, bandwidth, chunk and channel terms are reported separately
(:class:`CollectiveEstimate`) so calibration can report residuals per term.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nccl_env.knobs import Algorithm, CollectiveType, Protocol

_GB = 1e9 / 1e6  # bytes per microsecond in one GB/s

# Memory bytes touched per wire byte before the fitted scale: a reducing collective
# reads its input and the received data and writes the sum (3), a copying one reads
# and writes (2). NCCL src/device/prims_simple.h: recvReduceSend / directRecvCopySend.
_MEM_TOUCHES = {
    CollectiveType.ALLREDUCE: 3.0,
    CollectiveType.REDUCESCATTER: 3.0,
    CollectiveType.REDUCE: 3.0,
    CollectiveType.ALLGATHER: 2.0,
    CollectiveType.BROADCAST: 2.0,
    CollectiveType.ALLTOALL: 2.0,
    CollectiveType.SENDRECV: 2.0,
}


@dataclass(frozen=True)
class CollectiveEstimate:
    """One collective alone: its time and what it puts on the GPU while it runs."""

    time_us: float
    latency_us: float  # launch + per-stage latency
    bandwidth_us: float  # bytes over bandwidth, incl. pipeline fill
    channel_us: float  # per-channel cost
    wire_bytes: float  # bytes one rank sends
    mem_bytes: float  # device-memory bytes it reads + writes (drives V(NC, C))
    channels: int
    footprint_bytes: float  # bytes it keeps in flight (L2 pressure)

    @property
    def mem_bw_bytes_per_us(self) -> float:
        """V: device-memory bandwidth it consumes while running at this speed."""
        return self.mem_bytes / self.time_us if self.time_us > 0 else 0.0


def ring_steps(collective: CollectiveType, ranks: int) -> int:
    """Hops per piece of data on a ring (NCCL src/device/all_reduce.h etc.)."""
    if ranks <= 1:
        return 0
    if collective is CollectiveType.ALLREDUCE:
        return 2 * (ranks - 1)
    if collective is CollectiveType.SENDRECV:
        return 1
    return ranks - 1


def wire_bytes(collective: CollectiveType, message_bytes: float, ranks: int) -> float:
    """Bytes one rank sends (nccl-tests bus bandwidth factors, REFERENCE.md section 5)."""
    if ranks <= 1:
        return 0.0
    if collective is CollectiveType.ALLREDUCE:
        return message_bytes * 2.0 * (ranks - 1) / ranks
    if collective in (CollectiveType.BROADCAST, CollectiveType.REDUCE, CollectiveType.SENDRECV):
        return float(message_bytes)
    return message_bytes * (ranks - 1) / ranks


def link_ceiling_gb_per_s(p: dict, collective: CollectiveType, ranks: int, nodes: int) -> float:
    """The slowest hop's bandwidth for one rank's traffic (GB/s)."""
    intra = p["intra_bw_gb_per_s"]
    if nodes <= 1:
        return intra
    net = p["net_bw_gb_per_s"]
    if collective is CollectiveType.ALLTOALL:
        # Every rank of a node sends (n - g)/(n - 1) of its data over the node's NICs.
        per_node = max(1, ranks // nodes)
        off_node = (ranks - per_node) / max(1, ranks - 1)
        return min(intra, net / max(1e-9, per_node * off_node))
    return min(intra, net)  # a ring crosses each node boundary once per channel


def protocol_link_factor(p: dict, protocol: Protocol) -> float:
    """Share of a link's bytes that are payload under ``protocol``."""
    if protocol is Protocol.LL:
        return p["ll_link_factor"]
    if protocol is Protocol.LL128:
        return p["ll128_link_factor"]
    return 1.0


def channel_bw_gb_per_s(p: dict, protocol: Protocol, threads: int) -> float:
    """One channel's payload bandwidth with ``threads`` threads."""
    if protocol is Protocol.LL:
        base = p["channel_bw_ll_gb_per_s"]
    elif protocol is Protocol.LL128:
        base = p["channel_bw_ll128_gb_per_s"]
    else:
        base = p["channel_bw_simple_gb_per_s"]
    return base * (max(32, threads) / 512.0) ** p["thread_exponent"]


def step_latency_us(p: dict, protocol: Protocol, nodes: int) -> float:
    if protocol is Protocol.LL:
        base = p["step_ll_us"]
    elif protocol is Protocol.LL128:
        base = p["step_ll128_us"]
    else:
        base = p["step_simple_us"]
    return base + (p["net_step_us"] if nodes > 1 else 0.0)


def collective_estimate(
    p: dict,
    collective: CollectiveType,
    message_bytes: float,
    ranks: int,
    nodes: int,
    algorithm: Algorithm,
    protocol: Protocol,
    channels: int,
    threads: int,
    chunk_bytes: int,
) -> CollectiveEstimate:
    """Time of one collective alone under a fully resolved configuration."""
    nc = max(1, int(channels))
    if ranks <= 1 or message_bytes <= 0:
        t = p["launch_us"]
        return CollectiveEstimate(t, t, 0.0, 0.0, 0.0, 0.0, nc, 0.0)
    per_channel = channel_bw_gb_per_s(p, protocol, threads)
    ceiling = link_ceiling_gb_per_s(p, collective, ranks, nodes)
    if algorithm is Algorithm.TREE and collective is CollectiveType.ALLREDUCE:
        per_node = max(1, ranks // max(1, nodes))
        depth = (per_node - 1) + (math.ceil(math.log2(nodes)) if nodes > 1 else 0)
        steps = max(1, 2 * depth)
        wire = 2.0 * message_bytes  # up the tree and down again
        ceiling *= p["tree_bw_factor"]
    else:
        steps = ring_steps(collective, ranks)
        wire = wire_bytes(collective, message_bytes, ranks)
    bw = min(ceiling * protocol_link_factor(p, protocol), nc * per_channel) * _GB  # bytes/us, all channels
    per_step_channel = wire / (steps * nc)
    chunk = max(1.0, float(chunk_bytes))
    k = max(1, math.ceil(per_step_channel / chunk))
    c = per_step_channel / k
    alpha = step_latency_us(p, protocol, nodes)
    stages = steps * k + p["pipeline_fill"] * (steps - 1)
    latency = p["launch_us"] + stages * alpha
    bandwidth = stages * c * nc / bw
    channel = nc * p["channel_overhead_us"]
    mem = wire * _MEM_TOUCHES.get(collective, 2.0) * p["mem_traffic_scale"]
    footprint = nc * chunk * p["l2_footprint_per_channel_chunk"]
    return CollectiveEstimate(latency + bandwidth + channel, latency, bandwidth, channel, wire, mem, nc, footprint)
