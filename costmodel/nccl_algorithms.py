"""Where NCCL runs NVLS, NVLSTree and PAT, and the resources it gives them (issue 30).

Restated in Lagom's words from NVIDIA/nccl's sources (each figure with its file and tag);
what the evaluators do with them is :mod:`costmodel.sim.collective` and
:mod:`costmodel.analytic.collective_model`. NCCL's *choice* among the algorithms is
:mod:`costmodel.nccl_defaults`'s; this module says only which doors are open and what a
collective on one of these algorithms holds.

* NVLS (NVLink SHARP): AllReduce, AllGather and ReduceScatter on NVLink-SHARP switches
  (``intra_node.nvls``), NCCL >= 2.17 (AllGather / ReduceScatter from 2.19: tuning.cc v2.19.3-1
  l.168-169 admits NVLS for them, v2.18.3-1 only the ring), one node (across nodes NCCL runs NVLS only with
  CollNet, enqueue.cc topoGetAlgoTime v2.30.7-1 l.2008); AllGather / ReduceScatter on at most
  ``NCCL_MAX_NVLS_ARITY`` = 32 local ranks (device.h); Simple protocol only (tuning.cc l.301).
* NVLSTree: AllReduce across nodes (NVLS inside, a tree between nodes), NCCL >= 2.18; NCCL
  disables it on one node (tuning.cc l.502).
* PAT: AllGather and ReduceScatter with one GPU per node (tuning.cc ncclPatEnable l.220:
  ``nNodes != nRanks`` disables it), NCCL >= 2.23, Simple only.
* CollNetDirect: AllReduce across nodes where the network reduces (``inter_node.collnet``), at
  most 8 GPUs per node (enqueue.cc l.2001); CollNetChain and CollNet AllGather / ReduceScatter are
  not modelled, refused.
"""

from __future__ import annotations

import math

from costmodel.cluster import ClusterSpec
from costmodel.nccl_defaults import nccl_graph
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, PROTOCOL, THREADS, config_from
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import ALGORITHM_SINCE, NcclVersion

NVLS_COLLECTIVES = frozenset({CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER})
PAT_COLLECTIVES = frozenset({CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER})
NVLS_FAMILY = (Algorithm.NVLS, Algorithm.NVLS_TREE)
NCCL_MAX_NVLS_ARITY = 32  # device.h (v2.30.7-1): AllGather/ReduceScatter on NVLS up to 32 local ranks
NVLS_CHUNK_BYTES = 128 * 1024  # nvls.cc NCCL_NVLS_CHUNKSIZE default 128 KiB (v2.21.5-1 .. v2.30.7-1)
NVLS_TREE_MAX_CHUNK_4_NODES_BYTES = 64 * 1024  # nvls.cc ncclNvlsTuning (v2.30.7-1): 64 KiB from 4 nodes
NVLS_CHANNELS_SM90 = 16  # nvls.cc NVLS_NCHANNELS default (v2.18.3-1 ..), NVLS_NCHANNELS_SM90 (v2.25.1-1 .. v2.30.7-1)
NVLS_CHANNELS_SM100 = 32  # nvls.cc NVLS_NCHANNELS_SM100 (v2.25.1-1 .. v2.30.7-1): Blackwell across nodes
NVLS_CHANNELS_SM100_NVL = 24  # nvls.cc NVLS_NCHANNELS_SM100_NVL (v2.27.3-1 .. v2.30.7-1): Blackwell, one node
NVLS_GATHER_SINCE = NcclVersion(2, 19, 0)  # tuning.cc v2.19.3-1 l.168: NVLS for AllGather / ReduceScatter
_SM100_CHANNELS_SINCE = NcclVersion(2, 25, 0)  # nvls.cc: per-architecture NVLS channels from v2.25.1-1
_SM100_NVL_SINCE = NcclVersion(2, 27, 0)  # nvls.cc: the single-node Blackwell figure from v2.27.3-1
# tuning.cc nvlsEfficiency (v2.30.7-1 l.139): the share of a channel's copy rate an NVLS channel's
# multimem loads and stores reach, Hopper 0.85, Blackwell 0.74
NVLS_EFFICIENCY_SM90 = 0.85
NVLS_MIN_COMPUTE_CAPABILITY = 90  # nvlsEfficiency is 0.0 for Volta and Ampere: no NVLS before Hopper
NVLS_EFFICIENCY_SM100 = 0.74
# tuning.cc hwLatencies (v2.30.7-1 l.161, l.173), over the Ring/LL figures a preset's latency_us holds
# (NVLink 0.6 us, network 2.7 us): an NVLS operation's path through the switch (reduce, then multicast)
# 25 us on NVLink; an NVLSTree network hop 20.9 us
NVLS_SWITCH_LATENCY_FACTOR = 25.0 / 0.6
NVLS_TREE_NET_LATENCY_FACTOR = 20.9 / 2.7
NCCL_MAX_DIRECT_ARITY = 7  # device.h (v2.30.7-1): CollNetDirect takes at most 8 local ranks (enqueue.cc l.2001)
COLLNET_STEP_BYTES = 512 * 1024  # one Simple step, chunkSteps 1 off the ring (enqueue.cc l.2223)
COLLNET_DEPTH = 2  # connect.cc (v2.30.7-1 l.238): a CollNetDirect channel with local peers has depth 2
# tuning.cc hwLatencies (v2.30.7-1): CollNetDirect/Simple 3.7 us on NVLink, 31 us on the network, plus
# 0.4 us per local peer ("arity serialization"); over the ring's LL figures as above
COLLNET_INTRA_LATENCY_FACTOR = 3.7 / 0.6
COLLNET_NET_LATENCY_FACTOR = 31.0 / 2.7
COLLNET_ARITY_US = 0.4
PAT_CHUNK_BYTES = 512 * 1024  # one Simple step, 4 MiB / NCCL_STEPS: chunkSteps is 1 off the ring (enqueue.cc l.2223)
PAT_MIN_CHUNK_BYTES = 64 * 1024  # enqueue.cc computeColl (v2.30.7-1 l.2295): PAT halves its chunk down to 64 KiB


