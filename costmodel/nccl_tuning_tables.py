"""NCCL's tuning model per release family, as data: one table per family, 2.18 to 2.30+.

Each :class:`TuningTable` restates (in Lagom's own words and layout, never NCCL's code)
the figures and rules that NCCL's ``ncclTopoTuneModel`` (``src/graph/tuning.cc``) and
``topoGetAlgoInfo`` (``src/enqueue.cc``) use to fill the Latency/AlgBw table and pick an
algorithm and protocol. A family is a run of releases whose tuning.cc figures and rules
are the same; the borders below were found by diffing ``src/graph/tuning.cc`` between
every tag from v2.18.3-1 to v2.30.7-1 (NVIDIA/nccl). :func:`tuning_table` gives the
family in force for a release; a release newer than the newest family uses the newest.
NCCL 2.31's development branch (``dev``, 2.31.0) moves the model to ``src/tuning/``
(ring.cc, tree.cc, nvls.cc, pat.cc) with the same ring figures; 2.31 and 2.32 are read
with the 2.30 table until their tags are published.

Rows of the per-architecture tables are (Volta, Ampere, Hopper, Blackwell) and columns
(1 node, 2 nodes, more), as NCCL indexes them (compCapIndex, nNodes index). Protocol
triples are (LL, LL128, Simple). ``None`` for a Blackwell row: that release has none
(NCCL before 2.25 reads Hopper's row for sm_100, being older than the architecture).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from nccl_env.knobs import Algorithm
from nccl_env.rules import NcclVersion

Triple = tuple[float, float, float]  # (LL, LL128, Simple)
ArchTable = tuple[Triple, Triple, Triple, Triple | None]  # Volta, Ampere, Hopper, Blackwell; columns N1/N2/N>2

T, R = Algorithm.TREE, Algorithm.RING
CD, CC = Algorithm.COLLNET_DIRECT, Algorithm.COLLNET_CHAIN
NV, NT, PAT = Algorithm.NVLS, Algorithm.NVLS_TREE, Algorithm.PAT

# How NVLS / NVLSTree turn the NVLS graph into bus bandwidth (tuning.cc, the NVLS branch of ncclTopoTuneModel)
NVLS_BW_2_18 = "2.18"  # bw = the graph's, busBw ratio 5/6 (NVLS) and 0.70 x nNodes / 2(nNodes-1) (NVLSTree)
NVLS_BW_2_19 = "2.19"  # NVLS: min(bwIntra, bwInter); NVLSTree: min(bwIntra, bwInter or bwInter/2 on > 2 nodes); 5/6
NVLS_BW_2_27 = "2.27"  # as 2.19, AllGather/ReduceScatter on NVLS min(bwIntra (ppn-1)/ppn, 0.9 bwInter)
NVLS_BW_2_28 = "2.28"  # nvlsEfficiency x (nCh-1)/nCh per channel, x2 AllReduce, x(ppn-1)/ppn AG/RS; ratio nRanks/nsteps


@dataclass(frozen=True)
class NvswitchSearch:
    """What NCCL's topology search (src/graph/search.cc) finds on one NVSwitch node of an
    architecture: the ring graph after ncclTopoDupChannels, and the NVLS graph's speed."""

    ring_channels: int
    ring_bw_gb_per_s: float
    two_gpu_tree_bw_gb_per_s: float  # the tree graph of a 2-GPU communicator (a chain: one direction per channel)


