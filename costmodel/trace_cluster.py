"""The cluster a trace's own numbers give, where no preset models its GPU.

Three sources, each said in the note :func:`derive_cluster` returns:

- the GPU: the row of :mod:`costmodel.gpu_specs` that the trace's ``deviceProperties``
  match, with the trace's SM count over the table's;
- nodes: the job's world size over GPUs per node, which is the number of devices the
  trace lists when it lists more than one (a process that saw one device says nothing
  of its node: 8 per node is assumed, and said);
- links: inside a node, the GPU's NVLink (or Infinity Fabric) where it reaches every GPU
  of the node, else PCIe of the GPU's generation, at the achievable share below; between
  nodes, the bus bandwidth of the trace's own fastest collectives (:func:`bus_bandwidths`).

Bus bandwidth follows nccl-tests: ``algbw = bytes / time``, ``busbw = algbw x 2(n-1)/n``
for AllReduce, ``x (n-1)/n`` for AllGather, ReduceScatter and AllToAll, ``x 1`` for
Broadcast and Reduce (bytes: the larger of a rank's buffers, as nccl-tests counts
them). An instance's time holds its wait for the slowest peer, so each collective
(signature) is read at a fast instance, the 10th percentile of its durations (the
fastest when it ran fewer than 11 times). SendRecv is left out (the trace does not say
whether its peer is on the same node). A trace's busbw is a lower bound of what its
links can carry (small messages do not fill them): inside a node it only raises the
table's figure; between nodes it is the figure, as the largest over the trace's
collectives that cross nodes, read as the node's network bandwidth the simulator and
the cost model share (their per-rank link: ``min(intra, node network x min(1, ranks
per node / GPUs per node))``, AllToAll's remote share over the network).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from costmodel.cluster import ClusterSpec, InterNodeSpec, IntraNodeSpec
from costmodel.gpu_specs import AMD, NVIDIA, REACH_NODE, REACH_PAIRS, DeviceFacts, GpuMatch, GpuRow, gpu_spec
from nccl_env.knobs import CollectiveType
from nccl_env.rules import NcclVersion
from traces.workload import Workload

FAST_PERCENTILE = 0.10  # a collective's fast instance: waits for peers do not count
NVLINK_ACHIEVED = 0.8  # nccl-tests ring busbw reaches ~77-85% of NVLink's peak (docs/reference.md §2: 230 of 300)
# PCIe x16 per direction, achieved, by generation
PCIE_ACHIEVED_GB_PER_S = {
    3: 12.0,  # NCCL topo.h PCI_BW 12.0 (Gen3 x16)
    4: 25.0,  # docs/reference.md §2: PCIe 4.0 x16 ~25 GB/s per direction achieved
    5: 50.0,  # approx: twice Gen4's signalling rate, same efficiency
    6: 100.0,  # approx: twice Gen5's
}
NVLINK_LATENCY_US = 0.6  # NCCL 2.18 tuning.cc hwLat[NVLINK][Ring][LL]
PCIE_LATENCY_US = 1.0  # NCCL 2.18 tuning.cc hwLat[PCI][Ring][LL]
NET_LATENCY_US = 2.7  # NCCL 2.18 tuning.cc hwLat[NET][Ring][LL]
ASSUMED_NET_GB_PER_S = 48.0  # one 400 Gb/s NIC per node: NCCL search.cc top inter speed 48.0
ASSUMED_GPUS_PER_NODE = 8  # HGX / DGX / OAM baseboards carry 8
# NCCL's per-channel figures (costmodel.sim params) by compute capability: Simple, LL128, LL, GB/s
_CHANNEL_GB_PER_S: dict[tuple[int, int], tuple[float, float, float]] = {
    (7, 0): (20.0, 20.0, 2.4),  # topo.h SM70_NVLINK_BW 20.0; tuning.cc perChMaxRingLL128Bws and llMaxBws Volta / 16
    (8, 0): (20.0, 20.0, 5.5),  # as the a100-nvswitch preset (SM80_NVLINK_BW 20.0, Ampere tables)
    (8, 6): (12.0, 10.0, 4.0),  # as the A40 presets (SM86_NVLINK_BW 12.0, halved Ampere tables)
    (9, 0): (24.0, 36.7, 5.5),  # as the h100-nvswitch preset (sm90SpeedArrayIntra 24.0, Hopper tables)
    (10, 0): (40.0, 36.7, 5.5),  # approx: NCCL 2.25 topo.h SM100_NVLINK_BW 40.1, Hopper's LL128 / LL tables
}
_NAMES = {CollectiveType.ALLREDUCE: "AllReduce", CollectiveType.ALLGATHER: "AllGather",
          CollectiveType.REDUCESCATTER: "ReduceScatter", CollectiveType.ALLTOALL: "AllToAll",
          CollectiveType.BROADCAST: "Broadcast", CollectiveType.REDUCE: "Reduce", CollectiveType.SENDRECV: "SendRecv"}


@dataclass(frozen=True)
class BusBandwidth:
    """One collective of the trace (its signature) read at its fast instance."""

    collective: CollectiveType
    message_bytes: int
    ranks: int
    nodes: int
    instances: int
    time_us: float  # the fast instance's duration (FAST_PERCENTILE)
    busbw_gb_per_s: float

    @property
    def label(self) -> str:
        return (f"{_NAMES[self.collective]} of {_size(self.message_bytes)} over "
                f"{self.ranks} ranks{f' on {self.nodes} nodes' if self.nodes > 1 else ''}, "
                f"{FAST_PERCENTILE * 100:.0f}th-percentile time {self.time_us:,.0f} us over {self.instances} "
                f"instance{'s' * (self.instances != 1)}")


def busbw_factor(collective: CollectiveType, ranks: int) -> float | None:
    """nccl-tests' busbw / algbw for a collective over ``ranks``; None where it has none (SendRecv)."""
    n = ranks
    if collective is CollectiveType.ALLREDUCE:
        return 2.0 * (n - 1) / n
    if collective in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLTOALL):
        return (n - 1) / n
    if collective in (CollectiveType.BROADCAST, CollectiveType.REDUCE):
        return 1.0
    return None