def nvls_channels(compute_capability: int, nodes: int, version: NcclVersion) -> int:
    """NCCL's default NVLS channel count (``comm->nvlsChannels``, NCCL_NVLS_NCHANNELS unset)."""
    if compute_capability >= 100 and version >= _SM100_CHANNELS_SINCE:
        if nodes <= 1 and version >= _SM100_NVL_SINCE:
            return NVLS_CHANNELS_SM100_NVL
        return NVLS_CHANNELS_SM100
    return NVLS_CHANNELS_SM90


def nvls_efficiency(compute_capability: int) -> float:
    """NCCL's NVLS efficiency factor for the GPU (tuning.cc nvlsEfficiency)."""
    return NVLS_EFFICIENCY_SM100 if compute_capability >= 100 else NVLS_EFFICIENCY_SM90


def nvls_chunk_bytes(algo: Algorithm, message_bytes: int, nc: int, local_ranks: int, nodes: int) -> int:
    """NCCL's NVLS / NVLSTree chunk for a message (enqueue.cc computeColl, v2.30.7-1 l.2258-2285):
    at most NCCL_NVLS_CHUNKSIZE, halved for small messages by the concurrent operations (``nc`` channels x
    heads, one head per local rank on one node)."""
    concurrent = max(1, nc) * max(1, local_ranks)
    steps: tuple[tuple[int, int], ...]
    if algo is Algorithm.NVLS:
        chunk, steps = NVLS_CHUNK_BYTES, ((64, 65536), (8, 32768), (2, 16384))
    else:
        chunk = NVLS_CHUNK_BYTES if nodes < 4 else NVLS_TREE_MAX_CHUNK_4_NODES_BYTES
        steps = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
    for factor, floor in steps:
        if message_bytes < factor * concurrent * chunk and chunk > floor:
            chunk = floor
    return chunk


def pat_chunk_bytes(collective: CollectiveType, message_bytes: int, nc: int) -> int:
    """PAT's chunk: one Simple step, halved while channels x chunk x 32 (AllGather; 16 for
    ReduceScatter) exceeds the message, down to 64 KiB (enqueue.cc computeColl v2.30.7-1)."""
    factor = 32 if collective is CollectiveType.ALLGATHER else 16
    chunk = PAT_CHUNK_BYTES
    while chunk * max(1, nc) * factor > message_bytes and chunk > PAT_MIN_CHUNK_BYTES:
        chunk //= 2
    return chunk


