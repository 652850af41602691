"""The devices the one-GPU kit (bench/gpu_kit.py) measures: a CUDA GPU, or the simulator's GPU.

:class:`Device` is the seam: what the kit asks of a GPU. :class:`CudaDevice` asks a real
one through torch (and triton for the streaming kernel); :class:`SimDevice` answers from
the simulator's own mechanism (``costmodel.sim.compute.ComputeModel`` with a cluster's
``sim:`` constants), so the kit's measuring, fitting and writing run here, and a fit on
the simulated device must give back the simulator's own constants (tests/test_gpu_kit.py).

What is measured (docs/gpu_kit.md):

- a bf16 GEMM alone, and beside a kernel that streams memory on ``k`` CTAs (512 threads
  each, as an NCCL channel runs by default: the stand-in for ``k`` channels), beside a
  copy-engine copy, and beside both;
- the streaming kernel alone on ``k`` CTAs and on enough CTAs to fill the GPU (its DRAM
  rate); the copy's rate alone;
- a step of GEMMs timed by CUDA events and by the host clock.
"""

from __future__ import annotations

import importlib
import importlib.util
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any, Protocol

from costmodel.cluster import ClusterSpec
from costmodel.sim.compute import ComputeModel
from costmodel.sim.params import SimParams, sim_params
from nccl_env.errors import LagomError
from traces.generate import gemm_op

GEMM_SIZE = 8192  # an 8192^3 bf16 GEMM: compute-bound on every datacenter GPU, 1-10 ms
STREAM_THREADS = 512  # threads per streaming CTA: NCCL's default NTHREADS (docs/reference.md §3)
DRAM_BYTES_PER_COPIED_BYTE = 2  # a device-to-device copy reads its source once and writes its destination once
STREAM_BUFFER_BYTES = 1 << 30  # 1 GiB each way: far beyond any L2 (50 MB on H100), so the copy streams DRAM
COPY_BUFFER_BYTES = 1 << 30


@dataclass(frozen=True)
class DeviceInfo:
    """What the device says of itself."""

    name: str
    sm_count: int
    l2_bytes: int
    mem_bytes: int | None
    compute_capability: tuple[int, int] | None
    simulated: bool


@dataclass(frozen=True)
class Beside:
    """What runs beside the GEMM: the streaming kernel on ``stream_ctas`` CTAs (0: none), the copy."""

    stream_ctas: int = 0
    copy: bool = False


class Device(Protocol):
    """What the kit asks of a GPU."""

    info: DeviceInfo

    def gemm_us(self, beside: Beside) -> float:
        """One GEMM's time (mean of a batch), with ``beside`` running on other streams throughout."""
        ...

    def stream_gb_per_s(self, ctas: int) -> float:
        """The streaming kernel's copy rate alone on ``ctas`` CTAs (bytes copied, GB/s)."""
        ...

    def copy_gb_per_s(self) -> float:
        """The copy-engine copy's rate alone (bytes copied, GB/s)."""
        ...

    def clock_pairs(self, steps: int) -> list[tuple[float, float]]:
        """Per step of GEMMs: (CUDA-event time, host time), microseconds."""
        ...


def gemm_flops() -> float:
    return 2.0 * GEMM_SIZE ** 3


# ---- the simulator's GPU ------------------------------------------------------------------
class SimDevice:
    """The GPU of ``cluster`` as the simulator models it. The streaming kernel's CTA copies at the
    simulator's per-channel rate (``sim.simple_bw_per_channel_gb_per_s``) and holds one SM; the
    copy engine holds no SM and copies at the cluster's copy-engine rate, capped by DRAM; both
    take their DRAM bytes from the GEMM's bandwidth, as a collective does in the simulator (the
    streaming CTAs at most their SMs' share of it: k of the SMs, k / SMs of DRAM)."""

    def __init__(self, cluster: ClusterSpec, seed: int = 0):
        self.cluster = cluster
        self.params: SimParams = sim_params(cluster)
        gpu = cluster.gpu
        self.info = DeviceInfo(gpu.name, gpu.sm_count, gpu.l2_bytes, None, None, True)
        self._model = ComputeModel(gemm_op("kit", GEMM_SIZE, GEMM_SIZE, GEMM_SIZE), gpu, self.params)
        self._dram = gpu.mem_bw_gb_per_s * 1e3 * self.params.mem_efficiency  # DRAM bytes/us the GPU reaches
        self._per_cta = self.params.simple_bw_per_channel_gb_per_s * 1e3 * DRAM_BYTES_PER_COPIED_BYTE
        self._copy = min(cluster.intra_node.copy_engine_bw, self._dram / 1e3 / DRAM_BYTES_PER_COPIED_BYTE)
        self._rng = random.Random(seed)

    def _stream_dram(self, ctas: int) -> float:
        return min(ctas * self._per_cta, self._dram)

    def gemm_us(self, beside: Beside) -> float:
        # beside a GEMM on every other SM, the streaming CTAs get at most their SMs' share of DRAM
        demand = min(self._stream_dram(beside.stream_ctas), self._dram * beside.stream_ctas / self.info.sm_count)
        if beside.copy:
            demand += self._copy * 1e3 * DRAM_BYTES_PER_COPIED_BYTE
        left = max(self._dram * 0.05, self._dram - demand)  # a kernel is never starved outright
        return self._model.time_us(self.info.sm_count - beside.stream_ctas, float(self.info.l2_bytes), left)

    def stream_gb_per_s(self, ctas: int) -> float:
        return self._stream_dram(ctas) / 1e3 / DRAM_BYTES_PER_COPIED_BYTE

    def copy_gb_per_s(self) -> float:
        return self._copy

    def clock_pairs(self, steps: int) -> list[tuple[float, float]]:
        """The host clock sees the step plus the launch of its first kernel and a jitter of a few us."""
        step = 10 * self.gemm_us(Beside())
        return [(step, step + self.params.launch_us + self._rng.uniform(0.0, 3.0)) for _ in range(steps)]