def fast_time_us(durations_us: list[float]) -> float:
    """The FAST_PERCENTILE duration (nearest rank below)."""
    ordered = sorted(durations_us)
    return ordered[int(FAST_PERCENTILE * (len(ordered) - 1))]


def bus_bandwidths(workload: Workload, gpus_per_node: int) -> list[BusBandwidth]:
    """Every NCCL collective of known size between ranks, at its fast instance, fastest busbw first."""
    times: dict[tuple[CollectiveType, int, int, int, float], list[float]] = {}
    for op in workload.collectives:
        if not (op.on_gpu and op.nccl_tunable and op.message_bytes and op.duration_us > 0):
            continue
        sig = workload.signature(op, gpus_per_node)
        factor = busbw_factor(sig.collective, sig.ranks) if sig.ranks > 1 else None
        if factor is not None:
            key = (sig.collective, sig.message_bytes, sig.ranks, sig.nodes, factor)
            times.setdefault(key, []).append(op.duration_us)
    out = []
    for (collective, nbytes, ranks, nodes, factor), durations in times.items():
        time_us = fast_time_us(durations)
        out.append(BusBandwidth(collective, nbytes, ranks, nodes, len(durations), time_us,
                                nbytes / time_us / 1e3 * factor))
    return sorted(out, key=lambda b: (-b.busbw_gb_per_s, b.collective.name, b.message_bytes))


