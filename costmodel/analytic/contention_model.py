"""A compute kernel beside running collectives, and what each leaves the other.

Pure functions over plain numbers; the adapter is :mod:`costmodel.analytic`.

Compute (the Lagom paper's Eq. 4-6, docs/reference.md §1, with a roofline max
where the paper adds). A kernel launches ``mu`` thread blocks, ``TB`` resident per SM.
With collectives holding ``NC`` SMs (one CTA per channel) it runs on ``S = lambda - NC``
SMs in ``g = ceil(mu / (S x TB))`` waves, and takes

    y = max(g x TB x flops_per_block / (SM peak x efficiency),  traffic / B_left) + overhead

where ``B_left`` is the DRAM bandwidth left to it (``Bmax - V``: V the collectives'
demand, shared max-min fairly when the two together ask for more than Bmax), and
``traffic`` is its DRAM bytes. For a GEMM (tile read from its cuBLAS-style name) the
traffic depends on the L2 the collectives leave it (``L2 - footprints``): a wave of
``R`` resident tiles reuses each operand ``tile_reuse x sqrt(R)`` times when its
working set (R x shared-memory tile x a fitted factor) fits, ``tile_reuse x
short_reuse`` when it does not, linear in between. This is how NC and the chunk size
slow compute beyond the SMs they take: the paper's V(NC, C) and L2 pressure.

Kernels without FLOPs (from a trace) keep their observed duration, scaled by the wave
ratio and, for half of it, by the DRAM bandwidth left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from costmodel.analytic.collective_model import CollectiveEstimate
from nccl_env.errors import LagomError
from traces.gemm_names import gemm_dtype, gemm_tile

_TFLOPS = 1e12 / 1e6  # FLOP per microsecond in one TFLOP/s
_GB = 1e9 / 1e6  # bytes per microsecond in one GB/s
_TRACE_MEMORY_SHARE = 0.5  # a traced kernel of unknown make-up: half of its time streams DRAM (assumption)


@dataclass(frozen=True)
class GpuNumbers:
    sm_count: int
    l2_bytes: float
    mem_bw: float  # achievable DRAM bytes/us (peak x mem_efficiency)
    peak_flop_per_us: float  # dense BF16 tensor-core peak
    max_blocks_per_sm: int
    max_threads_per_sm: int
    fp32_flop_per_us: float | None = None  # CUDA-core FP32 peak (FP32 GEMMs), when known


@dataclass(frozen=True)
class ComputeShape:
    """What Eq. 4-6 need of one kernel (built once per workload)."""

    base_us: float  # alone on the whole GPU (the model's, or the trace's)
    blocks: int  # mu (0 = unknown grid)
    tb: int  # blocks resident per SM
    flops_block: float  # 0 for traced kernels
    flop_rate_sm: float  # FLOP/us of one SM at the kernel's efficiency
    dram_bytes: float
    tile_reuse: float  # bm*bn/(bm+bn) for a GEMM, else 0
    smem_bytes: float  # one resident tile's working set
    overhead_us: float
    trace_us: float  # traced kernels: observed time minus overhead; else 0
    memory_op: bool


def gpu_numbers(sm_count: int, l2_bytes: float, mem_bw_gb_per_s: float, peak_tflops: float, max_blocks_per_sm: int,
                max_threads_per_sm: int, mem_efficiency: float, fp32_tflops: float | None = None) -> GpuNumbers:
    return GpuNumbers(sm_count, float(l2_bytes), mem_bw_gb_per_s * _GB * mem_efficiency, peak_tflops * _TFLOPS,
                      max_blocks_per_sm, max_threads_per_sm,
                      fp32_tflops * _TFLOPS if fp32_tflops is not None else None)


def compute_shape(p: dict, gpu: GpuNumbers, name: str, duration_us: float, blocks: int | None,
                  threads_per_block: int | None, blocks_per_sm: float | None, flops: float | None,
                  dram_bytes: float | None, smem_bytes: int | None, memory_op: bool) -> ComputeShape:
    block_threads = max(1, threads_per_block or 256)
    limit = max(1, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // block_threads))
    tb = max(1, min(limit, int(blocks_per_sm or 1)))
    mu = int(blocks or 0)
    overhead = p["kernel_overhead_us"]
    if flops is None:  # traced kernel: its observed duration is the anchor
        shape = ComputeShape(duration_us, mu, tb, 0.0, 1.0, float(dram_bytes or 0.0), 0.0, 0.0, overhead,
                             max(0.0, duration_us - overhead), memory_op)
        return shape
    lowered = name.lower()
    eff = p["attention_efficiency"] if ("flash" in lowered or "attn" in lowered) else p["gemm_efficiency"]
    if mu <= 0:
        mu = gpu.sm_count * tb
    dtype = gemm_dtype(name)  # BF16 for anything that is not a GEMM of another precision
    peak = dtype.peak_rate(gpu.peak_flop_per_us, gpu.fp32_flop_per_us)
    if peak is None:
        raise LagomError(f"{name}: an FP32 GEMM needs the GPU's FP32 peak (gpu.fp32_tflops), which is not given")
    tile = gemm_tile(name)
    reuse = 0.0
    smem = float(smem_bytes or 0)
    if tile is not None:
        bm, bn = tile
        reuse = bm * bn / (bm + bn) * 2 / dtype.operand_bytes
        if smem <= 0:
            smem = 3.0 * (bm + bn) * 32 * dtype.operand_bytes  # 3-stage pipeline of 32-wide k-slabs
    shape = ComputeShape(0.0, mu, tb, float(flops) / mu, peak * eff / gpu.sm_count,
                         float(dram_bytes or 0.0), reuse, smem, overhead, 0.0, memory_op)
    base = compute_time_us(p, gpu, shape, gpu.sm_count, gpu.l2_bytes, gpu.mem_bw)
    return ComputeShape(base, mu, tb, shape.flops_block, shape.flop_rate_sm, shape.dram_bytes, reuse, smem,
                        overhead, 0.0, memory_op)


def waves(shape: ComputeShape, free_sms: int) -> tuple[int, int]:
    """(waves x blocks per SM, tiles resident in a wave): Eq. 4's g, small grids spread out."""
    mu = shape.blocks
    per_sm = min(shape.tb, max(1, -(-mu // free_sms)))
    return -(-mu // (free_sms * per_sm)) * per_sm, min(mu, free_sms * per_sm)


def _traffic(p: dict, shape: ComputeShape, resident: int, l2_free: float) -> float:
    if shape.tile_reuse <= 0.0:
        return shape.dram_bytes
    working_set = resident * shape.smem_bytes * p["l2_working_set"]
    hit = min(1.0, max(0.0, l2_free) / working_set) if working_set > 0 else 1.0
    flops = shape.flops_block * shape.blocks
    per_flop = hit / (shape.tile_reuse * math.sqrt(resident)) + (1.0 - hit) / (shape.tile_reuse * p["gemm_short_reuse"])
    return max(shape.dram_bytes, flops * per_flop)


def compute_time_us(p: dict, gpu: GpuNumbers, shape: ComputeShape, free_sms: int, l2_free: float,
                    mem_bw: float) -> float:
    """y: the kernel's time were these resources left to it throughout."""
    free = max(1, min(free_sms, gpu.sm_count))
    bw = max(mem_bw, 1e-6)
    if shape.flops_block <= 0.0:
        if shape.memory_op:  # copy engines: only the DRAM share matters
            sm_factor = 1.0
        elif shape.blocks > 0:
            sm_factor = waves(shape, free)[0] / waves(shape, gpu.sm_count)[0]
        else:
            sm_factor = gpu.sm_count / free
        return shape.trace_us * max(sm_factor, _TRACE_MEMORY_SHARE * gpu.mem_bw / bw) + shape.overhead_us
    slots, resident = waves(shape, free)
    t_flops = slots * shape.flops_block / shape.flop_rate_sm
    return max(t_flops, _traffic(p, shape, resident, l2_free) / bw) + shape.overhead_us


def compute_dram_demand(p: dict, gpu: GpuNumbers, shape: ComputeShape, free_sms: int, l2_free: float) -> float:
    """Bytes/us the kernel pulls at its arithmetic pace (what it asks of DRAM)."""
    if shape.flops_block <= 0.0:
        return _TRACE_MEMORY_SHARE * gpu.mem_bw
    slots, resident = waves(shape, max(1, min(free_sms, gpu.sm_count)))
    t_flops = slots * shape.flops_block / shape.flop_rate_sm + shape.overhead_us
    return _traffic(p, shape, resident, l2_free) / t_flops


def share_dram(demand_compute: float, demand_comm: float, total: float) -> tuple[float, float]:
    """Max-min fair split of DRAM bandwidth between compute and communication."""
    if demand_compute + demand_comm <= total:
        return total - demand_comm, total - demand_compute
    half = total / 2.0
    if demand_comm <= half:
        return total - demand_comm, demand_comm
    if demand_compute <= half:
        return demand_compute, total - demand_compute
    return half, half


def running_set_times(p: dict, gpu: GpuNumbers, shapes: list[ComputeShape],
                      ests: list[CollectiveEstimate]) -> list[float]:
    """Durations of the running kernels, then the running collectives, were the set fixed.
    Collectives on the same class of link (network, or inside the node) share it evenly."""
    ctas = sum(e.ctas for e in ests)
    footprint = sum(e.footprint_bytes for e in ests)
    l2 = gpu.l2_bytes
    free = max(1, gpu.sm_count - ctas)
    on_sms = sum(1 for s in shapes if not s.memory_op)  # memcpy/memset hold no SM
    per_kernel = max(1, free // on_sms) if on_sms else free
    l2_compute = l2 - footprint if footprint < l2 else 0.0
    net = sum(e.crosses_net for e in ests)
    intra = len(ests) - net
    shares = [1.0 / (net if e.crosses_net else intra) for e in ests]
    l2_comm = [l2 * e.footprint_bytes / footprint if footprint > l2 else l2 for e in ests]
    demand_c = sum(compute_dram_demand(p, gpu, s, per_kernel, l2_compute) for s in shapes)
    demand_k = sum(e.dram_demand(l2k, sh) for e, l2k, sh in zip(ests, l2_comm, shares))
    bw_c, bw_k = share_dram(demand_c, demand_k, gpu.mem_bw)
    bw_c_each = bw_c / len(shapes) if shapes else bw_c
    bw_k_each = bw_k / len(ests) if ests else bw_k
    out = [compute_time_us(p, gpu, s, per_kernel, l2_compute, bw_c_each) for s in shapes]
    out += [e.time_under(l2k, bw_k_each, sh) for e, l2k, sh in zip(ests, l2_comm, shares)]
    return out


def pair_times(p: dict, gpu: GpuNumbers, shape: ComputeShape, e: CollectiveEstimate) -> tuple[float, float]:
    """:func:`running_set_times` for one kernel beside one collective (the hot case)."""
    free = max(1, gpu.sm_count - e.ctas)
    l2 = gpu.l2_bytes
    fp = e.footprint_bytes
    l2_compute = l2 - fp if fp < l2 else 0.0
    if shape.flops_block <= 0.0:
        demand_c = _TRACE_MEMORY_SHARE * gpu.mem_bw
        bw_c, bw_k = share_dram(demand_c, e.dram_demand(l2), gpu.mem_bw)
        return compute_time_us(p, gpu, shape, free, l2_compute, bw_c), e.time_under(l2, bw_k)
    slots, resident = waves(shape, free)
    t_flops = slots * shape.flops_block / shape.flop_rate_sm
    traffic = _traffic(p, shape, resident, l2_compute)
    bw_c, bw_k = share_dram(traffic / (t_flops + shape.overhead_us), e.dram_demand(l2), gpu.mem_bw)
    return max(t_flops, traffic / max(bw_c, 1e-6)) + shape.overhead_us, e.time_under(l2, bw_k)


def cta_wait_us(p: dict, gpu: GpuNumbers, shape: ComputeShape) -> float:
    """A collective launched beside a kernel that fills the GPU waits for its CTAs to find
    SMs: the kernel's blocks retire wave by wave, so ``cta_wait_waves`` of a wave (half a wave
    on average)."""
    full = gpu.sm_count * shape.tb
    if full <= 0 or shape.blocks < full or shape.base_us <= 0 or shape.memory_op:
        return 0.0
    return p["cta_wait_waves"] * shape.base_us * full / shape.blocks


@dataclass(frozen=True)
class ShapeArrays:
    """Many kernel shapes as numpy columns, for :func:`pair_times_many`."""

    blocks: np.ndarray
    tb: np.ndarray
    flops_block: np.ndarray
    flop_rate_sm: np.ndarray
    dram: np.ndarray
    reuse: np.ndarray
    smem: np.ndarray
    overhead: np.ndarray
    trace_us: np.ndarray
    base_us: np.ndarray
    traced: np.ndarray  # bool: no FLOPs, scaled from the observed duration
    memory_op: np.ndarray  # bool: a memcpy/memset on the copy engines (no SMs)
    full_waves: np.ndarray  # traced kernels: slots on the whole GPU


def shape_arrays(gpu: GpuNumbers, shapes: list[ComputeShape]) -> ShapeArrays:
    def col(name: str) -> np.ndarray:
        return np.array([float(getattr(s, name)) for s in shapes])

    blocks = col("blocks")
    traced = np.array([s.flops_block <= 0.0 for s in shapes], dtype=bool)
    full = np.array([waves(s, gpu.sm_count)[0] if s.blocks > 0 else 1 for s in shapes], dtype=float)
    return ShapeArrays(blocks, col("tb"), col("flops_block"), col("flop_rate_sm"), col("dram_bytes"),
                       col("tile_reuse"), col("smem_bytes"), col("overhead_us"), col("trace_us"), col("base_us"),
                       traced, np.array([s.memory_op for s in shapes], dtype=bool), full)


def pair_times_many(p: dict, gpu: GpuNumbers, s: ShapeArrays, e: CollectiveEstimate) -> tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]:
    """:func:`pair_times` for many kernel shapes beside one collective: (kernel times,
    collective times, the collective's CTA wait beside each kernel)."""
    free = float(max(1, gpu.sm_count - e.ctas))
    l2 = gpu.l2_bytes
    fp = e.footprint_bytes
    l2_compute = l2 - fp if fp < l2 else 0.0
    mu = np.maximum(s.blocks, 1.0)
    per_sm = np.minimum(s.tb, np.maximum(1.0, np.ceil(mu / free)))
    slots = np.ceil(mu / (free * per_sm)) * per_sm
    resident = np.minimum(mu, free * per_sm)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_flops = np.where(s.traced, 0.0, slots * s.flops_block / s.flop_rate_sm)
        ws = resident * s.smem * p["l2_working_set"]
        hit = np.where(ws > 0, np.minimum(1.0, max(0.0, l2_compute) / ws), 1.0)
        flops = s.flops_block * s.blocks
        per_flop = hit / (s.reuse * np.sqrt(resident)) + (1.0 - hit) / (s.reuse * p["gemm_short_reuse"])
        traffic = np.where(s.reuse > 0, np.maximum(s.dram, flops * per_flop), s.dram)
        demand_c = np.where(s.traced, _TRACE_MEMORY_SHARE * gpu.mem_bw, traffic / (t_flops + s.overhead))
    demand_k = e.dram_demand(l2)
    bw = gpu.mem_bw
    half = bw / 2.0
    fits = demand_c + demand_k <= bw
    if demand_k <= half:
        bw_c = np.where(fits, bw - demand_k, bw - demand_k)
        bw_k = np.where(fits, bw - demand_c, demand_k)
    else:
        small = demand_c <= half
        bw_c = np.where(fits, bw - demand_k, np.where(small, demand_c, half))
        bw_k = np.where(fits, bw - demand_c, np.where(small, bw - demand_c, half))
    bw_c = np.maximum(bw_c, 1e-6)
    if s.traced.any():
        sm_factor = np.where(s.memory_op, 1.0, np.where(s.blocks > 0, slots / s.full_waves, gpu.sm_count / free))
        y_traced = s.trace_us * np.maximum(sm_factor, _TRACE_MEMORY_SHARE * gpu.mem_bw / bw_c) + s.overhead
    else:
        y_traced = 0.0
    y = np.where(s.traced, y_traced, np.maximum(t_flops, traffic / bw_c) + s.overhead)
    if e.wire_bytes <= 0:
        yx = np.full_like(y, e.fixed_us)
    else:
        rate = np.minimum(e.rate_cap, np.maximum(bw_k, 1e-6) / max(1e-9, e.dram_per_byte(l2)))
        yx = e.fixed_us + np.maximum(e.wire_bytes / rate, e.steps_us)
    full_gpu = gpu.sm_count * s.tb
    if not e.waits_for_sms:  # copy engines: no CTA to place
        return y, yx, np.zeros_like(y)
    wait = np.where((s.blocks >= full_gpu) & (s.base_us > 0) & ~s.memory_op,
                    p["cta_wait_waves"] * s.base_us * full_gpu / np.maximum(s.blocks, 1.0), 0.0)
    return y, yx, wait