# ---- a real GPU -----------------------------------------------------------------------------
def cuda_missing() -> str | None:
    """Why no CUDA device can be measured here, or None when one can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


class CudaDevice:
    """GPU 0 through torch. The streaming kernel is a triton kernel launched on exactly ``k`` programs
    (CTAs) of 16 warps, each looping over its share of a 1 GiB buffer (torch offers no kernel whose
    grid a caller sets, and without nvcc no CUDA kernel can be compiled; triton ships with torch's
    CUDA wheels). The copy is ``Tensor.copy_`` between two contiguous 1 GiB device buffers: ATen
    issues it as ``cudaMemcpyAsync`` device-to-device, which the driver runs on a copy engine
    (docs/gpu_kit.md says how to check that in a profile)."""

    def __init__(self, repeats: int = 20):
        import torch

        if importlib.util.find_spec("triton") is None:
            raise LagomError("the k-CTA streaming kernel needs triton, which torch's CUDA wheels ship; "
                             "pip install triton")
        self.torch = torch
        self.repeats = repeats
        props = torch.cuda.get_device_properties(0)
        self.info = DeviceInfo(props.name, props.multi_processor_count, int(getattr(props, "L2_cache_size", 0)),
                               int(props.total_memory), (props.major, props.minor), False)
        n = GEMM_SIZE
        self.a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        self.src = torch.empty(STREAM_BUFFER_BYTES // 4, device="cuda", dtype=torch.float32)
        self.dst = torch.empty_like(self.src)
        self.csrc = torch.empty(COPY_BUFFER_BYTES // 4, device="cuda", dtype=torch.float32)
        self.cdst = torch.empty_like(self.csrc)
        self.side = torch.cuda.Stream()
        self.copy_stream = torch.cuda.Stream()
        self._kernel = _stream_kernel()
        self._launch_stream(1, 1)  # compile once, outside any timing
        torch.cuda.synchronize()

    def _launch_stream(self, ctas: int, passes: int) -> None:
        n = self.src.numel()
        self._kernel[(ctas,)](self.src, self.dst, n, passes, BLOCK=4096, num_warps=STREAM_THREADS // 32)

    def _timed(self, fn: Any, stream: Any) -> float:
        """Microseconds ``fn`` takes on ``stream`` (CUDA events)."""
        torch = self.torch
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            fn()
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3

    def _gemms(self, count: int) -> None:
        for _ in range(count):
            self.a @ self.b

    def gemm_us(self, beside: Beside) -> float:
        torch = self.torch
        main = torch.cuda.current_stream()
        alone = self._timed(lambda: self._gemms(self.repeats), main) / self.repeats
        if beside == Beside():
            return alone
        batch_us = alone * self.repeats
        if beside.stream_ctas:  # enough passes to outlast the GEMMs by half again
            rate = self.stream_gb_per_s(beside.stream_ctas) * 1e3  # bytes/us
            passes = max(1, int(1.5 * batch_us * rate / STREAM_BUFFER_BYTES) + 1)
            with torch.cuda.stream(self.side):
                self._launch_stream(beside.stream_ctas, passes)
        if beside.copy:
            copies = max(1, int(1.5 * batch_us * self.copy_gb_per_s() * 1e3 / COPY_BUFFER_BYTES) + 1)
            with torch.cuda.stream(self.copy_stream):
                for _ in range(copies):
                    self.cdst.copy_(self.csrc, non_blocking=True)
        beside_us = self._timed(lambda: self._gemms(self.repeats), main) / self.repeats
        torch.cuda.synchronize()
        return beside_us

    def stream_gb_per_s(self, ctas: int) -> float:
        us = self._timed(lambda: self._launch_stream(ctas, 1), self.side)
        return STREAM_BUFFER_BYTES / us / 1e3

    def copy_gb_per_s(self) -> float:
        us = self._timed(lambda: self.cdst.copy_(self.csrc, non_blocking=True), self.copy_stream)
        return COPY_BUFFER_BYTES / us / 1e3

    def clock_pairs(self, steps: int) -> list[tuple[float, float]]:
        torch = self.torch
        pairs = []
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            self._gemms(10)
            end.record()
            end.synchronize()
            host_us = (time.perf_counter() - t0) * 1e6
            pairs.append((start.elapsed_time(end) * 1e3, host_us))
        return pairs


def _stream_kernel() -> Any:
    """The triton streaming kernel (bench/gpu_kit_triton.py)."""
    return importlib.import_module("gpu_kit_triton").stream_copy


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
