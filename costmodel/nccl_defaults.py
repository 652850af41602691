"""NCCL's default choices for a collective on a cluster: algorithm, protocol, channels, threads, chunk.

A re-statement in Python of NCCL 2.18's own tuning model (not a copy of its code):

* ``src/graph/tuning.cc`` (``ncclTopoTuneModel``): for every (algorithm, protocol) a
  latency ``baseLat + steps x hwLat`` and a bandwidth ``nChannels x bw x refinements``
  (LL carries 1/4 of the bus bandwidth on rings, LL128 0.92 capped per channel, Tree
  0.92 capped per channel, ...), turned into algorithm bandwidth with ``nRanks / nsteps``;
* ``ncclTopoGetAlgoTime``: ``time = latency + nBytes / (1000 x bw)`` with the tree
  correction factors and the multi-node ring "plateau" latency factor; the fastest
  enabled pair wins (``src/enqueue.cc`` ``getAlgoInfo``);
* channel/thread tuning (``getAlgoInfo``): start from the communicator's channels and
  the protocol's maximum threads and shed channels, then threads, while
  ``nBytes < nChannels x nThreads x threadThreshold``;
* chunk (``computeColl``): ``BUFFSIZE / NCCL_STEPS x chunkSteps`` (Simple ring: 4 MiB / 8 x 4
  = 2 MiB), with the tree's depth-driven halving.

Simplifications (said out loud): the topology search is not re-run; its result is the
cluster's ``nccl_graph`` section (or derived from the link kind); the tree graph is
taken equal to the ring graph; CollNet and NVLS are disabled (the simulator has no
in-network or in-switch reduction); the CPU is taken as Intel (net overhead 1 us);
AllToAll/SendRecv use NCCL's p2p path (Simple, ``p2pnChannelsPerPeer`` = 2 channels
per peer, NCCL_MAX_NTHREADS threads whatever NCCL_NTHREADS says, a 128 KiB step across
nodes or over PCIe and 512 KiB inside an NVSwitch node: init.cc computeBuffSizes; an
``nvlink`` preset, such as A40 bridges between pairs, is not all-NVLink for NCCL).

``nccl_default_config`` fills EVERY field of a CommConfig. ``cluster.nccl_defaults``
(keys ``algorithm``, ``protocol``, ``channels``, ``threads``, ``chunk_bytes``, plus
optional per-collective mappings under ``by_collective: {allgather: {...}}``) win
over the model. ``threads`` is the NCCL_NTHREADS-style knob value (the extra sync
warp NCCL adds to Simple rings is not counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from costmodel.cluster import ClusterSpec
from nccl_env.errors import LagomError
from nccl_env.knob_table import PATH
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import DEFAULT_BUFFSIZE_BYTES, NCCL_STEPS, P2P_COLLECTIVES, max_channels

# ---- NCCL constants (NCCL 2.18.3, src/include/devcomm.h, comm.h, collectives.h) -----------------
SIMPLE_MAX_NTHREADS = 512  # devcomm.h NCCL_SIMPLE_MAX_NTHREADS
LL_MAX_NTHREADS = 512  # devcomm.h NCCL_LL_MAX_NTHREADS
LL128_MAX_NTHREADS = 640  # devcomm.h NCCL_LL128_MAX_NTHREADS
LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16  # LL_LINES_PER_THREAD x LL_MAX_NTHREADS x STEPS x sizeof(ncclLLFifoLine)
LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8  # LL128_ELEMS_PER_THREAD x LL128_MAX_NTHREADS x STEPS x sizeof(uint64_t)
RING_CHUNKSTEPS = NCCL_STEPS // 2  # collectives.h ALLREDUCE/ALLGATHER/REDUCESCATTER_CHUNKSTEPS
THREAD_THRESHOLD = {Protocol.LL: 8, Protocol.LL128: 8, Protocol.SIMPLE: 64}  # comm.h NCCL_*_THREAD_THRESHOLD
PCI_BW_GB_PER_S = 12.0  # topo.h PCI_BW (Gen3 x16), the simpleDefaultThreads threshold
P2P_CHANNELS_PER_PEER = 2  # NCCL_NCHANNELS_PER_NET_PEER / p2pnChannelsPerPeer default
P2P_NVL_CHUNK_BYTES = 1 << 19  # NCCL_P2P_NVL_CHUNKSIZE default 512 KiB (init.cc): every GPU pair on NVLink
P2P_PCI_CHUNK_BYTES = 1 << 17  # NCCL_P2P_PCI_CHUNKSIZE default 128 KiB (init.cc)
P2P_NET_CHUNK_BYTES = 1 << 17  # NCCL_P2P_NET_CHUNKSIZE default 128 KiB (init.cc)
# p2p kernels run NCCL_MAX_NTHREADS = 640 (enqueue.cc); kept at the knob's 64-512 range, saturated either way
P2P_THREADS = 512

_ALGOS = (Algorithm.TREE, Algorithm.RING)
_PROTOS = (Protocol.LL, Protocol.LL128, Protocol.SIMPLE)

# tuning.cc baseLat [algo][proto], us: Tree {LL, LL128, Simple}, Ring {LL, LL128, Simple}
BASE_LAT_US = {
    Algorithm.TREE: {Protocol.LL: 6.8, Protocol.LL128: 14.0, Protocol.SIMPLE: 0.0},
    Algorithm.RING: {Protocol.LL: 6.6, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
}
# tuning.cc hwLat [hw][algo][proto], us per step/hop
HW_LAT_US = {
    "nvlink": {
        Algorithm.TREE: {Protocol.LL: 0.6, Protocol.LL128: 1.25, Protocol.SIMPLE: 4.0},
        Algorithm.RING: {Protocol.LL: 0.6, Protocol.LL128: 1.9, Protocol.SIMPLE: 3.4},
    },
    "pci": {
        Algorithm.TREE: {Protocol.LL: 1.0, Protocol.LL128: 1.9, Protocol.SIMPLE: 6.0},
        Algorithm.RING: {Protocol.LL: 1.0, Protocol.LL128: 2.5, Protocol.SIMPLE: 5.7},
    },
    "net": {
        Algorithm.TREE: {Protocol.LL: 5.0, Protocol.LL128: 8.5, Protocol.SIMPLE: 14.0},
        Algorithm.RING: {Protocol.LL: 2.7, Protocol.LL128: 4.0, Protocol.SIMPLE: 14.0},
    },
}
# tuning.cc per-compute-capability tables, rows Volta/Ampere/Hopper, columns nNodes 1/2/>2
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0))
PER_CH_MAX_RING_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128_BWS = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE_BWS = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# tuning.cc treeCorrectionFactor[proto][log2(nBytes/64)], 64 B .. 256 MiB
TREE_CORRECTION = {
    Protocol.LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    Protocol.LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    Protocol.SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}
NET_OVERHEAD_US = 1.0  # tuning.cc getNetOverhead: Intel x86 CPU

_FUNC_NSTEPS_KIND = {
    CollectiveType.ALLREDUCE: "allreduce",
    CollectiveType.ALLGATHER: "gather",
    CollectiveType.REDUCESCATTER: "gather",
    CollectiveType.BROADCAST: "rooted",
    CollectiveType.REDUCE: "rooted",
}


@dataclass(frozen=True)
class NcclGraph:
    """The result of NCCL's topology search that the tuning model needs."""

    type_intra: str  # "nvl" or "pci"
    ring_channels: int  # rings found by the search (before init duplicates them)
    bw_intra_gb_per_s: float  # per channel
    bw_inter_gb_per_s: float  # per channel
    compute_capability: int