def collnet_chunk_bytes(message_bytes: int, nc: int, heads: int) -> int:
    """CollNetDirect's chunk: one Simple step, halved while a channel's share per head is below 64,
    then 8 chunks of the tree's depth, down to 128 / 32 KiB (enqueue.cc computeColl v2.30.7-1 l.2231)."""
    chunk = COLLNET_STEP_BYTES
    per = max(1, nc) * max(1, heads)
    for steps, floor in ((64, 131072), (8, 65536), (8, 32768)):
        while message_bytes / (per * chunk) < COLLNET_DEPTH * steps and chunk > floor:
            chunk //= 2
    return chunk


def log2_steps(count: int) -> int:
    """ceil(log2(count)): the rounds of a recursive-doubling / tree schedule over ``count`` peers."""
    return max(0, math.ceil(math.log2(max(1, count))))


def offered_algorithms(cluster: ClusterSpec) -> tuple[Algorithm, ...]:
    """The algorithms the evaluators model on this cluster and its NCCL, in NCCL's order."""
    version = cluster.nccl_version
    out = [Algorithm.TREE, Algorithm.RING]
    if cluster.intra_node.nvls:
        out += [a for a in NVLS_FAMILY if version >= ALGORITHM_SINCE[a]]
    if cluster.inter_node.collnet and version >= ALGORITHM_SINCE[Algorithm.COLLNET_DIRECT]:
        out.append(Algorithm.COLLNET_DIRECT)
    if version >= ALGORITHM_SINCE[Algorithm.PAT]:
        out.append(Algorithm.PAT)
    return tuple(out)


def algorithm_refusal(cluster: ClusterSpec | None, algo: Algorithm, collective: CollectiveType | None = None,
                      ranks: int | None = None, nodes: int | None = None) -> str | None:
    """Why the evaluators cannot run ``algo`` here (None: they can): on this cluster (None:
    a cluster with neither NVLS nor PAT) and, when given, for this collective on ``ranks`` ranks
    over ``nodes`` nodes. The reason is NCCL's own rule (module docstring)."""
    if algo in (Algorithm.RING, Algorithm.TREE):
        return None
    if algo is Algorithm.COLLNET_CHAIN:
        return "CollNetChain is not modelled (collnet_direct is, where inter_node.collnet is declared)"
    if cluster is None:
        return "no cluster says whether its switches reduce (NVLS) or its NCCL has PAT"
    version = cluster.nccl_version
    if version < ALGORITHM_SINCE[algo]:
        return f"NCCL {version} has no {algo.nccl_name} (from {ALGORITHM_SINCE[algo]})"
    if algo is Algorithm.COLLNET_DIRECT and not cluster.inter_node.collnet:
        return f"cluster {cluster.name} has no in-network reduction (CollNet: inter_node.collnet is false)"
    if algo in NVLS_FAMILY and not cluster.intra_node.nvls:
        return f"cluster {cluster.name} has no NVLink SHARP (intra_node.nvls is false)"
    if algo in NVLS_FAMILY and nccl_graph(cluster).compute_capability < NVLS_MIN_COMPUTE_CAPABILITY:
        return "NCCL runs NVLS from compute capability 9.0 (tuning.cc nvlsEfficiency is 0 before Hopper)"
    if collective is None:
        return None
    n, nodes = max(1, ranks or 1), max(1, nodes or 1)
    if algo is Algorithm.NVLS:
        if collective not in NVLS_COLLECTIVES:
            return f"NCCL runs NVLS only for allreduce, allgather and reducescatter, not {collective.value}"
        if collective is not CollectiveType.ALLREDUCE and version < NVLS_GATHER_SINCE:
            return f"NCCL {version} runs NVLS only for allreduce ({collective.value} from {NVLS_GATHER_SINCE})"
        if nodes > 1:
            return "NCCL runs NVLS across nodes only with CollNet (not modelled); nvls_tree is the multi-node form"
        if collective is not CollectiveType.ALLREDUCE and n > NCCL_MAX_NVLS_ARITY:
            return f"NCCL's NVLS {collective.value} takes at most {NCCL_MAX_NVLS_ARITY} ranks of a node"
    elif algo is Algorithm.NVLS_TREE:
        if collective is not CollectiveType.ALLREDUCE:
            return f"NCCL runs NVLSTree only for allreduce, not {collective.value}"
        if nodes <= 1:
            return "NCCL disables NVLSTree on one node (nvls is the one-node form)"
    elif algo is Algorithm.COLLNET_DIRECT:
        if collective is not CollectiveType.ALLREDUCE:
            return f"only CollNetDirect allreduce is modelled, not {collective.value}"
        if nodes <= 1:
            return "NCCL runs CollNet across nodes only"
        if n // nodes > NCCL_MAX_DIRECT_ARITY + 1:
            return f"NCCL's CollNetDirect takes at most {NCCL_MAX_DIRECT_ARITY + 1} GPUs per node"
    elif algo is Algorithm.PAT:
        if collective not in PAT_COLLECTIVES:
            return f"NCCL runs PAT only for allgather and reducescatter, not {collective.value}"
        if n != nodes:
            return f"NCCL runs PAT only with one GPU per node ({n} ranks on {nodes} nodes)"
    return None