@dataclass(frozen=True)
class TuningTable:
    """NCCL's tuning model for one release family (module docstring)."""

    first: NcclVersion  # the family's first release
    source: str  # the tag whose src/graph/tuning.cc the figures were read from
    base_latency_us: dict[Algorithm, Triple]
    hw_latency_us: dict[str, dict[Algorithm, Triple]]  # "nvlink", "pci", "net"
    ll_max_bws: ArchTable
    per_ch_max_ring_ll128_bws: ArchTable
    per_ch_max_tree_ll128_bws: ArchTable
    per_ch_max_tree_bws: ArchTable
    per_ch_max_nvls_tree_bws: ArchTable | None  # None: NVLSTree uncapped (before 2.28)
    nvls_efficiency: tuple[float, float, float, float] | None  # per architecture; None before 2.28
    nvls_bw_rule: str  # NVLS_BW_*
    ring_ll_bus_factor: float | None  # Ring/LL's share of the bus; None: 1/4 (AllReduce, Reduce, > 1 node) else 1/3
    ring_ll128_one_ppn_factor: float  # Ring/LL128 with < 2 GPUs per node (0.92 with more)
    tree_simple_only_allreduce: bool  # Tree's bandwidth cap applies to AllReduce only (2.23+)
    ppn1_net_latency_from_tree: bool  # one GPU per node: every algorithm's network hop costs Tree's (2.23+)
    pat_bus_factor: float | None  # PAT's bus bandwidth share; None: no PAT (before 2.23)
    ll128_compute_caps: frozenset[int] | None  # LL128 on by default on these sm versions; None: any from 7.0
    nvls_tree_correction_blackwell: bool  # NVLSTree takes the tree correction factors on sm_100 x86 (2.29+)
    nvls_channels_sm90: int  # NVLS_NCHANNELS default on Hopper (src/transport/nvls.cc)
    nvls_channels_sm100: tuple[int, int]  # on Blackwell: (one node, several nodes)
    nvswitch_search: dict[int, NvswitchSearch] = field(default_factory=dict)  # by compute-capability major x 10
    pat_base_latency_us: float = 8.0  # PAT latency: base + log2(nNodes) x netLat / 3.5 + nRanks x per-rank
    pat_per_rank_latency_us: float = 2.8

    def arch_index(self, compute_capability: int) -> int:
        """NCCL's compCapIndex; a release without a Blackwell row reads Hopper's for sm_100."""
        if compute_capability >= 100 and self.ll_max_bws[3] is not None:
            return 3
        return 2 if compute_capability >= 90 else 1 if compute_capability >= 80 else 0

    @property
    def has_pat(self) -> bool:
        return self.pat_bus_factor is not None


def _arch(volta: Triple, ampere: Triple, hopper: Triple, blackwell: Triple | None = None) -> ArchTable:
    return (volta, ampere, hopper, blackwell)


def _algos(tree: Triple, ring: Triple, cdirect: Triple, cchain: Triple, nvls: Triple, nvls_tree: Triple,
           pat: Triple = (0.0, 0.0, 0.0)) -> dict[Algorithm, Triple]:
    return {T: tree, R: ring, CD: cdirect, CC: cchain, NV: nvls, NT: nvls_tree, PAT: pat}


# ---- 2.18 (2.18.1-2.18.6): v2.18.3-1 src/graph/tuning.cc ------------------------------------------------
TABLE_2_18 = TuningTable(
    first=NcclVersion(2, 18, 1), source="v2.18.3-1",
    # baseLat: NVLS/NVLSTree 23 us Simple; CollNet 6.8/14.0 LL/LL128
    base_latency_us=_algos((6.8, 14.0, 0.0), (6.6, 14.0, 8.4), (6.8, 14.0, 0.0), (6.8, 14.0, 0.0),
                           (0.0, 0.0, 23.0), (0.0, 0.0, 23.0)),
    hw_latency_us={  # hwLat[NVLINK|PCI|NET]
        "nvlink": _algos((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0.0, 0.0, 8.0), (0.0, 0.0, 4.75), (0, 0, 0), (0, 0, 0)),
        "pci": _algos((1.0, 1.9, 6.0), (1.0, 2.5, 5.7), (0.0, 0.0, 8.0), (0.0, 0.0, 8.0), (0, 0, 0), (0, 0, 0)),
        "net": _algos((5.0, 8.5, 14.0), (2.7, 4.0, 14.0), (0.0, 0.0, 10.7), (0.0, 0.0, 14.0), (0.0, 0.0, 18.0),
                      (0.0, 0.0, 19.0)),
    },
    # llMaxBws (rows Volta/Ampere/Hopper; multi-node rows read by CPU vendor: Intel = row 0)
    ll_max_bws=_arch((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (87.7, 22.5, 19.0)),
    per_ch_max_ring_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7)),
    per_ch_max_tree_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0)),
    per_ch_max_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0)),
    per_ch_max_nvls_tree_bws=None,
    nvls_efficiency=None,
    nvls_bw_rule=NVLS_BW_2_18,
    ring_ll_bus_factor=None,  # busBw x 1/4 (nNodes > 1, AllReduce, Reduce) else 1/3
    ring_ll128_one_ppn_factor=0.7,  # busBw x (ppn < 2 ? 0.7 : 0.92)
    tree_simple_only_allreduce=False,
    ppn1_net_latency_from_tree=False,
    pat_bus_factor=None,
    ll128_compute_caps=frozenset({70, 80, 90}),  # switch(minCompCap) case 70/80/90
    nvls_tree_correction_blackwell=False,
    nvls_channels_sm90=16,  # v2.18.3-1 src/transport/nvls.cc NCCL_PARAM(NvlsChannels, ..., 16)
    nvls_channels_sm100=(16, 16),
)