def network_gb_per_s(b: BusBandwidth, gpus_per_node: int) -> float:
    """The node network bandwidth a cross-node collective's busbw shows (the module doc's link, inverted)."""
    per_node = max(1, b.ranks // b.nodes)
    remote = (b.ranks - per_node) / (b.ranks - 1) if b.collective is CollectiveType.ALLTOALL else 1.0
    return b.busbw_gb_per_s * remote / min(1.0, per_node / gpus_per_node)


def launch_sm_count(workload: Workload) -> int | None:
    """The SM count the trace's kernels were launched against: Kineto's ``blocks per SM`` is
    blocks / SMs. The most common answer when most kernels agree, else None."""
    counts = Counter(round(o.thread_blocks / o.blocks_per_sm) for o in workload.compute_ops
                     if o.thread_blocks and o.blocks_per_sm and o.blocks_per_sm > 0)
    if not counts:
        return None
    value, seen = counts.most_common(1)[0]
    return value if value > 0 and seen * 2 > sum(counts.values()) else None


def device_facts(workload: Workload) -> DeviceFacts:
    """What the trace records of its GPU; the SM count from launch shapes where deviceProperties is missing."""
    return DeviceFacts(workload.device_name, workload.sm_count or launch_sm_count(workload),
                       workload.device_mem_bytes, workload.compute_capability)


@dataclass(frozen=True)
class DerivedCluster:
    cluster: ClusterSpec
    note: str  # what was derived, and from what (one line)


DERIVED_NCCL = NcclVersion(2, 18, 3)  # the presets' NCCL (costmodel/presets): a trace without one is modelled on it


def derive_cluster(workload: Workload, match: GpuMatch, nccl_version: NcclVersion = DERIVED_NCCL) -> DerivedCluster:
    """A ClusterSpec for ``workload`` from the table row ``match`` and the trace (module doc)."""
    row = match.row
    facts = device_facts(workload)
    listed = workload.device_count or 0
    gpus_per_node = listed if listed > 1 else ASSUMED_GPUS_PER_NODE
    world = max(1, workload.world_size)
    nodes = max(1, -(-world // gpus_per_node))
    bandwidths = bus_bandwidths(workload, gpus_per_node)
    intra, intra_text = _intra_node(row, [b for b in bandwidths if b.nodes == 1])
    inter, inter_text = _inter_node([b for b in bandwidths if b.nodes > 1], gpus_per_node, nodes)
    cc = row.compute_capability
    simple, ll128, ll = _CHANNEL_GB_PER_S[_channel_class(row)]
    cluster = ClusterSpec(
        name=f"derived-{row.key}",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nccl_version=nccl_version,
        gpu=gpu_spec(row, facts.sm_count),
        intra_node=intra,
        inter_node=inter,
        nccl_graph={"type_intra": "pci" if intra.kind == "pcie" else "nvl", "compute_capability": cc[0] * 10 + cc[1]},
        sim={"simple_bw_per_channel_gb_per_s": simple, "ll128_bw_per_channel_gb_per_s": ll128,
             "ll_bw_per_channel_gb_per_s": ll},
    )
    unit = "CUs" if row.vendor == AMD else "SMs"
    sms = f"{row.sm_count} {unit}"
    if facts.sm_count is not None and facts.sm_count != row.sm_count:
        sms = f"{facts.sm_count} {unit} (the trace's; the table says {row.sm_count})"
    elif workload.sm_count is None and facts.sm_count is not None:
        sms = f"{facts.sm_count} {unit} (from its kernels' launch shapes)"
    gpu_text = (f"GPU {row.key} from Lagom's GPU table (matched by {match.basis}): {sms}, "
                f"{row.mem_bw_gb_per_s:g} GB/s, {row.l2_mib:g} MiB L2, {row.bf16_dense_tflops:g} TFLOP/s BF16"
                + (f" (approx.: {row.approx})" if row.approx else ""))
    if listed > 1:
        per_node = f"{gpus_per_node} per node: the devices the trace lists"
    else:
        per_node = f"{gpus_per_node} per node assumed (the trace lists {listed or 'no'} device{'s' * (listed != 1)})"
    node_text = (f"{nodes} node{'s' * (nodes != 1)} x {gpus_per_node} GPUs for the job's {world} "
                 f"rank{'s' * (world != 1)} ({per_node})")
    return DerivedCluster(cluster, f"{gpu_text}; {node_text}; {intra_text}; {inter_text}")


def stated_cluster(row: GpuRow, nodes: int, gpus_per_node: int, nccl_version: NcclVersion, nvls: bool = False,
                   network: InterNodeSpec | None = None) -> ClusterSpec:
    """A ClusterSpec from what a published case states: the GPU's table row, its nodes and GPUs per node,
    NVLink SHARP where stated (an NVSwitch node only), and its network where stated (one node needs
    none: the module's assumed NIC stands in, unused). Links inside a node as :func:`derive_cluster`'s."""
    intra, _ = _intra_node(row, [])
    if nvls and intra.kind == "nvswitch":
        intra = IntraNodeSpec(intra.kind, intra.bw_gb_per_s, intra.latency_us, nvls=True)
    cc = row.compute_capability
    simple, ll128, ll = _CHANNEL_GB_PER_S[_channel_class(row)]
    return ClusterSpec(
        name=f"stated-{row.key}",
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nccl_version=nccl_version,
        gpu=gpu_spec(row),
        intra_node=intra,
        inter_node=network or InterNodeSpec(1, ASSUMED_NET_GB_PER_S, NET_LATENCY_US),
        nccl_graph={"type_intra": "pci" if intra.kind == "pcie" else "nvl", "compute_capability": cc[0] * 10 + cc[1]},
        sim={"simple_bw_per_channel_gb_per_s": simple, "ll128_bw_per_channel_gb_per_s": ll128,
             "ll_bw_per_channel_gb_per_s": ll},
    )


def _intra_node(row: GpuRow, inside: list[BusBandwidth]) -> tuple[IntraNodeSpec, str]:
    if row.link_reach == REACH_NODE and row.link_gb_per_s > 0:
        switch = row.vendor == NVIDIA and row.form == "sxm" and (row.nvlink_gen or 0) >= 3
        kind = "nvswitch" if switch else "nvlink"
        bw = row.link_gb_per_s * NVLINK_ACHIEVED
        text = (f"inside a node {row.link_name}{' over NVSwitch' if switch else ''}, {bw:g} GB/s per GPU and "
                f"direction (the table's {row.link_gb_per_s:g} x {NVLINK_ACHIEVED:g})")
        latency = NVLINK_LATENCY_US
    else:
        kind, bw, latency = "pcie", PCIE_ACHIEVED_GB_PER_S[row.pcie_gen], PCIE_LATENCY_US
        bridges = " (NVLink bridges join pairs only: a ring crosses PCIe)" if row.link_reach == REACH_PAIRS else ""
        text = f"inside a node PCIe {row.pcie_gen}.0 x16, {bw:g} GB/s per GPU and direction achieved{bridges}"
    if inside and inside[0].busbw_gb_per_s > bw:
        best = inside[0]
        bw = round(best.busbw_gb_per_s, 1)
        text += f", raised to {bw:g} GB/s: the bus bandwidth of the trace's {best.label}"
    return IntraNodeSpec(kind, bw, latency), text


def _inter_node(across: list[BusBandwidth], gpus_per_node: int, nodes: int) -> tuple[InterNodeSpec, str]:
    if not across:
        why = "one node" if nodes == 1 else "no collective of known size crosses nodes"
        return (InterNodeSpec(1, ASSUMED_NET_GB_PER_S, NET_LATENCY_US),
                f"between nodes {ASSUMED_NET_GB_PER_S:g} GB/s per node assumed (not measured: {why})")
    best = max(across, key=lambda b: network_gb_per_s(b, gpus_per_node))
    bw = round(network_gb_per_s(best, gpus_per_node), 2)
    return (InterNodeSpec(1, bw, NET_LATENCY_US),
            f"between nodes {bw:g} GB/s per node: the bus bandwidth of the trace's {best.label} "
            f"({'the only collective' if len(across) == 1 else f'the fastest of {len(across)} collectives'} "
            f"crossing nodes)")


def _channel_class(row: GpuRow) -> tuple[int, int]:
    """The compute capability whose NCCL per-channel figures a row takes (AMD: Hopper's, approx.)."""
    major, minor = row.compute_capability
    if row.vendor == AMD or major == 9:
        return 9, 0
    if major >= 10:
        return 10, 0
    if major == 8:
        return (8, 0) if minor == 0 else (8, 6)  # sm_89 taken as sm_86: approx
    return 7, 0


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if math.isclose(value, round(value)) else f"{value:.1f} {unit}"
    return f"{nbytes} B"