def nccl_graph(cluster: ClusterSpec) -> NcclGraph:
    """The cluster's ``nccl_graph`` section, or a guess from its links when absent."""
    g = cluster.nccl_graph or {}
    nvl = cluster.intra_node.kind in ("nvlink", "nvswitch")
    try:
        return NcclGraph(
            type_intra=str(g.get("type_intra", "nvl" if nvl else "pci")),
            ring_channels=int(g.get("ring_channels", max(1, round(cluster.intra_node.bw_gb_per_s / 20.0)))),
            bw_intra_gb_per_s=float(g.get("ring_bw_intra_gb_per_s",
                                          min(cluster.intra_node.bw_gb_per_s, 20.0 if nvl else 24.0))),
            bw_inter_gb_per_s=float(g.get("ring_bw_inter_gb_per_s", cluster.inter_node.nic_bw_gb_per_s)),
            compute_capability=int(g.get("compute_capability", 80)),
        )
    except (TypeError, ValueError) as exc:
        raise LagomError(f"cluster {cluster.name}: malformed 'nccl_graph' section: {exc}") from None


def cluster_max_channels(cluster: ClusterSpec) -> int:
    """MAXCHANNELS of the cluster's NCCL (``nccl_env.rules.max_channels``)."""
    return max_channels(cluster.nccl_version)


