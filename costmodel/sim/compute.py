"""How long a compute kernel takes on the SMs, L2 and DRAM bandwidth a collective leaves it.

Mechanism (docs/simulator.md has the derivation):

* SMs: the kernel's ``mu`` thread blocks run in waves of ``S x TB`` (``S`` free SMs, ``TB``
  blocks resident per SM); a block's FLOPs run at the SM's share of the achievable peak.
  ``time_flops(S) = waves(S) x TB x flops_per_block / flops_per_sm_per_us``.
* DRAM: ``time_mem = dram_traffic / bandwidth_left``. For a GEMM (tile read back from its
  cuBLAS-style kernel name, ``..._256x128_...``) the traffic depends on the L2 it gets:
  with room for the wave's k-slabs (resident tiles x shared-memory tile) each operand
  panel is reused ``sqrt(tiles in the wave)`` times; without, only the short-distance reuse
  survives; linear in between. Other kernels move their ``dram_bytes``.
* The kernel takes the larger of the two (roofline) plus a fixed launch/tail overhead.
* A GEMM's precision, read from its name too (:mod:`traces.gemm_names`), sets its peak
  (BF16/FP16 tensor, TF32 half of it, FP32 on the CUDA cores) and its operand bytes.

Kernels from a trace carry no FLOPs: their uncontended duration is scaled by the wave
ratio (grid known) or by ``lambda / S`` and assumed to stream half the DRAM bandwidth.
Memory copies/sets run on the copy engines: only the DRAM share slows them.
"""

from __future__ import annotations

import math

from costmodel.cluster import GpuSpec
from costmodel.sim.memo import StateMemo
from costmodel.sim.params import SimParams
from nccl_env.errors import LagomError
from traces.gemm_names import gemm_dtype
from traces.gemm_names import gemm_tile as gemm_tile_from_name
from traces.workload import ComputeOp

_TRACE_MEMORY_FRACTION = 0.5  # a trace kernel of unknown make-up: half its time streams DRAM


