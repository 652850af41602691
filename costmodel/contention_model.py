"""Compute under a concurrent collective, and a collective under concurrent compute.

Pure functions over plain numbers; the adapter is :mod:`costmodel.analytic`.

Compute (the Lagom paper's Eq. 4-6, REFERENCE.md section 1). A kernel launches
``mu`` thread blocks, ``TB`` of them resident per SM, each doing ``flops/mu`` FLOPs
and moving ``D = bytes/mu`` bytes. While collectives with ``NC`` channels in total
run, each channel holds one SM, so the kernel runs in

    g = ceil(mu / ((lambda - NC) * TB))                 waves,

and one wave takes the longer of its arithmetic ``theta`` (an SM's TB blocks at the
SM's share of peak FLOP/s) and its memory time

    (lambda - NC) * TB * D' / (Bmax * efficiency - V),

where V is the collective's memory bandwidth (its memory bytes over its time,
:attr:`CollectiveEstimate.mem_bw_bytes_per_us`) and D' = D x (1 + gain x pressure)
is the block's DRAM traffic grown by L2 pressure: pressure is the collective's
in-flight bytes (channels x chunk x a fitted factor) over the L2 size, capped at 1.
The kernel's own uncontended duration anchors the result: y = y0 x model(NC, V) /
model(0, 0), so the model predicts the *slowdown* and is exact without contention.
Between phases (a collective starting or ending mid-kernel) the timeline weights
by time (Eq. 6).

Collective under compute: it needs ``V`` of memory bandwidth; compute already uses
``U`` of it. Its time grows by ``1 + sensitivity x U / (Bmax x efficiency)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

_TFLOPS = 1e12 / 1e6  # FLOP per microsecond in one TFLOP/s
_GB = 1e9 / 1e6  # bytes per microsecond in one GB/s


@dataclass(frozen=True)
class GpuNumbers:
    """What the contention model needs of the GPU (from ClusterSpec + fitted params)."""

    sm_count: int
    peak_flop_per_us: float
    mem_bw_bytes_per_us: float  # achievable: peak x fitted efficiency
    l2_bytes: float
    max_blocks_per_sm: int


@dataclass(frozen=True)
class ComputeShape:
    """Static per compute op: what Eq. 4-6 need, and its uncontended duration."""

    base_us: float  # y0: the op alone
    blocks: int  # mu; 0 = unknown grid (treated as a fluid of blocks)
    blocks_per_sm: float  # TB
    flops_per_block: float  # 0 = unknown
    bytes_per_block: float  # 0 = unknown
    raw_base: float  # model time at no contention (the anchor's denominator)


def gpu_numbers(sm_count: int, peak_tflops: float, mem_bw_gb_per_s: float, l2_bytes: float,
                max_blocks_per_sm: int, mem_efficiency: float) -> GpuNumbers:
    return GpuNumbers(sm_count, peak_tflops * _TFLOPS, mem_bw_gb_per_s * _GB * mem_efficiency,
                      float(l2_bytes), max_blocks_per_sm)


def compute_shape(gpu: GpuNumbers, base_us: float, blocks: int | None, blocks_per_sm: float | None,
                  flops: float | None, dram_bytes: float | None) -> ComputeShape:
    mu = int(blocks or 0)
    tb = float(blocks_per_sm or 1.0)
    tb = max(1e-3, min(tb, float(gpu.max_blocks_per_sm)))
    fpb = (flops or 0.0) / mu if mu else 0.0
    bpb = (dram_bytes or 0.0) / mu if mu else 0.0
    shape = ComputeShape(max(0.0, base_us), mu, tb, fpb, bpb, 1.0)
    raw = raw_compute_time(gpu, shape, 0, 0.0, 0.0, 0.0)
    return ComputeShape(shape.base_us, mu, tb, fpb, bpb, raw if raw > 0 else 1.0)


def raw_compute_time(gpu: GpuNumbers, shape: ComputeShape, channels: int, coll_mem_bw: float,
                     footprint_bytes: float, l2_miss_gain: float) -> float:
    """Model time (arbitrary units when flops are unknown) of the op under contention."""
    lam = gpu.sm_count
    free = max(1, lam - channels)
    if shape.blocks <= 0:
        return lam / free  # unknown grid: only the share of SMs matters
    per_wave = free * shape.blocks_per_sm
    waves = math.ceil(shape.blocks / per_wave)
    if shape.flops_per_block <= 0 and shape.bytes_per_block <= 0:
        return float(waves)
    theta = shape.blocks_per_sm * shape.flops_per_block * lam / gpu.peak_flop_per_us
    pressure = min(1.0, footprint_bytes / gpu.l2_bytes) if footprint_bytes > 0 else 0.0
    block_bytes = shape.bytes_per_block * (1.0 + l2_miss_gain * pressure)
    avail = max(0.05 * gpu.mem_bw_bytes_per_us, gpu.mem_bw_bytes_per_us - coll_mem_bw)
    # blocks in the average wave (the last one may be partial)
    wave_blocks = shape.blocks / waves
    mem = wave_blocks * block_bytes / avail
    return waves * max(theta, mem)


def compute_time_us(gpu: GpuNumbers, shape: ComputeShape, channels: int, coll_mem_bw: float,
                    footprint_bytes: float, l2_miss_gain: float) -> float:
    """y: the op's duration if it ran entirely under these collectives (Eq. 4-6)."""
    if channels <= 0 and coll_mem_bw <= 0 and footprint_bytes <= 0:
        return shape.base_us
    raw = raw_compute_time(gpu, shape, channels, coll_mem_bw, footprint_bytes, l2_miss_gain)
    return shape.base_us * raw / shape.raw_base


def compute_mem_bw(shape: ComputeShape, duration_us: float, l2_pressure_gain: float = 0.0) -> float:
    """U: memory bandwidth (bytes/us) the op uses when it takes ``duration_us``."""
    if duration_us <= 0 or shape.blocks <= 0:
        return 0.0
    return shape.blocks * shape.bytes_per_block * (1.0 + l2_pressure_gain) / duration_us


def collective_time_under_compute_us(gpu: GpuNumbers, alone_us: float, compute_mem_bw: float,
                                     sensitivity: float) -> float:
    """The collective's time while compute uses ``compute_mem_bw`` bytes/us of memory."""
    if compute_mem_bw <= 0:
        return alone_us
    return alone_us * (1.0 + sensitivity * compute_mem_bw / gpu.mem_bw_bytes_per_us)
