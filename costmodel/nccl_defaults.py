"""NCCL's default choices for a collective on a cluster: algorithm, protocol, channels, threads, chunk.

A re-statement in Python of NCCL's own tuning model **of the cluster's release** (not a copy of
its code); the figures and rules per release family are data in :mod:`costmodel.nccl_tuning_tables`
(2.18 to 2.30; a newer release reads the newest):

* ``src/graph/tuning.cc`` (``ncclTopoTuneModel``): for every (collective, algorithm, protocol) a
  latency ``baseLat + steps x hwLat`` and a bandwidth ``nChannels x bw x refinements`` (Ring/LL's
  share of the bus, LL128 0.92 capped per channel, Tree 0.92 capped, NVLS's efficiency, PAT's
  share, ...), turned into algorithm bandwidth: :func:`tuning_cells`, NCCL's printed
  Latency/AlgBw table;
* ``ncclTopoGetAlgoTime``: ``time = latency + nBytes / (1000 x bw)`` with the tree correction
  factors and the multi-node ring "plateau" latency factor; the fastest enabled pair wins
  (``src/enqueue.cc`` ``topoGetAlgoInfo``);
* channel/thread tuning (``topoGetAlgoInfo``): start from the communicator's channels and the
  protocol's maximum threads and shed channels, then threads, while ``nBytes < nChannels x
  nThreads x threadThreshold``; NVLS runs ``nvlsChannels`` (:func:`nvls_channels`);
* chunk (``calcCollChunking``): ``BUFFSIZE / NCCL_STEPS x chunkSteps`` (Simple ring: 4 MiB / 8 x 4
  = 2 MiB), with the tree's depth-driven halving, NVLS's and PAT's own rules.

Simplifications (said out loud): the topology search is not re-run; its result is the
cluster's ``nccl_graph`` section (or derived from the link kind), replaced where the release's
table knows an NVSwitch node's search (:func:`algo_graphs`); NVLS needs ``intra_node.nvls``;
CollNet cells carry their latency and stay disabled; the CPU is taken as Intel (net overhead
1 us); AllToAll/SendRecv use NCCL's p2p path (Simple, ``p2pnChannelsPerPeer`` = 2 channels
per peer, NCCL_MAX_NTHREADS threads whatever NCCL_NTHREADS says, a 128 KiB step across
nodes or over PCIe and 512 KiB inside an NVSwitch node: init.cc computeBuffSizes; an
``nvlink`` preset, such as A40 bridges between pairs, is not all-NVLink for NCCL).
:func:`nccl_own_path` is the path (SM kernels, symmetric kernels, copy engines) NCCL takes by
itself; :func:`recorded_pick_disagreements` compares the model's pick with what a trace's
kernels say NCCL ran.

``nccl_default_config`` fills EVERY field of a CommConfig. ``cluster.nccl_defaults``
(keys ``algorithm``, ``protocol``, ``channels``, ``threads``, ``chunk_bytes``, plus
optional per-collective mappings under ``by_collective: {allgather: {...}}``) win
over the model. ``threads`` is the NCCL_NTHREADS-style knob value (the extra sync
warp NCCL adds to Simple rings is not counted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from costmodel.cluster import ClusterSpec
from costmodel.nccl_tuning_tables import (
    FAMILIES,
    NVLS_GRAPH_BW_GB_PER_S,
    NVLS_MAX_ARITY,
    NVLS_MIN_CHANNELS,
    TREE_CORRECTION,
    TuningTable,
    tuning_table,
)
from nccl_env.errors import LagomError
from nccl_env.knob_table import PATH
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import (
    DEFAULT_BUFFSIZE_BYTES,
    NCCL_STEPS,
    P2P_COLLECTIVES,
    Mechanism,
    NcclVersion,
    collective_mechanism,
    max_channels,
)
from traces.reader import algorithm_protocol_from_kernel_name
from traces.workload import Workload

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
NVLS_CHUNK_BYTES = 128 << 10  # NCCL_NVLS_CHUNKSIZE default 128 KiB (init.cc)
# p2p kernels run NCCL_MAX_NTHREADS = 640 (enqueue.cc); kept at the knob's 64-512 range, saturated either way
P2P_THREADS = 512

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
    Hopper multi-node communicators with fast NVLink double once more. The rings are the release's
    search result on one NVSwitch node (:func:`algo_graphs`: 24 channels on H100 from 2.19)."""
    graph = nccl_graph(cluster)
    limit = cluster_max_channels(cluster)
    rings = algo_graphs(cluster, 2, 1)[Algorithm.RING].channels if nodes == 1 else graph.ring_channels
    nc = min(limit, rings * 2)
    if graph.compute_capability >= 90 and nodes > 1 and graph.bw_intra_gb_per_s > 45.0 and 2 * nc <= limit:
        nc *= 2
    return nc


