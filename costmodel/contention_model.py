"""A compute kernel beside running collectives, and what each leaves the other.

Pure functions over plain numbers; the adapter is :mod:`costmodel.analytic`.

Compute (the Lagom paper's Eq. 4-6, REFERENCE.md section 1, with a roofline max
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
import re
from dataclasses import dataclass

from costmodel.collective_model import CollectiveEstimate

_TFLOPS = 1e12 / 1e6  # FLOP per microsecond in one TFLOP/s
_GB = 1e9 / 1e6  # bytes per microsecond in one GB/s
_TILE = re.compile(r"_(\d{2,3})x(\d{2,3})(?:x\d+)?_")
_TRACE_MEMORY_SHARE = 0.5  # a traced kernel of unknown make-up: half of its time streams DRAM (assumption)


@dataclass(frozen=True)
class GpuNumbers:
    sm_count: int
    l2_bytes: float
    mem_bw: float  # achievable DRAM bytes/us (peak x mem_efficiency)
    peak_flop_per_us: float
    max_blocks_per_sm: int
    max_threads_per_sm: int


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
                max_threads_per_sm: int, mem_efficiency: float) -> GpuNumbers:
    return GpuNumbers(sm_count, float(l2_bytes), mem_bw_gb_per_s * _GB * mem_efficiency, peak_tflops * _TFLOPS,
                      max_blocks_per_sm, max_threads_per_sm)


def gemm_tile(name: str) -> tuple[int, int] | None:
    """(bm, bn) from a cuBLAS/CUTLASS kernel name (``..._gemm_bf16_256x128_ldg8_...``)."""
    if "gemm" not in name.lower():
        return None
    match = _TILE.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def compute_shape(p: dict, gpu: GpuNumbers, name: str, duration_us: float, blocks: int | None,
                  threads_per_block: int | None, blocks_per_sm: float | None, flops: float | None,
                  dram_bytes: float | None, smem_bytes: int | None, memory_op: bool) -> ComputeShape:
    threads = max(1, threads_per_block or 256)
    limit = max(1, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // threads))
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
    tile = gemm_tile(name)
    reuse = 0.0
    smem = float(smem_bytes or 0)
    if tile is not None:
        bm, bn = tile
        reuse = bm * bn / (bm + bn)
        if smem <= 0:
            smem = 3.0 * (bm + bn) * 32 * 2  # 3-stage pipeline of 32-wide BF16 k-slabs
    shape = ComputeShape(0.0, mu, tb, float(flops) / mu, gpu.peak_flop_per_us * eff / gpu.sm_count,
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
        if shape.blocks > 0:
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


def running_set_times(p: dict, gpu: GpuNumbers, shapes: list[ComputeShape], ests: list[CollectiveEstimate],
                      link_classes: list[bool]) -> list[float]:
    """Durations of the running kernels, then the running collectives, were the set fixed.

    ``link_classes[j]`` is True when collective j crosses the network: collectives on the
    same class of link share it evenly.
    """
    channels = sum(e.channels for e in ests)
    footprint = sum(e.footprint_bytes for e in ests)
    l2 = gpu.l2_bytes
    free = max(1, gpu.sm_count - channels)
    per_kernel = max(1, free // len(shapes)) if shapes else free
    l2_compute = l2 - footprint if footprint < l2 else 0.0
    net = sum(link_classes)
    intra = len(link_classes) - net
    shares = [1.0 / (net if cls else intra) for cls in link_classes]
    l2_comm = [l2 * e.footprint_bytes / footprint if footprint > l2 else l2 for e in ests]
    demand_c = sum(compute_dram_demand(p, gpu, s, per_kernel, l2_compute) for s in shapes)
    demand_k = sum(e.dram_demand(l2k, sh) for e, l2k, sh in zip(ests, l2_comm, shares))
    bw_c, bw_k = share_dram(demand_c, demand_k, gpu.mem_bw)
    bw_c_each = bw_c / len(shapes) if shapes else bw_c
    bw_k_each = bw_k / len(ests) if ests else bw_k
    out = [compute_time_us(p, gpu, s, per_kernel, l2_compute, bw_c_each) for s in shapes]
    out += [e.time_under(l2k, bw_k_each, sh) for e, l2k, sh in zip(ests, l2_comm, shares)]
    return out


def cta_wait_us(gpu: GpuNumbers, shape: ComputeShape, channels: int) -> float:
    """A collective launched while a kernel fills the GPU waits for its CTAs to find SMs:
    the share ``NC / (lambda x TB)`` of one of the kernel's waves."""
    full = gpu.sm_count * shape.tb
    if shape.blocks < full or shape.base_us <= 0:
        return 0.0
    wave_us = shape.base_us / max(1.0, shape.blocks / full)
    return wave_us * channels / full
