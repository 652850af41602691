"""NCCL's rules for knob values, per NCCL version.

Sources (NVIDIA/nccl): docs/userguide/source/env.rst (NCCL_ALGO version table,
NCCL_NTHREADS, NCCL_MIN/MAX_CTAS), src/graph/tuning.cc (getNthreads ranges),
src/include/device.h (NCCL_SIMPLE_MAX_NTHREADS 512, NCCL_LL128_MAX_NTHREADS 640,
ncclProtoGrainSize), src/plugin/tuner.cc and src/include/plugin/tuner/tuner_v*.h
(which tuner-plugin ABI each version loads and what it can set).
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, fields

from nccl_env.errors import LagomError
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, CtaPolicy

WARP_SIZE = 32  # CUDA warp size; NCCL thread counts must be multiples of it (tuning.cc getNthreads)
THREADS_MIN = 64  # 2 * WARP_SIZE, tuning.cc getNthreads(NCCL_NTHREADS, min=2*WARP_SIZE)
THREADS_MAX = 512  # NCCL_SIMPLE_MAX_NTHREADS / NCCL_LL_MAX_NTHREADS, device.h
LL128_THREADS_MIN = 160  # NCCL_LL128_MAX_NTHREADS / 4, tuning.cc
LL128_THREADS_MAX = 640  # NCCL_LL128_MAX_NTHREADS, device.h
CHUNK_GRAIN_BYTES = 512  # ncclProtoGrainSize(NCCL_PROTO_SIMPLE), device.h: NCCL aligns chunks down to it
CHUNK_MAX_BYTES = 1 << 30  # Lagom's sanity cap (NCCL clamps to the buffer anyway); also the plugin's cap
DEFAULT_BUFFSIZE_BYTES = 4 << 20  # DEFAULT_BUFFSIZE, init.cc
NCCL_STEPS = 8  # NCCL_STEPS, device.h: a buffer is split into 8 steps
RING_SIMPLE_CHUNK_STEPS = 4  # chunkSteps for Ring/Simple (ALLREDUCE_CHUNKSTEPS = NCCL_STEPS/2)


@functools.total_ordering
@dataclass(frozen=True)
class NcclVersion:
    """An NCCL release, e.g. ``NcclVersion.parse("2.18.3")``; compares numerically."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> NcclVersion:
        """``"2.18.3"``, ``"2.18"``, ``"2.18.3-1"``, ``"v2.18.3"``, and as distributions write it
        (``"2.21.5-1+cuda12.4"``, ``"2.21.5+cuda12.4"``: a package revision, a build tag); LagomError otherwise."""
        m = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:-[\w.~]*)?(?:\+[\w.~]*)?\s*", str(text))
        if not m:
            raise LagomError(f"NCCL version {text!r} is not of the form MAJOR.MINOR[.PATCH] (e.g. 2.18.3)")
        version = cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
        if version.major != 2:
            # Every NCCL release with the knobs Lagom sets is 2.x (NCCL 1.x predates them).
            raise LagomError(f"NCCL version {text!r}: Lagom knows NCCL 2.x only")
        return version

    @classmethod
    def from_code(cls, code: int) -> NcclVersion:
        """Decode ``ncclGetVersion``'s integer: 21803 -> 2.18.3, 23203 -> 2.32.3, 2708 -> 2.7.8.

        NCCL_VERSION_CODE is major*10000 + minor*100 + patch from 2.9 on and
        major*1000 + minor*100 + patch before (nccl.h, NCCL_VERSION macro).
        """
        code = int(code)
        if code <= 0:
            raise LagomError(f"NCCL version code {code} is not positive")
        if code >= 10000:
            return cls(code // 10000, (code % 10000) // 100, code % 100)
        return cls(code // 1000, (code % 1000) // 100, code % 100)

    @property
    def code(self) -> int:
        return self.major * 10000 + self.minor * 100 + self.patch

    def __lt__(self, other: NcclVersion) -> bool:
        return (self.major, self.minor, self.patch) < (other.major, other.minor, other.patch)

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def _v(text: str) -> NcclVersion:
    return NcclVersion.parse(text)


# First NCCL version with each algorithm (env.rst, NCCL_ALGO version table).
ALGORITHM_SINCE: dict[Algorithm, NcclVersion] = {
    Algorithm.TREE: _v("2.4"),
    Algorithm.RING: _v("2.0"),
    Algorithm.COLLNET_DIRECT: _v("2.14"),  # "Collnet" 2.5-2.13 became CollnetDirect/CollnetChain
    Algorithm.COLLNET_CHAIN: _v("2.14"),
    Algorithm.NVLS: _v("2.17"),
    Algorithm.NVLS_TREE: _v("2.18"),
    Algorithm.PAT: _v("2.23"),
}

# Tuner plugin ABI symbols and the first NCCL that loads each (src/plugin/tuner/tuner_v*.cc history).
TUNER_SYMBOL_SINCE: dict[str, NcclVersion] = {
    "ncclTunerPlugin_v2": _v("2.21"),
    "ncclTunerPlugin_v3": _v("2.22"),
    "ncclTunerPlugin_v4": _v("2.24"),
    "ncclTunerPlugin_v5": _v("2.28"),
    "ncclTunerPlugin_v6": _v("2.30"),
    # v7: 2.32.6 (NCCL's release list, issue 30); 2.32.3's libnccl.so.2 (PyPI nvidia-nccl-cu12) names
    # only "TUNER/Plugin: Using %s (v2)" .. "(v6)", so v7 came after it.
    "ncclTunerPlugin_v7": _v("2.32.6"),
}

MAXCHANNELS_64_SINCE = _v("2.25")  # MAXCHANNELS 32 -> 64 (docs/reference.md §3)
PER_FUNCTION_ALGO_SINCE = _v("2.24")  # NCCL_ALGO/NCCL_PROTO "func:list;..." syntax (env.rst)
CTAS_ENV_SINCE = _v("2.17")  # NCCL_MIN_CTAS / NCCL_MAX_CTAS and ncclConfig_t min/maxCTAs (env.rst)
CHUNK_PLUGIN_SINCE = TUNER_SYMBOL_SINCE["ncclTunerPlugin_v6"]  # getChunkSize
COLL_CONFIG_SINCE = _v("2.31")  # ncclCollConfig_t and the nccl*Config entry points (nccl.h; the struct is _v23100)


def max_channels(version: NcclVersion) -> int:
    """MAXCHANNELS of this NCCL: 64 from 2.25, 32 before."""
    return 64 if version >= MAXCHANNELS_64_SINCE else 32


def algorithms_available(version: NcclVersion) -> tuple[Algorithm, ...]:
    """Algorithms this NCCL has, in NCCL_ALGO_* order."""
    return tuple(a for a in Algorithm if version >= ALGORITHM_SINCE[a])


def tuner_symbols(version: NcclVersion) -> tuple[str, ...]:
    """Tuner-plugin symbols this NCCL can load, newest (the one it tries first) first."""
    return tuple(sorted((s for s, v in TUNER_SYMBOL_SINCE.items() if version >= v), reverse=True))


def per_collective_knobs(version: NcclVersion) -> frozenset[str]:
    """CommConfig fields Lagom's tuner plugin can set per collective on this NCCL.

    Empty before 2.21 (no plugin ABI Lagom exports); algorithm, protocol and channels
    from 2.21; chunk_bytes from 2.30 (v6 getChunkSize). Threads never: no plugin ABI
    carries them.
    """
    if not tuner_symbols(version):
        return frozenset()
    knobs = {"algorithm", "protocol", "channels"}
    if version >= CHUNK_PLUGIN_SINCE:
        knobs.add("chunk_bytes")
    return frozenset(knobs)


def process_wide_knobs(version: NcclVersion) -> frozenset[str]:
    """CommConfig fields that can only be set once per process (or per communicator); ``comm_path``
    is neither: one per process group (ncclConfig_t.CTAPolicy and the buffers' registration)."""
    return frozenset(f.name for f in fields(CommConfig)) - per_collective_knobs(version) - {"comm_path"}


def validate_config(config: CommConfig, version: NcclVersion, collective: CollectiveType | None = None,
                    buffsize_bytes: int | None = None) -> None:
    """:func:`nccl_env.knob_table.validate_config` (each row's validator), kept here while
    lagom/commands/simulate.py, rewritten on another branch, imports it from this module."""
    from nccl_env.knob_table import validate_config as by_table  # the table imports this module

    by_table(config, version, collective, buffsize_bytes)


def max_chunk_bytes(buffsize_bytes: int, algo: Algorithm | None) -> int:
    """NCCL's chunk ceiling for a Simple-protocol buffer (enqueue.cc calcCollChunking, bufferMaxChunkSize)."""
    steps = RING_SIMPLE_CHUNK_STEPS if algo in (None, Algorithm.RING) else 1
    return buffsize_bytes // NCCL_STEPS * steps


def buffsize_for_chunk(wanted_chunk_bytes: int, algo: Algorithm | None) -> int:
    """Smallest NCCL_BUFFSIZE whose Simple-protocol chunk ceiling admits ``wanted_chunk_bytes``.

    enqueue.cc calcCollChunking: chunk ceiling = BUFFSIZE / NCCL_STEPS * chunkSteps,
    chunkSteps = 4 for Ring/Simple and 1 otherwise. ``None`` (NCCL decides) is taken
    as Ring, NCCL's usual choice for large messages.
    """
    steps = RING_SIMPLE_CHUNK_STEPS if algo in (None, Algorithm.RING) else 1
    return wanted_chunk_bytes * NCCL_STEPS // steps


# ---- point-to-point (AllToAll, send/recv) -----------------------------------------------
# NCCL runs point-to-point through its own path (enqueue.cc scheduleP2pTasksToPlan): no
# tuner-plugin call, no NCCL_ALGO/NCCL_PROTO, threadPerBlock = NCCL_MAX_NTHREADS whatever
# NCCL_NTHREADS says, and a step of comm->p2pChunkSize bytes, which init.cc
# computeBuffSizes reads per communicator from one of three env variables, not from
# NCCL_BUFFSIZE.
P2P_COLLECTIVES = frozenset({CollectiveType.ALLTOALL, CollectiveType.SENDRECV})
P2P_NET_CHUNK_ENV = "NCCL_P2P_NET_CHUNKSIZE"  # communicators spanning nodes (default 128 KiB, init.cc)
P2P_NVL_CHUNK_ENV = "NCCL_P2P_NVL_CHUNKSIZE"  # one node, every GPU pair on NVLink (default 512 KiB)
P2P_PCI_CHUNK_ENV = "NCCL_P2P_PCI_CHUNKSIZE"  # one node otherwise (default 128 KiB)
P2P_CHUNK_CAPPED_SINCE = _v("2.19")  # init.cc: p2pChunkSize <= buffSizes[SIMPLE] / NCCL_STEPS


def p2p_chunk_envs(nodes: int) -> tuple[str, ...]:
    """The env variables that set a point-to-point communicator's step size.

    Across nodes NCCL reads NCCL_P2P_NET_CHUNKSIZE; inside one node it reads the NVL or
    the PCI one depending on whether every GPU pair has an NVLink path, which a
    signature does not tell: both get the same value, and NCCL reads the one it needs.
    """
    return (P2P_NET_CHUNK_ENV,) if nodes > 1 else (P2P_NVL_CHUNK_ENV, P2P_PCI_CHUNK_ENV)


def p2p_chunk_ceiling(version: NcclVersion, buffsize_bytes: int | None) -> int | None:
    """The largest point-to-point step NCCL keeps on ``version`` with this NCCL_BUFFSIZE
    (None: the default), or None where nothing caps it (before 2.19)."""
    if version < P2P_CHUNK_CAPPED_SINCE:
        return None
    return (buffsize_bytes or DEFAULT_BUFFSIZE_BYTES) // NCCL_STEPS


# ---- communication paths: SM kernels, symmetric kernels, copy engines (CommPath) -----------------
# Where each path is allowed, from NVIDIA/nccl's source at the release tags (the authority):
#
# * CTA policy: ncclConfig_t.CTAPolicy and NCCL_CTA_POLICY exist from 2.27 with DEFAULT 0 and
#   EFFICIENCY 1; ZERO 2 from 2.28 (src/nccl.h.in at v2.27.3-1 / v2.28.3-1). NCCL_CTA_POLICY takes
#   the integers 0/1/2 before 2.29 and also the names DEFAULT|EFFICIENCY|ZERO (combinable with |)
#   from 2.29 (init.cc getEnvCtaPolicyOnce, v2.29.2-1; env.rst "since 2.29, legacy values since
#   2.27"). NCCL_CTA_POLICY, when set, overrides every communicator's config ("Comm config CTAPolicy
#   reset to NCCL_CTA_POLICY", init.cc): per-group policies need ProcessGroupNCCL.Options. ZERO
#   itself moves only a collective whose buffers are in a symmetric window (enqueue.cc ceAvailable
#   from ncclGetSymRegType; otherwise the kernel path), so the env's ZERO equals per-group ZERO
#   where only the copy-engine groups register (nccl_env.delivery).
# * EFFICIENCY changes one choice only: with no tuner plugin loaded (comm->tuner == NULL), neither
#   NCCL_ALGO nor NCCL_PROTO set and no MNNVL, a registered AllGather/ReduceScatter switches to NVLS
#   with fewer CTAs (ncclNvlsRegResourcesQuery) when NVLS is supported (enqueue.cc
#   ncclGetAlgoInfo, v2.27.3-1 .. v2.30.7-1). Lagom's evaluators do not model NVLS, so the search
#   never offers it; a tuned file carries it through unchanged.
# * Symmetric kernels (ncclSymDevKernel_* in 2.27, ncclSymkDevKernel_* from 2.28): AllGather,
#   AllReduce and ReduceScatter (sum of floating-point types for the reductions; symmetric.cc /
#   sym_kernels.cc ncclSym(k)Implemented) on buffers registered in a symmetric window
#   (ncclCommWindowRegister with NCCL_WIN_COLL_SYMMETRIC). 2.27-2.28: one node, all peers with
#   direct P2P (enqueue.cc ncclPrepareTasks: nNodes == 1; init.cc symmetricSupport); from 2.29 every
#   rank on direct NVLink (sym_kernels.cc ncclSymkAvailable: isAllDirectNvlink). NCCL picks the
#   kernel and the fewest CTAs within 2.5% of its model's best (costmodel.nccl_defaults) before it
#   would ask a tuner plugin: the plugin cannot steer them.
# * Copy-engine collectives: CTA policy ZERO, the output (2.28: input and output) in a symmetric
#   window, CUDA driver >= 12.5 (ce_coll.cc ncclCeImplemented), AllGather and AlltoAll (also
#   Gather/Scatter, which Lagom does not model): 2.28 one node (enqueue.cc taskAppend, v2.28.3-1),
#   from 2.30 every rank load/store-accessible over NVLink, an NVLink or MNNVL domain
#   (ce_coll.cc ncclCeAvailable: ncclTeamLsa), and across the network (CPU proxy between nodes,
#   copy engines inside) from 2.30.6 (docs/userguide usage/bufferreg.rst "Zero-CTA Optimization";
#   ncclHierCeAvailable first appears in the 2.30.5 commit and the 2.30.7 tag, not in 2.30.4) with
#   both buffers registered. Chosen in taskAppend, before any tuner plugin call.
# Lagom takes "every rank on NVLink" to mean an NVSwitch node (ClusterSpec intra_node.kind
# "nvswitch"): NCCL's own 2.27-2.29 condition (direct P2P) also admits PCIe P2P, where neither
# path's bandwidth is measured; Lagom does not offer them there.
CTA_POLICY_SINCE: dict[CtaPolicy, NcclVersion] = {
    CtaPolicy.DEFAULT: _v("2.27"),
    CtaPolicy.EFFICIENCY: _v("2.27"),
    CtaPolicy.ZERO: _v("2.28"),
}
CTA_POLICY_NAMES_SINCE = _v("2.29")  # NCCL_CTA_POLICY=ZERO (names); before, only the integers
SYMMETRIC_KERNELS_SINCE = _v("2.27")
SYMMETRIC_ALL_NVLINK_SINCE = _v("2.29")  # from here any number of nodes in one NVLink domain
COPY_ENGINE_SINCE = CTA_POLICY_SINCE[CtaPolicy.ZERO]
COPY_ENGINE_ACROSS_NODES_SINCE = _v("2.30.6")
COPY_ENGINE_MIN_CUDA_DRIVER = "12.5"  # ce_coll.cc: driverVersion >= 12050
SYMMETRIC_COLLECTIVES = frozenset({CollectiveType.ALLGATHER, CollectiveType.ALLREDUCE, CollectiveType.REDUCESCATTER})
COPY_ENGINE_COLLECTIVES = frozenset({CollectiveType.ALLGATHER, CollectiveType.ALLTOALL})
PATH_SINCE: dict[CommPath, NcclVersion] = {
    CommPath.SM: _v("2.0"),
    CommPath.SYMMETRIC: SYMMETRIC_KERNELS_SINCE,
    CommPath.COPY_ENGINE: COPY_ENGINE_SINCE,
    CommPath.EFFICIENCY: CTA_POLICY_SINCE[CtaPolicy.EFFICIENCY],
}


class Mechanism(enum.Enum):
    """What actually moves one collective's data, given its group's path (what evaluators model)."""

    SM_KERNEL = "sm kernel"  # NCCL's ring/tree kernels: one CTA per channel, Lagom's knobs apply
    SYMMETRIC_KERNEL = "symmetric kernel"  # ncclSymkDevKernel_*: few CTAs, NCCL's own choice
    COPY_ENGINE = "copy engine"  # cudaMemcpyBatchAsync on the copy engines: no CTA


@dataclass(frozen=True)
class Topology:
    """What the path rules need of a cluster: whether every GPU pair of a node is on NVLink
    (an NVSwitch node), and whether NVLS (NVLink SHARP) is there and modelled."""

    all_nvlink: bool
    nvls: bool = False


def paths_available(version: NcclVersion) -> tuple[CommPath, ...]:
    """The paths this NCCL has, SM first."""
    return tuple(p for p in CommPath if version >= PATH_SINCE[p])


def collective_mechanism(path: CommPath | None, collective: CollectiveType, nodes: int, version: NcclVersion,
                         topology: Topology) -> Mechanism:
    """What NCCL runs for one collective of a group on ``path`` (the comment block above).

    ``nodes``: the nodes the group spans. A path this NCCL, topology or collective does not
    admit leaves the collective on NCCL's kernels, as NCCL itself does (it falls back).
    """
    if path is None or path in (CommPath.SM, CommPath.EFFICIENCY) or version < PATH_SINCE[path]:
        return Mechanism.SM_KERNEL  # EFFICIENCY: NVLS only, which no modelled topology has
    if not topology.all_nvlink:
        return Mechanism.SM_KERNEL
    if path is CommPath.COPY_ENGINE:
        if collective in COPY_ENGINE_COLLECTIVES and (nodes <= 1 or version >= COPY_ENGINE_ACROSS_NODES_SINCE):
            return Mechanism.COPY_ENGINE
        return Mechanism.SM_KERNEL  # its other collectives' buffers are not registered: NCCL's kernels
    # SYMMETRIC: one node before 2.29; from 2.29 every rank on direct NVLink (one NVSwitch node here)
    if collective in SYMMETRIC_COLLECTIVES and nodes <= 1:
        return Mechanism.SYMMETRIC_KERNEL
    return Mechanism.SM_KERNEL


def path_requirements(path: CommPath, collectives: list[CollectiveType], version: NcclVersion) -> list[str]:
    """What the user must turn on for a group on ``path`` whose collectives are ``collectives``
    (the ones the path moves), one sentence each; empty for SM."""
    if path is CommPath.SM:
        return []
    names = ", ".join(sorted({c.value for c in collectives})) or "its collectives"
    register = (f"allocate the buffers of its {names} in NCCL symmetric memory: for an FSDP2 model call "
                f"module.set_symm_mem_for_comm(\"NCCL\") on each fully_shard module (all-gather buffers; "
                f"torch >= 2.13 has it); for other tensors torch.distributed._symmetric_memory.set_backend(\"NCCL\"), "
                f"allocate with symm_mem.empty(...) and call symm_mem.rendezvous(tensor, group)")
    out = [register]
    if path is CommPath.COPY_ENGINE:
        out.append("create the group with CTA policy ZERO: lagom run passes ProcessGroupNCCL.Options with "
                   "config.cta_policy = NCCL_CTA_POLICY_ZERO (torch with the cta_policy binding, pytorch PR #164309), "
                   "and NCCL_CTA_POLICY=2 too where no group is on symmetric kernels (the env overrides every "
                   "communicator's policy; ZERO moves only collectives on registered buffers)")
        out.append(f"NCCL >= {COPY_ENGINE_SINCE} on one node, >= {COPY_ENGINE_ACROSS_NODES_SINCE} across nodes; "
                   f"CUDA driver >= {COPY_ENGINE_MIN_CUDA_DRIVER}")
    elif path is CommPath.SYMMETRIC:
        out.append(f"NCCL >= {SYMMETRIC_KERNELS_SINCE} with window registration on (NCCL_WIN_ENABLE=1, the default) "
                   f"and cuMem (NCCL_CUMEM_ENABLE=1, the default)")
    else:
        out.append("CTA policy EFFICIENCY takes effect only with no tuner plugin loaded and NCCL_ALGO/NCCL_PROTO "
                   "unset (lagom run then leaves the plugin out)")
    out.append("registering a buffer costs once per allocation (seconds in a short job: "
               "Tencent-Hunyuan/UniRL #467 measured 3.1 s of handle export/import)")
    return out