def nccl_nbytes(signature: Signature) -> int:
    """NCCL's ``info->nBytes``: the whole buffer. For AllGather/ReduceScatter
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
    """NCCL's time estimate for every enabled (algorithm, protocol) of this collective, by the
    tuning model of the cluster's NCCL release (:mod:`costmodel.nccl_tuning_tables`)."""
    if signature.collective not in _FUNC_NSTEPS_KIND:
        return []
    n_ranks = max(1, signature.ranks)
    n_nodes = max(1, signature.nodes)
    if n_ranks <= 1:
        return [AlgoEstimate(Algorithm.RING, Protocol.SIMPLE, 0.0, float("inf"), 0.0)]
    nbytes = nccl_nbytes(signature)
    table = release_table(cluster)
    graph = nccl_graph(cluster)
    channels_total = comm_channels(cluster, n_nodes)
    log_size = int(math.log2(max(1, nbytes >> 6))) if nbytes >= 64 else -1
    out: list[AlgoEstimate] = []
    for cell in tuning_cells(cluster, n_ranks, n_nodes, (signature.collective,)):
        if cell.bw_gb_per_s <= 0:
            continue
        algo, proto = cell.algorithm, cell.protocol
        lat, alg_bw = cell.latency_us, cell.bw_gb_per_s
        # ncclTopoGetAlgoTime
        if 0 <= log_size < 23 and algo is Algorithm.TREE:
            alg_bw *= TREE_CORRECTION[proto][log_size]
        if (algo is Algorithm.NVLS_TREE and table.nvls_tree_correction_blackwell and 0 <= log_size < 24
                and graph.compute_capability >= 100 and signature.collective is CollectiveType.ALLREDUCE):
            alg_bw *= TREE_CORRECTION[proto][log_size]
        if (algo is Algorithm.RING and proto is Protocol.SIMPLE and n_nodes > 1
                and signature.collective is CollectiveType.ALLREDUCE and nbytes / (channels_total * n_ranks) >= 64):
            lat *= 1.9 if graph.compute_capability < 80 else 1.4
        time_us = lat + nbytes / (1000.0 * alg_bw)
        out.append(AlgoEstimate(algo, proto, lat, alg_bw, time_us))
    return out


# ---- NCCL's Latency/AlgBw table, release by release --------------------------------------------------------


def release_table(cluster: ClusterSpec) -> TuningTable:
    """The tuning model of the cluster's NCCL release (a newer release than the newest known: the newest)."""
    return tuning_table(cluster.nccl_version)


@dataclass(frozen=True)
class AlgoGraph:
    """One algorithm's graph as ncclTopoTuneModel reads it: channels and per-channel speeds."""

    channels: int
    bw_intra_gb_per_s: float
    bw_inter_gb_per_s: float
    tree_pattern: bool = False  # NCCL_TOPO_PATTERN_TREE: the tree's bandwidth x 0.85