# ---- 2.19-2.20: v2.19.3-1 (same in v2.20.3-1 but for MNNVL) ------------------------------------------------
TABLE_2_19 = replace(
    TABLE_2_18, first=NcclVersion(2, 19, 1), source="v2.19.3-1",
    base_latency_us=_algos((6.8, 14.0, 0.0), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
    hw_latency_us={  # Tree/Simple 28 us on every fabric; NVLS 23 us on NVLink; CollNet 3.7/2.8 and 31/30 on the net
        "nvlink": _algos((0.6, 1.25, 28.0), (0.6, 1.9, 3.4), (0.0, 0.0, 3.7), (0.0, 0.0, 2.8), (0.0, 0.0, 23.0),
                         (0.0, 0.0, 23.0)),
        "pci": _algos((1.0, 1.9, 28.0), (1.0, 2.5, 5.7), (0.0, 0.0, 3.7), (0.0, 0.0, 2.8), (0, 0, 0), (0, 0, 0)),
        "net": _algos((5.0, 8.5, 28.0), (2.7, 4.0, 14.0), (0.0, 0.0, 31.0), (0.0, 0.0, 30.0), (0.0, 0.0, 18.0),
                      (0.0, 0.0, 14.0)),
    },
    nvls_bw_rule=NVLS_BW_2_19,
    # search.cc v2.19.3-1: sm90SpeedArrayIntra gains 50.0; 18 NVLink4 links (SM90_NVLINK_BW 20.6 each) carry 6 rings
    # at the top speed 60, which ncclTopoDupChannels turns into 12 at 30: "24 coll channels" after init doubles them
    # (NVIDIA/nccl #1259, NCCL 2.20.5 on 8 x H100). A 2-GPU tree at 60: NCCL 2.29.2's printed 2-H100 Tree cells are
    # capped by perChMaxTreeBws (12 x 38.7), which needs more than 42.1 GB/s per channel.
    nvswitch_search={90: NvswitchSearch(12, 30.0, 60.0)},
)

# ---- 2.21-2.22: v2.21.5-1 (v2.22.3-1 changes no figure) ------------------------------------------------------
TABLE_2_21 = replace(
    TABLE_2_19, first=NcclVersion(2, 21, 1), source="v2.21.5-1",
    hw_latency_us={**TABLE_2_19.hw_latency_us,
                   "nvlink": {**TABLE_2_19.hw_latency_us["nvlink"], NV: (0.0, 0.0, 25.0), NT: (0.0, 0.0, 25.0)}},
    ll_max_bws=_arch((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0)),  # Hopper 141/45/35
    ring_ll_bus_factor=0.5,  # Ring/LL: min(llMaxBw, busBw x .5)
)

# ---- 2.23: v2.23.4-1 (PAT) ------------------------------------------------------------------------------------
_HW_2_23 = {  # Tree/Simple back to 4.0 (NVLink, PCI) and 14 (net); base 8.4
    "nvlink": {**TABLE_2_21.hw_latency_us["nvlink"], T: (0.6, 1.25, 4.0)},
    "pci": {**TABLE_2_21.hw_latency_us["pci"], T: (1.0, 1.9, 4.0)},
    "net": {**TABLE_2_21.hw_latency_us["net"], T: (5.0, 8.5, 14.0)},
}
TABLE_2_23 = replace(
    TABLE_2_21, first=NcclVersion(2, 23, 1), source="v2.23.4-1",
    base_latency_us={**TABLE_2_21.base_latency_us, T: (6.8, 14.0, 8.4)},
    hw_latency_us=_HW_2_23,
    ring_ll128_one_ppn_factor=0.92,  # the ppn < 2 discount (0.7) is gone
    tree_simple_only_allreduce=True,
    ppn1_net_latency_from_tree=True,  # "With ppn=1 latencies are fully exposed, use the Tree network latency"
    pat_bus_factor=0.85,  # ncclPatEnable: 1 GPU per node, host network; busBw x .85
)

# ---- 2.24: v2.24.3-1 -------------------------------------------------------------------------------------------
TABLE_2_24 = replace(TABLE_2_23, first=NcclVersion(2, 24, 1), source="v2.24.3-1", pat_bus_factor=0.75)

# ---- 2.25-2.26: v2.25.1-1 (v2.26.2-1 .. v2.26.6-1 identical): Blackwell rows, twice Hopper's -------------------
TABLE_2_25 = replace(
    TABLE_2_24, first=NcclVersion(2, 25, 1), source="v2.25.1-1",
    ll_max_bws=_arch((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0)),
    per_ch_max_ring_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (73.4, 73.4, 73.4)),
    per_ch_max_tree_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (73.4, 73.4, 58.0)),
    per_ch_max_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (77.4, 82.8, 72.0)),
    ll128_compute_caps=frozenset({70, 80, 90, 100, 120}),  # case 100 / case 120 added
    nvls_channels_sm100=(32, 32),  # v2.25.1-1 nvls.cc NVLS_NCHANNELS_SM100 32
    # search.cc v2.25.1-1 sm100SpeedArrayIntra tops at 90: 18 NVLink5 links carry 8 rings at 90, duplicated to 16 at
    # 45 (the 2-rank Ring/LL128 cap 16 x 40.0 = 640 GB/s of NVIDIA/nccl PR #2343 at 2.31.2 agrees)
    nvswitch_search={**TABLE_2_24.nvswitch_search, 100: NvswitchSearch(16, 45.0, 90.0)},
)