def comm_channels(cluster: ClusterSpec, nodes: int = 1) -> int:
    """Channels a communicator opens (connect.cc): search rings doubled, capped at MAXCHANNELS;
    Hopper multi-node communicators with fast NVLink double once more."""
    graph = nccl_graph(cluster)
    limit = cluster_max_channels(cluster)
    nc = min(limit, graph.ring_channels * 2)
    if graph.compute_capability >= 90 and nodes > 1 and graph.bw_intra_gb_per_s > 45.0 and 2 * nc <= limit:
        nc *= 2
    return nc


def nccl_nbytes(signature: Signature) -> int:
    """NCCL 2.18's ``info->nBytes``: the whole buffer. For AllGather/ReduceScatter
    ``ncclInfoSetDerived`` (src/include/info.h) multiplies the per-rank count by nRanks, which
    is Signature.message_bytes (the larger of the rank's input and output buffers)."""
    return signature.message_bytes


@dataclass(frozen=True)
class AlgoEstimate:
    algorithm: Algorithm
    protocol: Protocol
    latency_us: float
    bw_gb_per_s: float  # algorithm bandwidth, NCCL's model
    time_us: float

    @property
    def pair(self) -> tuple[Algorithm, Protocol]:
        return self.algorithm, self.protocol


def _compcap_index(cc: int) -> int:
    return 2 if cc >= 90 else 1 if cc >= 80 else 0


def _ll128_enabled(graph: NcclGraph) -> bool:
    # tuning.cc: LL128 only on NVLink paths with compute capability 7.0, 8.0 or 9.0
    return graph.type_intra == "nvl" and graph.compute_capability in (70, 80, 90)


def _max_threads(graph: NcclGraph, algo: Algorithm, proto: Protocol) -> int:
    if proto is Protocol.LL128:
        return LL128_MAX_NTHREADS
    if proto is Protocol.LL:
        return LL_MAX_NTHREADS
    if algo is Algorithm.RING:
        # tuning.cc simpleDefaultThreads: 256 when the ring's bandwidth fits a PCIe Gen3 link
        return 256 if graph.bw_intra_gb_per_s * graph.ring_channels <= PCI_BW_GB_PER_S else SIMPLE_MAX_NTHREADS
    return SIMPLE_MAX_NTHREADS