def admitted(cluster: ClusterSpec, signature: Signature, config: CommConfig) -> CommConfig:
    """``config`` as NCCL runs it for ``signature``: an NVLS, NVLSTree or PAT it would not run there
    (a plan's default reaches every collective; ``algorithm_refusal``) is dropped with its protocol,
    NCCL's own choice standing, as the plugin's cost table leaves an unsupported algorithm out."""
    algo = ALGORITHM.get(config)
    if algo is None or algo in (Algorithm.RING, Algorithm.TREE):
        return config
    if algorithm_refusal(cluster, algo, signature.collective, signature.ranks, signature.nodes) is None:
        return config
    return PROTOCOL.set(ALGORITHM.set(config, None), None)


def algorithm_settings(cluster: ClusterSpec, signature: Signature, requested: CommConfig,
                       resolved: CommConfig) -> CommConfig:
    """``resolved`` (``costmodel.nccl_defaults.resolve_config``'s answer to ``requested``) with what
    NCCL itself gives an NVLS, NVLSTree or PAT collective where ``requested`` leaves it open: NVLS
    channels (``comm->nvlsChannels``: a plan's channels through the plugin, at most that many: the
    scheduler clamps an NVLS task to them, enqueue.cc v2.30.7-1 l.583-599, and the NVLS buffers are
    allocated for them, nvls.cc ncclNvlsBufferSetup), the algorithm's own chunk,
    Simple (the only protocol NCCL has for them, tuning.cc l.301-303); threads stay as resolved
    (NCCL runs them with NCCL_MAX_NTHREADS, enqueue.cc l.2113: the copy rate is saturated)."""
    algo = ALGORITHM.get(resolved)
    nc_asked, chunk_asked = CHANNELS.get(requested), CHUNK.get(requested)
    if algo in NVLS_FAMILY:
        assert algo is not None
        nodes = max(1, signature.nodes)
        top = nvls_channels(nccl_graph(cluster).compute_capability, nodes, cluster.nccl_version)
        nc = min(nc_asked, top) if nc_asked else top
        chunk = chunk_asked or nvls_chunk_bytes(algo, signature.message_bytes, nc, max(1, signature.ranks // nodes),
                                                nodes)
        return config_from([(ALGORITHM, algo), (PROTOCOL, Protocol.SIMPLE), (CHANNELS, nc),
                            (THREADS, THREADS.get(resolved)), (CHUNK, chunk)])
    if algo is Algorithm.COLLNET_DIRECT:
        nc = int(CHANNELS.get(resolved) or 1)
        heads = max(1, signature.ranks // max(1, signature.nodes))
        chunk = chunk_asked or collnet_chunk_bytes(signature.message_bytes, nc, heads)
        return CHUNK.set(PROTOCOL.set(resolved, Protocol.SIMPLE), chunk)
    if algo is Algorithm.PAT:
        nc = int(CHANNELS.get(resolved) or 1)
        chunk = chunk_asked or pat_chunk_bytes(signature.collective, signature.message_bytes, nc)
        return CHUNK.set(PROTOCOL.set(resolved, Protocol.SIMPLE), chunk)
    return resolved