class ComputeModel:
    """Per-op static data, precomputed once per (workload, GPU); :meth:`time_us` is the hot path."""

    __slots__ = ("blocks", "tb", "flops_block", "dram", "tile_reuse", "smem", "overhead", "sm_count",
                 "flops_per_sm_us", "l2_bytes", "short_reuse", "from_trace", "trace_us", "bw_full", "_memo",
                 "uncontended_us", "wave_wait_us", "copy_engine")

    def __init__(self, op: ComputeOp, gpu: GpuSpec, params: SimParams):
        self.sm_count = gpu.sm_count
        self.l2_bytes = float(gpu.l2_bytes)
        self.overhead = params.kernel_overhead_us
        self.short_reuse = params.gemm_short_reuse
        self.bw_full = gpu.mem_bw_gb_per_s * 1e3 * params.mem_efficiency  # bytes/us
        block_threads = op.block[0] * op.block[1] * op.block[2] if op.block else 256
        limit = max(1, min(gpu.max_blocks_per_sm, gpu.max_threads_per_sm // max(1, block_threads)))
        self.tb = max(1, min(limit, int(op.blocks_per_sm or 1)))
        self.blocks = op.thread_blocks or 0
        self.from_trace = op.flops is None
        self.copy_engine = op.is_memory_op  # memcpy/memset: DMA engines, no SMs; DRAM only
        self.trace_us = max(0.0, op.duration_us - self.overhead)
        self.tile_reuse = 0.0
        self.smem = float(op.shared_memory_bytes or 0)
        self.dram = float(op.dram_bytes or 0.0)
        if op.flops is None:  # from the trace
            self.flops_block = 0.0
            self.flops_per_sm_us = 1.0
        else:
            name = op.name.lower()
            eff = params.attention_efficiency if "flash" in name or "attn" in name else params.gemm_efficiency
            dtype = gemm_dtype(op.name)  # BF16 for anything that is not a GEMM of another precision
            peak = dtype.peak_rate(gpu.peak_tflops, gpu.fp32_tflops)
            if peak is None:
                raise LagomError(f"{op.name}: an FP32 GEMM needs the GPU's FP32 peak (gpu.fp32_tflops), "
                                 f"which {gpu.name} does not give")
            self.flops_per_sm_us = peak * 1e6 * eff / gpu.sm_count
            if self.blocks <= 0:
                self.blocks = gpu.sm_count * self.tb
            self.flops_block = float(op.flops) / self.blocks
            tile = gemm_tile_from_name(op.name)
            if tile is not None:
                bm, bn = tile
                # FLOP per DRAM byte a lone tile achieves: bm*bn/(bm+bn) for 2-byte operands
                self.tile_reuse = bm * bn / (bm + bn) * 2 / dtype.operand_bytes
                if self.smem <= 0:
                    self.smem = 3.0 * (bm + bn) * 32 * dtype.operand_bytes
        self._memo = StateMemo()
        self.uncontended_us = self.time_us(self.sm_count, self.l2_bytes, self.bw_full)
        # a collective launched beside this kernel waits for the current wave to retire
        full_wave = self.sm_count * self.tb
        waves = self.blocks / full_wave if full_wave else 0.0
        self.wave_wait_us = 0.5 * self.uncontended_us / waves if waves >= 1.0 else 0.0

    def _waves(self, free_sms: int) -> tuple[float, int]:
        """(waves x blocks per SM, resident tiles in a wave) on ``free_sms`` SMs."""
        mu = self.blocks
        per_sm = min(self.tb, max(1, -(-mu // free_sms)))
        waves = -(-mu // (free_sms * per_sm))
        return waves * per_sm, min(mu, free_sms * per_sm)

    def time_us(self, free_sms: int, l2_free_bytes: float, bw_bytes_per_us: float) -> float:
        """Duration if the state held for the whole kernel."""
        return self._memo.get_or((free_sms, l2_free_bytes, bw_bytes_per_us), self._time_us, free_sms, l2_free_bytes,
                                 bw_bytes_per_us)

    def _time_us(self, free_sms: int, l2_free_bytes: float, bw_bytes_per_us: float) -> float:
        free_sms = max(1, min(free_sms, self.sm_count))
        bw = max(bw_bytes_per_us, 1e-6)
        if self.from_trace:
            if self.copy_engine:
                sm_factor = 1.0
            elif self.blocks > 0:
                full, _ = self._waves(self.sm_count)
                part, _ = self._waves(free_sms)
                sm_factor = part / full
            else:
                sm_factor = self.sm_count / free_sms
            mem_factor = _TRACE_MEMORY_FRACTION * self.bw_full / bw
            return self.trace_us * max(sm_factor, mem_factor) + self.overhead
        else:
            slots, resident = self._waves(free_sms)
            t_flops = slots * self.flops_block / self.flops_per_sm_us
            traffic = self.dram
            if self.tile_reuse > 0.0:
                flops = self.flops_block * self.blocks
                wave_set = resident * self.smem
                hit = min(1.0, max(0.0, l2_free_bytes) / wave_set) if wave_set > 0 else 1.0
                reuse_hi = self.tile_reuse * math.sqrt(resident)
                reuse_lo = self.tile_reuse * self.short_reuse
                traffic = max(traffic, flops * (hit / reuse_hi + (1.0 - hit) / reuse_lo))
            return max(t_flops, traffic / bw) + self.overhead

    def dram_demand(self, free_sms: int, l2_free_bytes: float) -> float:
        """Bytes/us the kernel would pull if DRAM were not its limit (its compute-bound pace)."""
        return self._memo.get_or((free_sms, l2_free_bytes, None), self._dram_demand, free_sms, l2_free_bytes)

    def _dram_demand(self, free_sms: int, l2_free_bytes: float) -> float:
        if self.from_trace:
            return _TRACE_MEMORY_FRACTION * self.bw_full
        slots, resident = self._waves(max(1, min(free_sms, self.sm_count)))
        t_flops = slots * self.flops_block / self.flops_per_sm_us + self.overhead
        traffic = self.dram
        if self.tile_reuse > 0.0:
            flops = self.flops_block * self.blocks
            wave_set = resident * self.smem
            hit = min(1.0, max(0.0, l2_free_bytes) / wave_set) if wave_set > 0 else 1.0
            traffic = max(traffic, flops * (hit / (self.tile_reuse * math.sqrt(resident))
                                            + (1.0 - hit) / (self.tile_reuse * self.short_reuse)))
        return traffic / t_flops