# ---- 2.27: v2.27.3-1 (v2.27.7-1: LL128 over C2C rule only) -----------------------------------------------------
TABLE_2_27 = replace(
    TABLE_2_25, first=NcclVersion(2, 27, 1), source="v2.27.3-1",
    nvls_bw_rule=NVLS_BW_2_27,
    ll128_compute_caps=None,  # every sm >= 7.0 (minCompCap < 70 disables)
    nvls_channels_sm100=(24, 32),  # NVLS_NCHANNELS_SM100_NVL 24 on one node, SM100 32 across nodes
)

# ---- 2.28.3: v2.28.3-1 (ncclTunerConstants_t, nvlsEfficiency, perChMaxNVLSTreeBws) -----------------------------
TABLE_2_28 = replace(
    TABLE_2_27, first=NcclVersion(2, 28, 1), source="v2.28.3-1",
    base_latency_us={**TABLE_2_27.base_latency_us, PAT: (8.0, 8.0, 8.0)},
    hw_latency_us={
        "nvlink": {**_HW_2_23["nvlink"], PAT: (0.0, 0.0, 4.0)},
        "pci": {**_HW_2_23["pci"], PAT: (0.0, 0.0, 4.0)},
        "net": {**_HW_2_23["net"], PAT: (0.0, 0.0, 14.0)},
    },
    per_ch_max_tree_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0)),
    per_ch_max_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0)),
    per_ch_max_nvls_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 43.1)),
    nvls_efficiency=(0.0, 0.0, 0.85, 0.74),
    nvls_bw_rule=NVLS_BW_2_28,
    pat_base_latency_us=0.0,  # PAT's 8 us moved into baseLatencies
)

# ---- 2.28.7: v2.28.7-1 ------------------------------------------------------------------------------------------
TABLE_2_28_7 = replace(
    TABLE_2_28, first=NcclVersion(2, 28, 7), source="v2.28.7-1",
    per_ch_max_ring_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (73.4, 34.6, 73.4)),
)