def algo_estimates(cluster: ClusterSpec, signature: Signature) -> list[AlgoEstimate]:
    """NCCL's time estimate for every enabled (algorithm, protocol) of this collective."""
    kind = _FUNC_NSTEPS_KIND.get(signature.collective)
    if kind is None:
        return []
    graph = nccl_graph(cluster)
    n_ranks = max(1, signature.ranks)
    n_nodes = max(1, signature.nodes)
    if n_ranks <= 1:
        return [AlgoEstimate(Algorithm.RING, Protocol.SIMPLE, 0.0, float("inf"), 0.0)]
    nbytes = nccl_nbytes(signature)
    if kind == "allreduce":
        nsteps, n_inter = 2 * (n_ranks - 1), (2 * n_nodes if n_nodes > 1 else 0)
    elif kind == "gather":
        nsteps, n_inter = n_ranks - 1, n_nodes - 1
    else:
        nsteps, n_inter = n_ranks, n_nodes
    cci = _compcap_index(graph.compute_capability)
    index2 = n_nodes - 1 if n_nodes <= 2 else 2
    ll_max_bw = LL_MAX_BWS[cci if n_nodes == 1 else 0][index2]
    ppn = n_ranks / n_nodes
    intra_hw = "nvlink" if graph.type_intra == "nvl" else "pci"
    # A group with one rank per node has no intra-node hop: its "intra" bandwidth is the NIC's.
    bw_intra = graph.bw_intra_gb_per_s if ppn > 1 else graph.bw_inter_gb_per_s
    channels_total = comm_channels(cluster, n_nodes)
    out: list[AlgoEstimate] = []
    for algo in _ALGOS:
        if algo is Algorithm.TREE and kind != "allreduce":
            continue
        for proto in _PROTOS:
            if proto is Protocol.LL128 and not _ll128_enabled(graph):
                continue
            bw = bw_intra if n_nodes <= 2 else graph.bw_inter_gb_per_s
            bus_bw = graph.ring_channels * bw
            if algo is Algorithm.RING and proto is Protocol.LL:
                factor = 1.0 / 4.0 if (n_nodes > 1 or kind == "allreduce"
                                       or signature.collective is CollectiveType.REDUCE) else 1.0 / 3.0
                bus_bw = min(ll_max_bw, bus_bw * factor)
            if algo is Algorithm.RING and proto is Protocol.LL128:
                bus_bw = min(bus_bw * (0.7 if ppn < 2 else 0.92),
                             graph.ring_channels * PER_CH_MAX_RING_LL128_BWS[cci][index2])
            if algo is Algorithm.TREE:
                bus_bw = min(bus_bw * 0.92, graph.ring_channels * PER_CH_MAX_TREE_BWS[cci][index2])
                if proto is Protocol.LL:
                    bus_bw = min(bus_bw / 3.8, ll_max_bw)
                if proto is Protocol.LL128:
                    bus_bw = min(bus_bw * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0),
                                 graph.ring_channels * PER_CH_MAX_TREE_LL128_BWS[cci][index2])
            ratio = n_ranks / nsteps if algo is Algorithm.RING else 0.5
            alg_bw = bus_bw * ratio
            lat = BASE_LAT_US[algo][proto]
            intra_lat = HW_LAT_US[intra_hw][algo][proto]
            inter_lat = HW_LAT_US["net"][algo][proto]
            if algo is Algorithm.RING:
                if kind == "rooted":
                    lat += HW_LAT_US["net" if n_nodes > 1 else intra_hw][algo][proto]
                else:
                    overhead = 0.0
                    if n_nodes > 1:
                        overhead = NET_OVERHEAD_US * (3 if proto is Protocol.SIMPLE else 1)
                    intra_lat = max(intra_lat, overhead)
                    lat += (nsteps - n_inter) * intra_lat + n_inter * inter_lat
            else:
                lat += 2 * ((n_ranks // n_nodes - 1) * intra_lat + int(math.log2(n_nodes)) * inter_lat)
            # ncclTopoGetAlgoTime
            log_size = int(math.log2(max(1, nbytes >> 6))) if nbytes >= 64 else 0
            if algo is Algorithm.TREE and log_size < 23:
                alg_bw *= TREE_CORRECTION[proto][log_size]
            if (algo is Algorithm.RING and proto is Protocol.SIMPLE and n_nodes > 1 and kind == "allreduce"
                    and nbytes / (channels_total * n_ranks) >= 64):
                lat *= 1.9 if graph.compute_capability < 80 else 1.4
            time_us = lat + nbytes / (1000.0 * alg_bw) if alg_bw > 0 else float("inf")
            out.append(AlgoEstimate(algo, proto, lat, alg_bw, time_us))
    return out


def _chunk_bytes(algo: Algorithm, proto: Protocol, signature: Signature, channels: int) -> int:
    if proto is Protocol.LL:
        return LL_BUFFSIZE // NCCL_STEPS
    if proto is Protocol.LL128:
        step = LL128_BUFFSIZE // NCCL_STEPS
        if algo is Algorithm.TREE:  # enqueue.cc: LL128 tree halving
            nbytes = nccl_nbytes(signature)
            nodes = max(1, signature.nodes)
            ppn = signature.ranks / nodes
            nsteps = 1 + int(math.log2(nodes)) + 0.1 * ppn
            while nbytes / (channels * step) < nsteps * 64 / ppn and step > 131072:
                step //= 2
            while nbytes / (channels * step) < nsteps * 16 / ppn and step > 32768:
                step //= 2
        return step
    step = DEFAULT_BUFFSIZE_BYTES // NCCL_STEPS
    if algo is Algorithm.RING:
        rooted = signature.collective in (CollectiveType.BROADCAST, CollectiveType.REDUCE)
        return step * (1 if rooted else RING_CHUNKSTEPS)
    # enqueue.cc: tree Simple chunk halving by tree depth
    nbytes = nccl_nbytes(signature)
    nodes = max(1, signature.nodes)
    depth = signature.ranks // nodes - 1 + int(math.log2(nodes))
    chunk = step
    while nbytes / (channels * chunk) < depth * 8 and chunk > 131072:
        chunk //= 2
    while nbytes / (channels * chunk) < depth * 4 and chunk > 65536:
        chunk //= 2
    while nbytes / (channels * chunk) < depth and chunk > 32768:
        chunk //= 2
    return chunk


def _first(value, fallback):
    """``value`` unless it is None (enums such as Protocol.LL are 0, so never use ``or``)."""
    return fallback if value is None else value


def _p2p_config(cluster: ClusterSpec, signature: Signature) -> CommConfig:
    peers = max(1, signature.ranks - 1)
    channels = min(cluster_max_channels(cluster), max(1, P2P_CHANNELS_PER_PEER * peers))
    if signature.nodes > 1:
        chunk = P2P_NET_CHUNK_BYTES
    else:  # ncclTopoPathAllNVLink: only an NVSwitch node has NVLink between every pair
        chunk = P2P_NVL_CHUNK_BYTES if cluster.intra_node.kind == "nvswitch" else P2P_PCI_CHUNK_BYTES
    return CommConfig(Algorithm.RING, Protocol.SIMPLE, channels, P2P_THREADS, chunk)


def _model_config(cluster: ClusterSpec, signature: Signature, algo: Algorithm | None = None,
                  proto: Protocol | None = None, channels: int | None = None) -> CommConfig:
    """NCCL's choice, restricted to ``algo``/``proto`` when given (as NCCL_ALGO/NCCL_PROTO would)."""
    if signature.collective not in _FUNC_NSTEPS_KIND:
        base = _p2p_config(cluster, signature)
        return CommConfig(_first(algo, base.algorithm), _first(proto, base.protocol),
                          _first(channels, base.channels), base.threads, base.chunk_bytes)
    estimates = [e for e in algo_estimates(cluster, signature)
                 if (algo is None or e.algorithm is algo) and (proto is None or e.protocol is proto)]
    if not estimates:  # the forced pair is not one NCCL's model enables: keep it, model the rest
        best_algo = _first(algo, Algorithm.RING)
        best_proto = _first(proto, Protocol.SIMPLE)
    else:
        best = min(estimates, key=lambda e: e.time_us)
        best_algo, best_proto = best.algorithm, best.protocol
    graph = nccl_graph(cluster)
    nbytes = nccl_nbytes(signature)
    nc = channels if channels else comm_channels(cluster, max(1, signature.nodes))
    nt = _max_threads(graph, best_algo, best_proto)
    threshold = THREAD_THRESHOLD[best_proto]
    if best_algo is Algorithm.RING and best_proto is Protocol.LL:
        threshold *= max(1, signature.ranks)
    if not channels:
        while nbytes < nc * nt * threshold:
            if nc >= 2:
                nc -= 1
            elif nt % 128 == 0:
                nt //= 2
            else:
                break
    return CommConfig(best_algo, best_proto, nc, nt, _chunk_bytes(best_algo, best_proto, signature, nc))


def _overrides(cluster: ClusterSpec, signature: Signature) -> CommConfig:
    raw = dict(cluster.nccl_defaults or {})
    per = raw.pop("by_collective", None) or {}
    try:
        config = CommConfig.from_dict(raw)
        if isinstance(per, dict):
            for key, value in per.items():
                if CollectiveType.parse(str(key)) is signature.collective and isinstance(value, dict):
                    config = CommConfig.from_dict(value).merged_over(config)
    except (ValueError, KeyError, TypeError) as exc:
        raise LagomError(f"cluster {cluster.name}: bad 'nccl_defaults': {exc}") from None
    return config


def nccl_default_config(cluster: ClusterSpec, signature: Signature) -> CommConfig:
    """NCCL's own choice for this collective on this cluster, every field filled."""
    return _default_cached(cluster_key(cluster), signature)


def resolve_config(cluster: ClusterSpec, signature: Signature, config: CommConfig) -> CommConfig:
    """``config`` with its None fields filled by NCCL's choice *given* the fields set.

    Setting the algorithm or protocol re-runs NCCL's choice restricted to them (as
    NCCL_ALGO/NCCL_PROTO do), so threads and chunk follow the forced protocol; an explicit
    channel count is used as is (NCCL then sheds no channels). Equals
    ``config.merged_over(nccl_default_config(...))`` when only resources are set.
    """
    if signature.collective in P2P_COLLECTIVES:
        # NCCL's p2p path reads neither NCCL_NTHREADS nor an algorithm or protocol
        config = PATH.set(CommConfig(channels=config.channels, chunk_bytes=config.chunk_bytes), PATH.get(config))
    if config.algorithm is None and config.protocol is None:
        base = nccl_default_config(cluster, signature)
        if config.channels is not None and config.chunk_bytes is None:
            # NCCL's chunk does not depend on channels for rings; for trees recompute it.
            base = _restricted_cached(cluster_key(cluster), signature, base.algorithm, base.protocol, config.channels)
        return config.merged_over(base)
    return config.merged_over(
        _restricted_cached(cluster_key(cluster), signature, config.algorithm, config.protocol, config.channels)
    )


# ---- NCCL's symmetric kernels: which kernel and how many CTAs it picks ----------------------------
# A restatement of NCCL's own model (src/symmetric.cc in 2.27, src/sym_kernels.cc from 2.28; the
# constants are the same through v2.30.7-1) for the kernels that need no NVLS multicast, the only
# ones on the modelled clusters: for every candidate kernel, the time its model gives with the most
# CTAs, then the fewest CTAs whose time is within 2.5% of it; among kernels the least
# time x (1 + 2.5% per CTA) wins. NCCL picks this before it would consult a tuner plugin.
SYM_MAX_CTAS = 64  # ncclSymkMaxBlocks (include/sym_kernels.h; ncclSymMaxBlocks in 2.27)
SYM_THREADS = 512  # *nWarps = 16 (ncclSymkPickKernel)
_GIB_PER_S = (1 << 30) / 1e6  # bytes/us in one GiB/s, as NCCL's model counts ("GBps")
SYM_LL_BUS_FACTOR = 9  # LL_BusFactor: "2X the bytes, plus some processing, plus no unrolling"
SYM_LL_MAX_BUS_BYTES = 2 << 30  # LL kernels count elements in 32 bits: none from 2 GiB of bus bytes
SYM_CTA_PENALTY = 0.025  # smPenalty: 2.5% more time per CTA when comparing kernels
SYM_CTA_TOLERANCE = 1.025  # fewest CTAs within 2.5% of the time with the most


@dataclass(frozen=True)
class SymmetricKernel:
    """The symmetric kernel NCCL runs for a collective on registered buffers, and its own model."""

    name: str  # e.g. AllGather_ST (the kernel is ncclSymkDevKernel_AllGather_ST)
    ctas: int
    time_us: float  # NCCL's estimate
    bus_bytes: float  # NCCL's bus bytes for the kernel (LL kernels: 9x the data, its fudge)
    base_latency_us: float
    cta_bw_bytes_per_us: float  # one CTA's bandwidth in NCCL's model
    peak_bw_bytes_per_us: float


def _sym_model_us(bus_bytes: float, base_us: float, ctas: int, cta_bw: float, peak_bw: float) -> float:
    """NCCL's model: base latency + bus bytes over softmin(CTAs x CTA bandwidth, peak) (softplus'd)."""
    x = ctas * cta_bw
    bw = peak_bw - cta_bw * math.log1p(math.expm1(peak_bw / cta_bw) * math.exp(-x / cta_bw))
    z = bus_bytes / bw - 1.0
    return base_us + (z if z >= 100.0 else math.log1p(math.exp(z)))


def symmetric_kernel(signature: Signature, min_ctas: int = 1, max_ctas: int = SYM_MAX_CTAS,
                     compute_capability: int = 90) -> SymmetricKernel | None:
    """NCCL's symmetric kernel and CTA count for this collective (None: it has none: AllGather,
    AllReduce and ReduceScatter only). NCCL's constants (sym_model ncclSymkLsaBaseModel): below
    compute capability 10.0 (Ampere, Hopper) base latency 4.5 us (LL) / 7.8 us, 44 GiB/s per CTA
    (65 for AllReduce), peak 320 GiB/s; from 10.0 (Blackwell) base latency LL 8.5 (AllGather) /
    10.5 (ReduceScatter) / 11.0 (AllReduce), else 13.0 (19.5 AllReduce), 55 GiB/s per CTA, peak
    600 GiB/s (650 for ReduceScatter). The TMA kernel variants are not modelled."""
    coll = signature.collective
    n = max(1, signature.ranks)
    if coll not in (CollectiveType.ALLGATHER, CollectiveType.ALLREDUCE, CollectiveType.REDUCESCATTER) or n < 2:
        return None
    whole = float(max(1, signature.message_bytes))
    per_rank = whole if coll is CollectiveType.ALLREDUCE else whole / n  # NCCL's count: per rank for AG / RS
    bus_all = per_rank if coll is CollectiveType.ALLREDUCE else n * per_rank
    is_ar = coll is CollectiveType.ALLREDUCE
    blackwell = compute_capability >= 100
    if blackwell:
        cta_bw = 55.0 * _GIB_PER_S
        peak = (650.0 if coll is CollectiveType.REDUCESCATTER else 600.0) * _GIB_PER_S
    else:
        cta_bw = (65.0 if is_ar else 44.0) * _GIB_PER_S
        peak = 320.0 * _GIB_PER_S
    prefix = {CollectiveType.ALLGATHER: "AllGather", CollectiveType.ALLREDUCE: "AllReduce",
              CollectiveType.REDUCESCATTER: "ReduceScatter"}[coll]
    candidates: list[tuple[str, float, bool]] = []  # (name, bus bytes, LL)
    if bus_all < SYM_LL_MAX_BUS_BYTES:
        candidates.append((f"{prefix}_{'AGxLL_R' if is_ar else 'LL'}", n * per_rank * SYM_LL_BUS_FACTOR, True))
    if is_ar:
        candidates.append((f"{prefix}_RSxLD_AGxST", 2.0 * per_rank * (n - 1) / n, False))
    else:
        candidates.append((f"{prefix}_{'ST' if coll is CollectiveType.ALLGATHER else 'LD'}", (n - 1) * per_rank, False))
    top = max(1, min(SYM_MAX_CTAS, max_ctas))
    low = max(1, min(min_ctas, top))
    best: SymmetricKernel | None = None
    for name, bus, ll in candidates:
        if blackwell:
            base = ({CollectiveType.ALLGATHER: 8.5, CollectiveType.REDUCESCATTER: 10.5}.get(coll, 11.0) if ll
                    else 19.5 if is_ar else 13.0)
        else:
            base = 4.5 if ll else 7.8
        ctas, time_us = top, _sym_model_us(bus, base, top, cta_bw, peak)
        for b in range(low, top):
            t = _sym_model_us(bus, base, b, cta_bw, peak)
            if t <= SYM_CTA_TOLERANCE * time_us:
                ctas, time_us = b, t
                break
        kernel = SymmetricKernel(name, ctas, time_us, bus, base, cta_bw, peak)
        if best is None or (time_us * (1 + SYM_CTA_PENALTY * ctas)
                            < best.time_us * (1 + SYM_CTA_PENALTY * best.ctas)):
            best = kernel
    return best


# ---- caching: these are pure functions of (cluster, signature); searches call them a lot ----
_CLUSTERS: dict[str, ClusterSpec] = {}


def cluster_key(cluster: ClusterSpec) -> str:
    """A content key of everything the model reads (so a mutated spec is never served stale)."""
    key = repr((cluster.name, cluster.nccl_version, cluster.gpus_per_node, cluster.intra_node,
                cluster.inter_node, cluster.nccl_graph, cluster.nccl_defaults))
    if key not in _CLUSTERS:
        _CLUSTERS[key] = ClusterSpec(**{**cluster.__dict__})
    return key


@lru_cache(maxsize=65536)
def _default_cached(key: str, signature: Signature) -> CommConfig:
    cluster = _CLUSTERS[key]
    over = _overrides(cluster, signature)
    if over.algorithm is not None or over.protocol is not None or over.channels is not None:
        base = _model_config(cluster, signature, over.algorithm, over.protocol, over.channels)
    else:
        base = _model_config(cluster, signature)
    return over.merged_over(base)


@lru_cache(maxsize=65536)
def _restricted_cached(key: str, signature: Signature, algo: Algorithm | None, proto: Protocol | None,
                       channels: int | None) -> CommConfig:
    cluster = _CLUSTERS[key]
    over = _overrides(cluster, signature)
    base = _model_config(cluster, signature, _first(algo, over.algorithm), _first(proto, over.protocol),
                         _first(channels, over.channels))
    keep = CommConfig(threads=over.threads, chunk_bytes=over.chunk_bytes)
    return keep.merged_over(base)


def protocol_hop_factors(cluster: ClusterSpec, algorithm: Algorithm, protocol: Protocol) -> tuple[float, float]:
    """(intra-node, network) hop latency of ``algorithm`` and ``protocol`` over the ring's LL hop:
    NCCL's own hardware latencies (tuning.cc hwLat, :data:`HW_LAT_US`) relative to Ring/LL's, the
    figure a preset's ``latency_us`` is. An LL128 step waits for whole 128-byte lines and a Simple
    step fences and posts a flag after its data: NVLink ring x3.2 (LL128) and x5.7 (Simple),
    network ring x1.5 and x5.2; a tree's network hop x1.9 / x3.1 / x5.2 (5.0 / 8.5 / 14.0 us)."""
    intra_hw = "nvlink" if nccl_graph(cluster).type_intra == "nvl" else "pci"
    table_algo = algorithm if algorithm in HW_LAT_US[intra_hw] else Algorithm.RING
    intra, net = HW_LAT_US[intra_hw], HW_LAT_US["net"]
    base = Protocol.LL
    return (intra[table_algo][protocol] / intra[Algorithm.RING][base],
            net[table_algo][protocol] / net[Algorithm.RING][base])
