"""The simulator's mechanism constants: defaults, each with its source, overridable per cluster.

A preset's ``sim:`` mapping overrides any of these (unknown keys are a LagomError, so a
typo cannot silently leave a default in place). ``docs/simulator.md`` explains where
each one enters the mechanism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from costmodel.cluster import ClusterSpec
from nccl_env.errors import LagomError


@dataclass(frozen=True)
class SimParams:
    # --- compute ---------------------------------------------------------------------------
    gemm_efficiency: float = 0.72  # cuBLAS large BF16 GEMMs reach ~70-75% of dense tensor peak
    attention_efficiency: float = 0.60  # FlashAttention-2 forward reaches ~60% of peak (Dao 2023, A100)
    mem_efficiency: float = 0.85  # STREAM-like kernels reach ~85% of DRAM peak
    kernel_overhead_us: float = 2.0  # launch + tail of one kernel on a busy stream (~2 us, nsys traces)
    # GEMM L2 reuse: a wave of W resident tiles arranged as a square super-tile reuses each
    # operand panel sqrt(W) times (CUTLASS threadblock swizzle), provided the wave's k-slabs
    # (W x shared-memory tile) stay in L2; without L2 room only the reuse between blocks
    # that read the same slab at the same moment survives: gemm_short_reuse x the tile's own
    # reuse bm*bn/(bm+bn). Blocks of one wave that read the same A slab within the same
    # k-step (row-mates in launch order) still share it: ~1.2x (a slab is read by 2 blocks
    # at a time in about a fifth of the cases on a GA102-sized wave).
    gemm_short_reuse: float = 1.22
    # --- collectives -------------------------------------------------------------------------
    simple_bw_per_channel_gb_per_s: float = 20.0  # NCCL topo.h SM80_NVLINK_BW: per-channel figure
    ll128_bw_per_channel_gb_per_s: float = 20.0  # NCCL tuning.cc perChMaxRingLL128Bws Ampere
    ll_bw_per_channel_gb_per_s: float = 5.5  # NCCL tuning.cc llMaxBws Ampere 87.7 GB/s / 16 channels
    channel_saturation_threads: int = 256  # a CTA's copy loop is latency-bound below ~8 warps (Little's law)
    ll_payload_fraction: float = 0.5  # LL: 8 bytes of flag per 8 bytes of data (NCCL devcomm.h ncclLLFifoLine)
    ll128_payload_fraction: float = 120.0 / 128.0  # LL128: 8 flag bytes per 128-byte line
    step_sync_us_simple: float = 1.0  # per chunk-step: __threadfence_system + flag post + poll over the link
    step_sync_us_ll128: float = 0.4  # per step: flags travel inline with data, no fence
    step_sync_us_ll: float = 0.2  # per step: flags inline, 8-byte granularity
    launch_us: float = 5.0  # NCCL kernel launch + work-element fetch (NCCL tuning.cc baseLat is 6.6-8.4 us)
    # LL128's baseLat, 14.0 us, is 5.6 us above: nccl_defaults.protocol_base_excess_us adds it
    # FIFO data written by the peer and not yet read by the channel's CTA: one slice, the unit a
    # sender posts and a receiver waits on (NCCL collectives.h: SLICESTEPS = NCCL_STEPS/4 of a
    # chunk's CHUNKSTEPS = NCCL_STEPS/2, so half a chunk); the rest of the two-chunk FIFO is already
    # read (write-once, read-once lines, not re-used). Was 1.0 (a whole chunk): on H100 that charged
    # a GEMM beside 32 channels x 2 MiB the whole 50 MB L2 (pytorch #172714 overlap +26%, issue 23)
    fifo_resident_chunks: float = 0.5
    dram_bytes_per_payload_byte: float = 1.0  # a collective writes its result (and reads its input) once per byte
    fifo_dram_bytes_per_payload_byte: float = 2.0  # FIFO traffic (peer write + CTA read) when it spills out of L2
    tree_bw_fraction: float = 0.92  # NCCL tuning.cc: tree bandwidth 0.92 of the ring's
    # A copy between registered buffers (copy engines, symmetric kernels) reads its source once and
    # writes its destination once; each GPU both sends and receives: 2 DRAM bytes per wire byte
    # (NVIDIA/nccl #1428, a maintainer: a copy stores to memory and reads back; NCCL's FIFO path
    # adds the staging round trip, fifo_dram_bytes_per_payload_byte above)
    direct_dram_bytes_per_payload_byte: float = 2.0
    # one small copy-engine write to a peer, back to back on a stream: 1.8-2.3 us
    # (p2pBandwidthLatencyTest "P2P=Enabled Latency (P2P Writes)", NVIDIA/cuda-samples #230)
    ce_copy_latency_us: float = 2.0
    # --- NVLS (NVLink SHARP) ----------------------------------------------------------------
    # An NVLS channel's multimem loads and stores reach this share of a Simple channel's copy rate;
    # 0: NCCL's own figure for the GPU (tuning.cc nvlsEfficiency, v2.30.7-1: Hopper 0.85, Blackwell
    # 0.74; costmodel.nccl_algorithms.nvls_efficiency)
    nvls_efficiency: float = 0.0


_FIELDS = {f.name: f.type for f in fields(SimParams)}
# Shares of a peak: above 1 is faster than the hardware, 0 never finishes (division by zero).
_FRACTIONS = {"gemm_efficiency", "attention_efficiency", "mem_efficiency", "ll_payload_fraction",
              "ll128_payload_fraction", "tree_bw_fraction", "nvls_efficiency"}
# Rates and divisors that must not be 0.
_POSITIVE = {"simple_bw_per_channel_gb_per_s", "ll128_bw_per_channel_gb_per_s", "ll_bw_per_channel_gb_per_s",
             "channel_saturation_threads", "gemm_short_reuse"}


def sim_params(cluster: ClusterSpec) -> SimParams:
    """Defaults overridden by the cluster's ``sim:`` mapping."""
    raw = cluster.sim or {}
    unknown = set(raw) - set(_FIELDS)
    if unknown:
        raise LagomError(f"cluster {cluster.name}: unknown 'sim' key(s) {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(_FIELDS))})")
    values: dict[str, Any] = {}  # int or float per field, checked below
    for key, value in raw.items():
        is_int = _FIELDS[key] in ("int", int)
        if isinstance(value, bool) or (is_int and isinstance(value, float) and not value.is_integer()):
            raise LagomError(f"cluster {cluster.name}: 'sim.{key}' must be {'an integer' if is_int else 'a number'}, "
                             f"got {value!r}")
        try:
            values[key] = int(value) if is_int else float(value)
        except (TypeError, ValueError, OverflowError):
            raise LagomError(f"cluster {cluster.name}: 'sim.{key}' must be a number, got {value!r}") from None
        if not math.isfinite(values[key]) or values[key] < 0:
            raise LagomError(f"cluster {cluster.name}: 'sim.{key}' must be a finite number >= 0, got {value!r}")
        if key in _FRACTIONS and not 0 < values[key] <= 1:
            raise LagomError(f"cluster {cluster.name}: 'sim.{key}' is a fraction: must be in (0, 1], got {value!r}")
        if key in _POSITIVE and values[key] == 0:
            raise LagomError(f"cluster {cluster.name}: 'sim.{key}' must be > 0, got {value!r}")
    return SimParams(**values)