# ---- 2.28.9: v2.28.9-1 ------------------------------------------------------------------------------------------
TABLE_2_28_9 = replace(
    TABLE_2_28_7, first=NcclVersion(2, 28, 9), source="v2.28.9-1",
    hw_latency_us={**TABLE_2_28.hw_latency_us,
                   "net": {**TABLE_2_28.hw_latency_us["net"], NT: (0.0, 0.0, 20.9)}},  # NVLSTree net 14 -> 20.9
    per_ch_max_nvls_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 43.8)),
)

# ---- 2.29.2-2.29.3: v2.29.2-1 -----------------------------------------------------------------------------------
TABLE_2_29 = replace(
    TABLE_2_28_9, first=NcclVersion(2, 29, 1), source="v2.29.2-1",
    per_ch_max_ring_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (34.5, 34.6, 34.5)),
    nvls_tree_correction_blackwell=True,  # ncclTopoGetAlgoTime: NVLSTree AllReduce on sm_100 x86
)

# ---- 2.29.7: v2.29.7-1 ------------------------------------------------------------------------------------------
TABLE_2_29_7 = replace(
    TABLE_2_29, first=NcclVersion(2, 29, 7), source="v2.29.7-1",
    per_ch_max_ring_ll128_bws=_arch((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0)),
)

# ---- 2.30 and newer: v2.30.3-1 (v2.30.7-1 reformats only) --------------------------------------------------------
TABLE_2_30 = replace(
    TABLE_2_29_7, first=NcclVersion(2, 30, 1), source="v2.30.3-1",
    per_ch_max_nvls_tree_bws=_arch((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (0.0, 57.7, 45.5), (0.0, 96.0, 80.0)),
)

FAMILIES: tuple[TuningTable, ...] = (TABLE_2_18, TABLE_2_19, TABLE_2_21, TABLE_2_23, TABLE_2_24, TABLE_2_25,
                                     TABLE_2_27, TABLE_2_28, TABLE_2_28_7, TABLE_2_28_9, TABLE_2_29, TABLE_2_29_7,
                                     TABLE_2_30)

# treeCorrectionFactor[proto][log2(nBytes/64)], 64 B .. 256 MiB (unchanged 2.18-2.30; 24 columns from 2.29)
TREE_CORRECTION: tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]] = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)

# The NVLS graph (search.cc, NVLS pattern): one channel per GPU of the node (maxChannels = GPU count) at the top of
# the architecture's speed array (sm90SpeedArrayIntra 60.0; sm100SpeedArrayIntra 90.0, v2.25.1-1+). Hopper's
# reproduces NCCL 2.29.2's printed NVLS AllReduce cells on 2 and 4 H100 (102.0 and 160.0 GB/s) and ~480 GB/s
# busbw on 8 (NVIDIA/nccl-tests #212); Blackwell's is the same rule, unchecked against a printed table.
NVLS_GRAPH_BW_GB_PER_S = {90: 60.0, 100: 90.0}
NVLS_MAX_NTHREADS = 640  # NCCL_MAX_NTHREADS: NVLS, NVLSTree, CollNet and PAT kernels (tuning.cc maxThreads)
NVLS_MIN_CHANNELS = 2  # "NVLS/NVLStree needs at least 2 channels" (tuning.cc, 2.28+)
NVLS_MAX_ARITY = 32  # NCCL_MAX_NVLS_ARITY (device.h): AG/RS on NVLS only up to 32 local ranks (enqueue.cc)


def tuning_table(version: NcclVersion) -> TuningTable:
    """The family in force for ``version``: the newest whose first release is not after it
    (a release older than 2.18 reads the 2.18 table; a newer one than 2.30 the 2.30 table)."""
    chosen = FAMILIES[0]
    for table in FAMILIES:
        if table.first <= version:
            chosen = table
    return chosen


__all__ = ["FAMILIES", "NVLS_GRAPH_BW_GB_PER_S", "NVLS_MAX_ARITY", "NVLS_MAX_NTHREADS", "NVLS_MIN_CHANNELS",
           "NvswitchSearch", "TREE_CORRECTION", "TuningTable", "tuning_table"]