def algo_graphs(cluster: ClusterSpec, n_ranks: int, n_nodes: int) -> dict[Algorithm, AlgoGraph]:
    """The search's result per algorithm for a communicator of ``n_ranks`` on ``n_nodes``.

    Ring and tree: the cluster's ``nccl_graph`` (2.18: the tree equal to the ring). From 2.19 an
    NVSwitch node of an architecture the release's table knows gets that release's search result
    (:class:`~costmodel.nccl_tuning_tables.NvswitchSearch`: H100 12 rings at 30 GB/s, "24 coll
    channels"); a 2-GPU tree there runs at the chain's speed; a multi-node tree is one per NIC
    with NCCL's tree-pattern discount (NCCL 2.22.3's printed times on 3 x 8 H100, NVIDIA/nccl
    #1453). NVLS: one channel per GPU of the node at the architecture's NVLS speed. PAT reads
    the tree's graph (init.cc graphs[NCCL_ALGO_PAT] = treeGraph)."""
    table = release_table(cluster)
    graph = nccl_graph(cluster)
    ppn = max(1, n_ranks // max(1, n_nodes))
    # A group with one rank per node has no intra-node hop: its "intra" bandwidth is the NIC's (Lagom's reading).
    bw_intra = graph.bw_intra_gb_per_s if ppn > 1 else graph.bw_inter_gb_per_s
    ring = AlgoGraph(graph.ring_channels, bw_intra, graph.bw_inter_gb_per_s)
    tree = ring
    cc_major = graph.compute_capability // 10 * 10
    search = table.nvswitch_search.get(cc_major) if cluster.intra_node.kind == "nvswitch" else None
    if search is not None:
        if n_nodes == 1:
            ring = AlgoGraph(search.ring_channels, search.ring_bw_gb_per_s, search.ring_bw_gb_per_s)
            tree = replace(ring, bw_intra_gb_per_s=search.two_gpu_tree_bw_gb_per_s) if n_ranks == 2 else ring
        else:
            tree = AlgoGraph(max(1, min(graph.ring_channels, cluster.inter_node.nics_per_node)), bw_intra,
                             graph.bw_inter_gb_per_s, tree_pattern=True)
    elif table is not FAMILIES[0] and n_nodes > 1:
        tree = replace(ring, tree_pattern=True)
    graphs = {Algorithm.RING: ring, Algorithm.TREE: tree, Algorithm.PAT: tree,
              Algorithm.COLLNET_DIRECT: ring, Algorithm.COLLNET_CHAIN: ring}
    nvls_bw = NVLS_GRAPH_BW_GB_PER_S.get(min(cc_major, 100))
    if cluster.intra_node.nvls and nvls_bw is not None and graph.compute_capability >= 90:
        inter = nvls_bw if n_nodes == 1 else graph.bw_inter_gb_per_s
        nvls = AlgoGraph(min(ppn, NVLS_MAX_ARITY), nvls_bw, inter)
        graphs[Algorithm.NVLS] = graphs[Algorithm.NVLS_TREE] = nvls
    return graphs


@dataclass(frozen=True)
class TableCell:
    """One cell of NCCL's printed Latency/AlgBw table (``NCCL_DEBUG_SUBSYS=TUNING``)."""

    collective: CollectiveType
    algorithm: Algorithm
    protocol: Protocol
    latency_us: float
    bw_gb_per_s: float  # algorithm bandwidth; 0: disabled there

    @property
    def key(self) -> tuple[CollectiveType, Algorithm, Protocol]:
        return self.collective, self.algorithm, self.protocol


TABLE_COLLECTIVES = (CollectiveType.BROADCAST, CollectiveType.REDUCE, CollectiveType.ALLGATHER,
                     CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE)  # NCCL's function order


def _cell_algorithms(table: TuningTable, collective: CollectiveType) -> tuple[Algorithm, ...]:
    """The algorithms NCCL's table fills for a collective in this release (tuning.cc's skips)."""
    if collective in (CollectiveType.BROADCAST, CollectiveType.REDUCE):
        return (Algorithm.RING,)
    if collective is CollectiveType.ALLREDUCE:
        return tuple(a for a in Algorithm if a is not Algorithm.PAT)
    gather = [Algorithm.RING]
    if table.nvls_bw_rule != "2.18":
        gather += [Algorithm.COLLNET_DIRECT, Algorithm.NVLS]
    if table.has_pat:
        gather.append(Algorithm.PAT)
    return tuple(sorted(gather))


def _nvls_bus_bw_per_channel(table: TuningTable, g: AlgoGraph, algo: Algorithm, collective: CollectiveType,
                             n_nodes: int, ppn: int, arch: int) -> float | None:
    """NVLS / NVLSTree per-channel bus bandwidth by the release's rule; None: not computed (< 2 channels)."""
    gather = collective is not CollectiveType.ALLREDUCE
    if table.nvls_bw_rule == "2.18":
        return g.bw_intra_gb_per_s if n_nodes <= 2 else g.bw_inter_gb_per_s
    if table.nvls_bw_rule in ("2.19", "2.27"):
        if algo is Algorithm.NVLS_TREE:
            return min(g.bw_intra_gb_per_s, g.bw_inter_gb_per_s if n_nodes <= 2 else g.bw_inter_gb_per_s / 2)
        if gather and table.nvls_bw_rule == "2.27":
            return min(g.bw_intra_gb_per_s * (ppn - 1) / ppn, g.bw_inter_gb_per_s * 0.9)
        return min(g.bw_intra_gb_per_s, g.bw_inter_gb_per_s)
    if g.channels < NVLS_MIN_CHANNELS:
        return None
    efficiency = table.nvls_efficiency[arch] if table.nvls_efficiency else 1.0
    intra = g.bw_intra_gb_per_s * efficiency * (g.channels - 1) / g.channels
    intra *= (ppn - 1) / ppn if gather else 2.0
    inter = g.bw_inter_gb_per_s * (2 if n_nodes <= 2 and algo is Algorithm.NVLS_TREE else 1)
    cap = float("inf")
    if algo is Algorithm.NVLS_TREE and table.per_ch_max_nvls_tree_bws is not None:
        cap = _arch_row(table.per_ch_max_nvls_tree_bws, arch)[min(n_nodes, 3) - 1]
    return min(intra, inter, cap)


def _arch_row(rows: tuple, arch: int) -> tuple[float, float, float]:
    row = rows[arch]
    return row if row is not None else rows[2]


def tuning_cells(cluster: ClusterSpec, n_ranks: int, n_nodes: int,
                 collectives: tuple[CollectiveType, ...] = TABLE_COLLECTIVES) -> list[TableCell]:
    """NCCL's Latency/AlgBw table for a communicator of ``n_ranks`` GPUs on ``n_nodes`` nodes of
    the cluster, at the cluster's release: every cell NCCL fills (a disabled one with bandwidth 0).

    A restatement of ncclTopoTuneModel (src/graph/tuning.cc) over the family's figures; the
    CPU is taken as Intel x86 (network overhead 1 us, llMaxBws' Intel rows across nodes), the
    graphs as :func:`algo_graphs` gives them, ``latencyInter`` 0. CollNet is printed for its
    latency and left disabled (no cluster models in-network reduction's bandwidth)."""
    table = release_table(cluster)
    graph = nccl_graph(cluster)
    cc = graph.compute_capability
    arch = table.arch_index(cc)
    index2 = min(n_nodes, 3) - 1
    ll_max_bw = _arch_row(table.ll_max_bws, arch if n_nodes == 1 else 0)[index2]
    ppn = max(1, n_ranks // n_nodes)
    intra_hw = "nvlink" if graph.type_intra == "nvl" else "pci"
    graphs = algo_graphs(cluster, n_ranks, n_nodes)
    base, hw = table.base_latency_us, table.hw_latency_us
    ll128_ok = graph.type_intra == "nvl" and (cc >= 70 if table.ll128_compute_caps is None
                                                else cc in table.ll128_compute_caps)
    pat_ok = table.has_pat and ppn == 1 and cc >= 60
    cells: list[TableCell] = []
    for coll in collectives:
        kind = _FUNC_NSTEPS_KIND.get(coll)
        if kind is None:
            continue
        nsteps = 2 * (n_ranks - 1) if kind == "allreduce" else n_ranks - 1 if kind == "gather" else n_ranks
        for algo in _cell_algorithms(table, coll):
            g = graphs.get(algo)
            for proto in _PROTOS:
                if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE, Algorithm.PAT) and proto is not Protocol.SIMPLE:
                    continue
                if algo is Algorithm.PAT and not pat_ok:
                    continue
                cell = _cell(table, cluster, coll, kind, algo, proto, g, n_ranks, n_nodes, ppn, nsteps, arch,
                             index2, ll_max_bw, intra_hw, base, hw)
                if cell is None:
                    continue
                lat, bw = cell
                enabled = (not (proto is Protocol.LL128 and not ll128_ok)
                           and not (algo is Algorithm.NVLS_TREE and n_nodes == 1)
                           and not (algo is Algorithm.NVLS and n_nodes > 1 and not cluster.inter_node.collnet)
                           and algo not in (Algorithm.COLLNET_DIRECT, Algorithm.COLLNET_CHAIN)
                           and g is not None)
                cells.append(TableCell(coll, algo, proto, lat, bw if enabled else 0.0))
    return cells


def _cell(table: TuningTable, cluster: ClusterSpec, coll: CollectiveType, kind: str, algo: Algorithm,
          proto: Protocol, g: AlgoGraph | None, n_ranks: int, n_nodes: int, ppn: int, nsteps: int, arch: int,
          index2: int, ll_max_bw: float, intra_hw: str, base: dict, hw: dict) -> tuple[float, float] | None:
    """(latency, algorithm bandwidth) of one cell, or None where NCCL computes none."""
    p = int(proto)
    gather = kind == "gather"
    bw = 0.0
    if g is not None:
        per_channel = g.bw_intra_gb_per_s if n_nodes <= 2 or algo in (Algorithm.COLLNET_DIRECT,
                                                                      Algorithm.COLLNET_CHAIN) else g.bw_inter_gb_per_s
        if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
            nvls = _nvls_bus_bw_per_channel(table, g, algo, coll, n_nodes, ppn, arch)
            if nvls is None:
                return None
            per_channel = nvls
        bus = g.channels * per_channel
        if algo is Algorithm.RING and proto is Protocol.LL:
            if table.ring_ll_bus_factor is None:
                factor = 0.25 if (n_nodes > 1 or kind == "allreduce" or coll is CollectiveType.REDUCE) else 1.0 / 3.0
            else:
                factor = table.ring_ll_bus_factor
            bus = min(ll_max_bw, bus * factor)
        if algo is Algorithm.RING and proto is Protocol.LL128:
            bus = min(bus * (table.ring_ll128_one_ppn_factor if ppn < 2 else 0.92),
                      g.channels * _arch_row(table.per_ch_max_ring_ll128_bws, arch)[index2])
        if algo is Algorithm.TREE and (kind == "allreduce" or not table.tree_simple_only_allreduce):
            bus = min(bus * 0.92, g.channels * _arch_row(table.per_ch_max_tree_bws, arch)[index2])
        if algo is Algorithm.TREE and proto is Protocol.LL:
            bus = min(bus / 3.8, ll_max_bw)
        if algo is Algorithm.TREE and proto is Protocol.LL128:
            bus = min(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0),
                      g.channels * _arch_row(table.per_ch_max_tree_ll128_bws, arch)[index2])
        if algo is Algorithm.TREE and g.tree_pattern:
            bus *= 0.85
        if algo is Algorithm.PAT:
            bus *= table.pat_bus_factor or 0.0
        if algo in (Algorithm.COLLNET_DIRECT, Algorithm.COLLNET_CHAIN):
            bus = 0.0  # CollNet: not modelled (disabled below anyway)
        # bus to algorithm bandwidth
        if algo is Algorithm.RING:
            bus *= n_ranks / nsteps
        elif gather and table.tree_simple_only_allreduce:
            pass  # 2.23+: only rings convert for AllGather/ReduceScatter
        elif algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
            if table.nvls_bw_rule == "2.28":
                bus *= n_ranks / nsteps
            elif table.nvls_bw_rule == "2.18" and algo is Algorithm.NVLS_TREE:
                bus *= 0.70 * n_nodes / (2 * (n_nodes - 1)) if n_nodes > 1 else 0.0
            else:
                bus *= 5.0 / 6.0
        else:
            bus *= 0.5
        bw = bus
    # latency
    lat = base[algo][p]
    intra_lat = hw[intra_hw][algo][p]
    net_algo = Algorithm.TREE if (table.ppn1_net_latency_from_tree and ppn == 1) else algo
    inter_lat = hw["net"][net_algo][p]
    if algo is Algorithm.RING:
        if kind == "rooted":
            lat += hw["net" if n_nodes > 1 else intra_hw][algo][p]
        else:
            overhead = NET_OVERHEAD_US * (3 if proto is Protocol.SIMPLE else 1) if n_nodes > 1 else 0.0
            intra_lat = max(intra_lat, overhead)
            if table is FAMILIES[0]:
                n_inter = (2 * n_nodes if n_nodes > 1 else 0) if kind == "allreduce" else n_nodes - 1
            else:
                n_inter = 0 if n_nodes == 1 else 2 * (n_nodes - 1) if kind == "allreduce" else n_nodes - 1
            lat += (nsteps - n_inter) * intra_lat + n_inter * inter_lat
    elif algo is Algorithm.TREE:
        if kind == "allreduce" or not table.tree_simple_only_allreduce:
            lat += 2 * ((n_ranks // n_nodes - 1) * intra_lat + int(math.log2(n_nodes)) * inter_lat)
    elif algo is Algorithm.COLLNET_DIRECT:
        arity = 0.5 if table is FAMILIES[0] else 0.4
        lat += 2 * (min(1, ppn - 1) * intra_lat + (ppn - 1) * arity) + inter_lat
    elif algo is Algorithm.COLLNET_CHAIN:
        lat += 2 * (ppn - 1) * intra_lat + inter_lat
    elif algo is Algorithm.NVLS:
        if table is FAMILIES[0]:
            lat += hw["net"][algo][p] if n_nodes > 1 else 0.0
        else:
            lat = intra_lat + (inter_lat if n_nodes > 1 else 0.0)
    elif algo is Algorithm.NVLS_TREE:
        if table is FAMILIES[0]:
            lat += 2 * (n_nodes - 1) * hw["net"][algo][p]
        else:
            lat += intra_lat + 2 * int(math.log2(n_nodes)) * inter_lat
    elif algo is Algorithm.PAT:
        lat += table.pat_base_latency_us + int(math.log2(n_nodes)) * inter_lat / 3.5 \
            + n_ranks * table.pat_per_rank_latency_us
    return lat, bw


def _chunk_bytes(algo: Algorithm, proto: Protocol, signature: Signature, channels: int) -> int:
    if algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
        # enqueue.cc calcCollChunking: NCCL_NVLS_CHUNKSIZE (128 KiB), halved while the buffer is short
        # of a few rounds over channels x heads (NVLS: 64x/8x/2x down to 64/32/16 KiB)
        nbytes = nccl_nbytes(signature)
        heads = max(1, signature.ranks // max(1, signature.nodes))
        concurrent = channels * heads
        chunk = NVLS_CHUNK_BYTES
        for rounds, floor in ((64, 65536), (8, 32768), (2, 16384)):
            if nbytes < rounds * concurrent * chunk and chunk > floor:
                chunk = floor
        return chunk
    if algo is Algorithm.PAT:  # enqueue.cc: PAT halves its Simple step while the buffer is short of 32 (AG) / 16 rounds
        nbytes = nccl_nbytes(signature)
        chunk = DEFAULT_BUFFSIZE_BYTES // NCCL_STEPS
        rounds = 32 if signature.collective is CollectiveType.ALLGATHER else 16
        while chunk * channels * rounds > nbytes and chunk > 65536:
            chunk //= 2
        return chunk
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


def nvls_channels(cluster: ClusterSpec, nodes: int = 1, algorithm: Algorithm = Algorithm.NVLS) -> int:
    """NCCL's nvlsChannels (the NVLS kernels' CTAs, ``nvlsCTAs``) at the cluster's release:
    NVLS_NCHANNELS 16 on Hopper; on Blackwell 16 before 2.25, 32 in 2.25-2.26, from 2.27 24 on
    one node and 32 across nodes (src/transport/nvls.cc); NVLS across nodes is capped by the
    communicator's channels (enqueue.cc topoGetAlgoInfo)."""
    table = release_table(cluster)
    if nccl_graph(cluster).compute_capability >= 100:
        nc = table.nvls_channels_sm100[1 if nodes > 1 else 0]
    else:
        nc = table.nvls_channels_sm90
    if nodes > 1 and algorithm is Algorithm.NVLS:
        nc = min(nc, comm_channels(cluster, nodes))
    return min(nc, cluster_max_channels(cluster))


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
    if best_algo in (Algorithm.NVLS, Algorithm.NVLS_TREE):
        # topoGetAlgoInfo: NVLS runs nvlsChannels CTAs (capped by the communicator's channels across
        # nodes), NCCL_MAX_NTHREADS threads (the knob's 512 here), no shedding
        nc = channels or nvls_channels(cluster, max(1, signature.nodes), best_algo)
        return CommConfig(best_algo, best_proto, nc, SIMPLE_MAX_NTHREADS,
                          _chunk_bytes(best_algo, best_proto, signature, nc))
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


def protocol_base_excess_us(protocol: Protocol) -> float:
    """The fixed cost a protocol's kernels add per call beyond the simulator's launch figure, which
    stands for NCCL's base latencies of LL and Simple (tuning.cc baseLat, the Ring row, the same from
    v2.18.3-1 to the 2.31 development branch's src/tuning/cost_model.cc: LL 6.6, Simple 8.4 us): LL128's
    14.0 us lies 5.6 us above the larger; LL and Simple add nothing. Ring, tree and PAT kernels pay it."""
    ring = BASE_LAT_US[Algorithm.RING]
    return max(0.0, ring[protocol] - max(ring[Protocol.LL], ring[Protocol.SIMPLE]))


# ---- NCCL's pick against what a trace says NCCL ran ------------------------------------------------------


@dataclass(frozen=True)
class PickDisagreement:
    """A collective whose recorded algorithm/protocol (its kernel's name) is not the model's pick."""

    signature: Signature
    recorded: tuple[Algorithm, Protocol]
    model: tuple[Algorithm, Protocol]
    instances: int

    def describe(self) -> str:
        def name(pair: tuple[Algorithm, Protocol]) -> str:
            return f"{pair[0].nccl_name}/{pair[1].name.lower()}"

        return (f"{self.signature.label()}: the trace ran {name(self.recorded)} ({self.instances}x), "
                f"NCCL's model picks {name(self.model)}")


def pick_disagreement(cluster: ClusterSpec, signature: Signature, algorithm: Algorithm,
                      protocol: Protocol) -> tuple[Algorithm, Protocol] | None:
    """The model's (algorithm, protocol) for the collective where it is not what NCCL ran, else None
    (p2p and unmodelled collectives: None; the model has no pick to compare)."""
    if signature.collective not in _FUNC_NSTEPS_KIND or signature.ranks <= 1:
        return None
    config = nccl_default_config(cluster, signature)
    model = (_first(config.algorithm, Algorithm.RING), _first(config.protocol, Protocol.SIMPLE))
    return None if model == (algorithm, protocol) else model


def recorded_pick_disagreements(cluster: ClusterSpec, workload: Workload) -> list[PickDisagreement]:
    """Every collective signature of a trace whose kernels say NCCL ran another algorithm or protocol
    than the model of the cluster's release picks (kernel names ``..._RING_LL128``, ``_NVLS_``,
    ``_PAT_``, or the op's ``recorded_*`` fields), one entry per (signature, what ran)."""
    seen: dict[tuple[Signature, tuple[Algorithm, Protocol]], int] = {}
    for op in workload.collectives:
        if not op.on_gpu or not op.nccl_tunable or op.message_bytes is None:
            continue
        if op.recorded_algorithm is not None and op.recorded_protocol is not None:
            ran: tuple[Algorithm, Protocol] | None = (op.recorded_algorithm, op.recorded_protocol)
        else:
            ran = algorithm_protocol_from_kernel_name(op.name)
        if ran is None:
            continue
        key = (workload.signature(op, cluster.gpus_per_node), ran)
        seen[key] = seen.get(key, 0) + 1
    out = []
    for (signature, ran), count in sorted(seen.items(), key=lambda kv: kv[0][0]):
        model = pick_disagreement(cluster, signature, *ran)
        if model is not None:
            out.append(PickDisagreement(signature, ran, model, count))
    return out


def disagreement_line(cluster: ClusterSpec, found: list[PickDisagreement]) -> str | None:
    """One line for ``tune``/``simulate``: where the trace's kernels say NCCL ran another pick than the
    model of the cluster's release (None: none, or the trace names none)."""
    if not found:
        return None
    first = found[0]
    more = f" (and {len(found) - 1} more signature{'s' if len(found) > 2 else ''})" if len(found) > 1 else ""
    return (f"NCCL {cluster.nccl_version}'s tuning model disagrees with the trace's kernels: "
            f"{first.describe()}{more}; the baseline is the model's pick")


# ---- the path NCCL takes by itself (no CTA policy, no tuner plugin) --------------------------------------

SYM_CE_THRESHOLD_ELEMENTS = 8 * 1024 * 1024  # NCCL_SYM_CE_THRESHOLD default (v2.29.2-1 enqueue.cc), compared
# with the per-rank element count (info->count), not bytes
SYM_CE_SINCE = NcclVersion(2, 29, 0)  # v2.29.2-1 enqueue.cc: AllGather on symmetric windows, Blackwell, all-NVLink


def nccl_own_path(cluster: ClusterSpec, signature: Signature, symmetric_windows: bool = False,
                  element_bytes: int = 2) -> CommPath:
    """The path NCCL takes for a collective by itself at the cluster's release, CTA policy DEFAULT:

    * buffers outside NCCL's symmetric windows: its SM kernels (ring/tree/NVLS/PAT, :func:`nccl_default_config`);
    * in symmetric windows (NCCL >= 2.27, every rank on NVLink): from 2.29 on Blackwell an AllGather of more
      than NCCL_SYM_CE_THRESHOLD elements per rank (8 Mi; ``element_bytes`` turns the signature's bytes into
      elements, bf16 by default) runs on the copy engines, no SM at all; else AllGather, AllReduce and
      ReduceScatter run NCCL's symmetric kernels (``symmetric_kernel`` gives which and its CTAs), the rest
      its SM kernels (rules.collective_mechanism)."""
    if not symmetric_windows:
        return CommPath.SM
    version = cluster.nccl_version
    topology = cluster.path_topology()
    per_rank_elements = signature.message_bytes // max(1, signature.ranks) // max(1, element_bytes)
    if (version >= SYM_CE_SINCE and signature.collective is CollectiveType.ALLGATHER and topology.all_nvlink
            and nccl_graph(cluster).compute_capability >= 100 and per_rank_elements > SYM_CE_THRESHOLD_ELEMENTS
            and collective_mechanism(CommPath.COPY_ENGINE, signature.collective, signature.nodes, version,
                                     topology) is Mechanism.COPY_ENGINE):
        return CommPath.COPY_ENGINE
    mechanism = collective_mechanism(CommPath.SYMMETRIC, signature.collective, signature.nodes, version, topology)
    return CommPath.SYMMETRIC if mechanism is Mechanism.SYMMETRIC_KERNEL else CommPath.SM
