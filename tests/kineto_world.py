"""Paired Kineto traces from a small world of CUDA's and PyTorch's rules (issue 17, item 3).

One program is run twice: the second run has every collective's GPU time (``comm``),
every compute kernel's (``compute``) or every CPU gap between calls (``cpu``) times a
factor. The truth of each run comes from this module's own event simulation, never
from reading its trace back, and this module imports nothing of Lagom, so a replay can
be judged against it.

The world (nothing else is modelled: no contention between streams, no peers' skew,
no launch-queue back-pressure; a program that would fill the launch queue is refused):

- A CPU thread runs its actions in order; the CPU's own time lies between its calls.
  A launch call returns after its own time, before the GPU op runs.
- A GPU op starts at the latest of its launch call's start + launch latency, the end of
  everything enqueued on its stream before it, and the end of what every event its
  stream waited on recorded (``cudaEventRecord``: what was enqueued on the recording
  stream so far; ``cudaStreamWaitEvent``: later work on the waiting stream waits for it).
- ``cudaStreamSynchronize`` / ``cudaEventSynchronize`` / ``cudaDeviceSynchronize`` and a
  copy to pageable memory return a few us after what they wait for has ended; every
  later action of the thread moves with them.
- ``loss.backward()`` hands the backward pass to the autograd thread and blocks until it
  is done; nothing in the trace marks it (``fwdbwd`` flows link forward to backward ops).
- Step N's time is the GPU's period: from the start of the first GPU op launched inside
  ``ProfilerStep#N`` (any thread) to that of ``ProfilerStep#N+1``.

Kineto records CPU events that start and end inside the profiled window and GPU ops
and sync records that do (its out-of-range rule); a launch call before the window is
absent, its GPU op present. The window runs from the first profiled ``ProfilerStep``
to the profiler's stop, which synchronizes the device as ``torch.profiler`` does. The
warm-up steps before it ran with the same factors, so the GPU's backlog at the window's
start (orphan ops: recorded, launched before the window) differs between the two runs.

Use: ``paired(program, folder, comm=F)`` -> (first trace, second trace, :class:`PairTruth`);
``simulate`` -> :class:`Schedule`, ``truth(schedule)`` -> :class:`RunTruth`,
``write_trace(schedule, path)``; ``verdict(pair_truth, predicted_steps_us)`` judges a
prediction of the second run. ``SCENARIOS`` and ``WHATIF_GRID`` are what
tests/test_whatif_pairs.py and bench/whatif_accuracy.py run.
"""

from __future__ import annotations

import enum
import gzip
import json
import math
import random
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

PID, MAIN, AUTOGRAD = 3100, 3100, 3177  # process, main thread, autograd engine's device thread
COMPUTE, NCCL = 7, 39  # streams
BASE_NS = 1_717_000_000_000_000_000  # baseTimeNanoseconds; ts are us after it
T0_US = 1_000_000.0  # where the simulation's clock starts, in trace time
QUEUE_LIMIT = 1000  # pending launches beyond which real CUDA would block the launching thread
SMS = 108
A100 = {"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_097_971_712, "computeMajor": 8,
        "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536,
        "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": SMS, "regsPerMultiprocessor": 65536,
        "sharedMemPerBlockOptin": 166912, "sharedMemPerMultiprocessor": 167936}  # CUDA deviceQuery, A100 80 GB
NCCL_VERSION = "2.21.5"
# CUPTI's callback id of each runtime call (as the shared traces carry them)
CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cudaMemcpyAsync": 41, "cudaEventRecord": 135,
        "cudaStreamWaitEvent": 147, "cudaStreamSynchronize": 131, "cudaEventSynchronize": 137,
        "cudaDeviceSynchronize": 165}


class Sync(enum.Enum):
    """Where a step blocks its main thread on the GPU."""

    NONE = "none"  # never inside the window (the CPU runs ahead until the profiler's stop)
    ITEM = "item"  # loss.item() after the forward: copy to pageable memory + cudaStreamSynchronize
    END = "end"  # loss.item() after the optimizer: the step drains the GPU
    LAGGED = "lagged"  # loss copied to pinned memory, event recorded; step N waits on step N-1's event


@dataclass(frozen=True)
class Program:
    """An FSDP-like step: per layer a prefetched all-gather ahead of the forward, in the
    backward a re-gather and a reduce-scatter, an optimizer on the main thread. Times are
    mean durations (each instance jittered); GEMM shapes scale from ``gemm_us``."""

    name: str
    layers: int = 4
    launch_threads: int = 2  # 1: the backward is launched on the main thread too
    sync: Sync = Sync.ITEM
    cuda_sync_events: bool = True  # Kineto's enable_cuda_sync_events
    gemm_us: float = 300.0
    attention_us: float = 220.0
    elementwise_us: float = 40.0
    all_gather_us: float = 250.0  # at 2 channels
    reduce_scatter_us: float = 300.0
    cpu_op_us: float = 20.0  # the CPU's own time per framework op
    layer_params: int = 8 << 20  # bf16 elements per layer: the all-gather's output, the reduce-scatter's input
    world_size: int = 8
    warmup_steps: int = 3
    steps: int = 6  # profiled ProfilerStep annotations (steps - 1 complete steps)
    jitter: float = 0.03  # log-normal sigma of GPU durations (CPU times: 5x)


_COMM_HEAVY = Program("comm_heavy", gemm_us=150, attention_us=110, elementwise_us=20, all_gather_us=700,
                      reduce_scatter_us=800)  # 16 MiB collectives at 2 channels, exposed
_SHORT_KERNELS = Program("short_kernels", sync=Sync.END, gemm_us=40, attention_us=30, elementwise_us=8,
                         all_gather_us=400, reduce_scatter_us=500, cpu_op_us=120)
SCENARIOS: dict[str, Program] = {p.name: p for p in (
    # CPU far ahead of the GPU: a lagged loss read keeps it about a step ahead, or nothing holds it back
    Program("cpu_ahead", sync=Sync.LAGGED),
    Program("cpu_ahead_nosync", sync=Sync.NONE, cuda_sync_events=False, warmup_steps=2),
    # the issue's table: GPU-bound, collectives at 2 channels exposed, loss.item() after the forward
    replace(_COMM_HEAVY, name="comm_bound", cpu_op_us=15),
    replace(_COMM_HEAVY, name="comm_bound_1thread", cpu_op_us=15, launch_threads=1),
    # mixed: the same GPU work with a slower CPU; faster collectives leave the forward CPU-paced
    replace(_COMM_HEAVY, name="mixed", cpu_op_us=90),
    replace(_COMM_HEAVY, name="mixed_1thread", cpu_op_us=90, launch_threads=1),
    replace(_COMM_HEAVY, name="mixed_nosync_events", cpu_op_us=90, cuda_sync_events=False),
    # CPU-paced: short kernels, slow Python; the GPU idles between launches
    replace(_SHORT_KERNELS, name="cpu_paced"),
    replace(_SHORT_KERNELS, name="cpu_paced_1thread", launch_threads=1, cuda_sync_events=False),
)}


@dataclass(frozen=True)
class WhatIf:
    scenario: str
    comm: float = 1.0
    compute: float = 1.0

    @property
    def label(self) -> str:
        knob, f = ("comm", self.comm) if self.compute == 1.0 else ("compute", self.compute)
        return f"{self.scenario} {knob} x{f:g}"

    @property
    def scale_arg(self) -> str:
        return f"comm={self.comm:g}" if self.compute == 1.0 else f"compute={self.compute:g}"


WHATIF_GRID: tuple[WhatIf, ...] = (
    WhatIf("comm_bound", comm=0.63), WhatIf("comm_bound", comm=3.6), WhatIf("comm_bound_1thread", comm=0.63),
    WhatIf("mixed", comm=0.63), WhatIf("mixed", comm=2.0), WhatIf("mixed_1thread", comm=0.63),
    WhatIf("mixed_nosync_events", comm=0.5),
    WhatIf("cpu_ahead", comm=0.5), WhatIf("cpu_ahead", comm=1.6), WhatIf("cpu_ahead_nosync", comm=0.63),
    WhatIf("cpu_paced", comm=0.5), WhatIf("cpu_paced", comm=3.6), WhatIf("cpu_paced_1thread", comm=2.0),
    WhatIf("comm_bound", compute=0.5), WhatIf("cpu_ahead", compute=1.6),
)


# --- kernels: what PyTorch 2.x on an A100 launches (names, launch shapes) ---------------------------------

@dataclass(frozen=True)
class Kernel:
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int = 128
    shared_memory: int = 0


GEMM = Kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_stage3_warpsize2x4x1_tensor16x8x16_kernel",
              (16, 24, 1), (256, 1, 1), 232, 98304)
FLASH_FWD = Kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
                   "cutlass::bfloat16_t>, false, true, false, false, false>(pytorch_flash::Flash_fwd_params)",
                   (16, 32, 8), (128, 1, 1), 255, 49152)
FLASH_BWD = Kernel("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, "
                   "128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, false, false, false, false>"
                   "(pytorch_flash::Flash_bwd_params)", (16, 32, 8), (256, 1, 1), 255, 147456)
GELU = Kernel("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl("
              "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::"
              "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)",
              (65536, 1, 1), (128, 1, 1), 24)
FILL = Kernel("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
              "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
              (1, 1, 1), (128, 1, 1), 16)
SOFTMAX = Kernel("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
                 "(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", (8192, 1, 1),
                 (512, 1, 1), 40)
ADAM = Kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
              "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
              "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, double, bool, float*, "
              "float*>(...)", (320, 1, 1), (512, 1, 1), 60)
# NCCL 2.19+ names (2.21 keeps the launch-argument signature of 2.19); grid = channels, block = threads
ALL_GATHER = Kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", (2, 1, 1),
                    (512, 1, 1), 96, 87568)
REDUCE_SCATTER = Kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                        (2, 1, 1), (512, 1, 1), 96, 87568)


# --- actions: what a thread does, built once per (program, seed) ----------------------------------------

@dataclass
class GpuWork:
    kernel: Kernel | None  # None: a memcpy
    dur_us: float
    comm_args: dict | None = None  # a collective's metadata (on its record_param_comms too)
    copy: str = ""  # a memcpy's name, e.g. "Memcpy DtoH (Device -> Pageable)"
    copy_bytes: int = 0


Kind = Literal["cpu", "begin", "end", "launch", "record", "wait", "sync", "signal", "await"]


@dataclass
class Action:
    kind: Kind
    us: float = 0.0  # cpu: own time; launch/record/wait/sync: the call's own time; await: wake-up
    name: str = ""  # begin: span name; launch: runtime call name; sync: cudaXSynchronize
    cat: str = "cpu_op"  # begin: cpu_op | user_annotation
    args: dict | None = None  # begin: span args
    flow: tuple[str, int] | None = None  # begin: ("s" | "f", fwdbwd id)
    stream: int = COMPUTE
    event: str = ""  # record / wait / event sync: the event's key; signal / await: the hand-over's key
    work: GpuWork | None = None
    latency_us: float = 0.0  # launch: call start -> earliest GPU start
    blocking: bool = False  # launch of a copy to pageable memory; sync: waits
    return_us: float = 0.0  # blocking call: awaited end -> return


class _Builder:
    """Builds each thread's actions for every step; all randomness is drawn here, once."""

    def __init__(self, p: Program, seed: int) -> None:
        self.p = p
        self.rng = random.Random(seed)
        self.threads: dict[int, list[Action]] = {MAIN: [], AUTOGRAD: []}
        self.seq = 0  # autograd sequence numbers / fwdbwd flow ids
        self.collectives = 0

    def _j(self, mean: float, sigma: float) -> float:
        return mean * math.exp(self.rng.gauss(0.0, sigma) - sigma * sigma / 2)

    def cpu(self, t: int, share: float = 1.0) -> None:
        self.threads[t].append(Action("cpu", us=self._j(self.p.cpu_op_us * share, 5 * self.p.jitter)))

    @contextmanager
    def op(self, t: int, name: str, cat: str = "cpu_op", args: dict | None = None,
           flow: tuple[str, int] | None = None, share: float = 0.7) -> Iterator[None]:
        self.cpu(t, share)
        self.threads[t].append(Action("begin", name=name, cat=cat, args=args, flow=flow))
        yield
        self.cpu(t, 0.3 * share)
        self.threads[t].append(Action("end"))

    def launch(self, t: int, kernel: Kernel, mean_us: float, stream: int = COMPUTE, comm: dict | None = None) -> None:
        work = GpuWork(kernel, self._j(mean_us, self.p.jitter), comm)
        call = "cudaLaunchKernelExC" if comm else "cudaLaunchKernel"
        self.threads[t].append(Action("launch", us=self._j(5.0, 0.2), name=call, stream=stream, work=work,
                                      latency_us=self._j(8.0 if comm else 6.0, 0.2)))  # A100 launch: a few us

    def copy(self, t: int, name: str, nbytes: int, blocking: bool) -> None:
        work = GpuWork(None, self._j(2.0 + nbytes / 2e4, self.p.jitter), copy=name, copy_bytes=nbytes)
        self.threads[t].append(Action("launch", us=self._j(8.0, 0.2), name="cudaMemcpyAsync", work=work,
                                      latency_us=self._j(6.0, 0.2), blocking=blocking, return_us=self._j(4.0, 0.2)))

    def record(self, t: int, event: str, stream: int) -> None:
        self.threads[t].append(Action("record", us=self._j(1.5, 0.2), name="cudaEventRecord", event=event,
                                      stream=stream))

    def wait(self, t: int, stream: int, event: str) -> None:
        self.threads[t].append(Action("wait", us=self._j(1.5, 0.2), name="cudaStreamWaitEvent", stream=stream,
                                      event=event))

    def sync(self, t: int, name: str, stream: int = -1, event: str = "") -> None:
        self.threads[t].append(Action("sync", us=self._j(3.0, 0.2), name=name, stream=stream, event=event,
                                      blocking=True, return_us=self._j(4.0, 0.2)))

    # --- PyTorch pieces ---

    def collective(self, t: int, key: str, gather: bool) -> None:
        """c10d's all-gather / reduce-scatter: the NCCL stream waits for the current one,
        the kernel, then an event other streams wait on (``key``)."""
        p = self.p
        self.collectives += 1
        shard = p.layer_params // p.world_size
        ranks = list(range(p.world_size))
        meta = {"Collective name": "_allgather_base" if gather else "_reduce_scatter_base",
                "In msg nelems": shard if gather else p.layer_params,
                "Out msg nelems": p.layer_params if gather else shard, "Group size": p.world_size,
                "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]", "Process Group Name": "0",
                "Process Group Description": "default_pg", "Process Group Ranks": str(ranks),
                "Seq": self.collectives}
        call = "c10d::_allgather_base_" if gather else "c10d::_reduce_scatter_base_"
        with self.op(t, call), self.op(t, "record_param_comms", args=meta, share=0.3):
            self.record(t, key + ".in", COMPUTE)
            self.wait(t, NCCL, key + ".in")
            with self.op(t, "nccl:_all_gather_base" if gather else "nccl:_reduce_scatter_base",
                         cat="user_annotation", share=0.2):
                self.launch(t, ALL_GATHER if gather else REDUCE_SCATTER,
                            p.all_gather_us if gather else p.reduce_scatter_us, NCCL, meta)
            self.record(t, key, NCCL)

    def unshard(self, t: int, key: str, layer: int, prefetch: int | None, first: bool | None = None) -> None:
        """FSDP's pre-forward / pre-backward: all-gather this layer unless prefetched, make
        the current stream wait for it, then prefetch the next layer's (that order: FSDP1)."""
        if layer == 0 if first is None else first:
            self.collective(t, f"{key}{layer}", gather=True)
        self.wait(t, COMPUTE, f"{key}{layer}")
        if prefetch is not None:
            self.collective(t, f"{key}{prefetch}", gather=True)

    def forward_op(self, t: int, name: str, kernel: Kernel, us: float, inner: str = "") -> int:
        """A differentiable op: its sequence number links it to its backward (a fwdbwd flow)."""
        self.seq += 1
        with self.op(t, name, flow=("s", self.seq), args={"Sequence number": self.seq, "Fwd thread id": 0}):
            if inner:
                with self.op(t, inner, share=0.4):
                    self.launch(t, kernel, us)
            else:
                self.launch(t, kernel, us)
        return self.seq

    def backward_op(self, t: int, fn: str, seq: int, kernels: list[tuple[str, Kernel, float]]) -> None:
        with self.op(t, f"autograd::engine::evaluate_function: {fn}", share=0.3), \
                self.op(t, fn, flow=("f", seq), args={"Sequence number": seq, "Fwd thread id": 1}, share=0.4):
            for inner, kernel, us in kernels:
                with self.op(t, inner, share=0.5):
                    self.launch(t, kernel, us)

    def step(self, n: int) -> None:
        p, m = self.p, MAIN
        b = AUTOGRAD if p.launch_threads == 2 else MAIN
        gemm = p.gemm_us
        self.threads[m].append(Action("begin", name=f"ProfilerStep#{n}", cat="user_annotation"))
        with self.op(m, "Optimizer.zero_grad#AdamW.zero_grad", cat="user_annotation"):
            pass
        with self.op(m, "aten::to"), self.op(m, "aten::copy_", share=0.4):
            self.copy(m, "Memcpy HtoD (Pinned -> Device)", 65536, blocking=False)
        seqs: list[list[int]] = []
        with self.op(m, "FullyShardedDataParallel.forward", cat="user_annotation", share=0.3):
            for i in range(p.layers):
                with self.op(m, "FullyShardedDataParallel._pre_forward", cat="user_annotation", share=0.3):
                    self.unshard(m, f"{n}.fag", i, i + 1 if i + 1 < p.layers else None)
                qkv = self.forward_op(m, "aten::linear", GEMM, gemm, "aten::addmm")
                attn = self.forward_op(m, "aten::_scaled_dot_product_flash_attention", FLASH_FWD, p.attention_us)
                out = self.forward_op(m, "aten::linear", GEMM, 0.5 * gemm, "aten::addmm")
                mlp = self.forward_op(m, "aten::linear", GEMM, 1.5 * gemm, "aten::addmm")
                gelu = self.forward_op(m, "aten::gelu", GELU, p.elementwise_us)
                seqs.append([qkv, attn, out, mlp, gelu])
        loss = self.forward_op(m, "aten::cross_entropy_loss", SOFTMAX, p.elementwise_us, "aten::_log_softmax")
        if p.sync is Sync.ITEM:
            self.item(m)
        with self.op(m, "aten::ones_like"), self.op(m, "aten::fill_", share=0.4):
            self.launch(m, FILL, 2.0)
        if b != m:  # loss.backward(): the main thread is silent until the autograd thread is done
            self.threads[m].append(Action("signal", event=f"{n}.bwd"))
            self.threads[b].append(Action("await", event=f"{n}.bwd", us=self._j(20.0, 0.3)))
        self.backward_op(b, "NllLossBackward0", loss, [("aten::nll_loss_backward", SOFTMAX, p.elementwise_us)])
        for i in reversed(range(p.layers)):
            with self.op(b, "FullyShardedDataParallel._pre_backward_hook", cat="user_annotation", share=0.3):
                self.unshard(b, f"{n}.bag", i, i - 1 if i > 0 else None, first=i == p.layers - 1)
            qkv, attn, out, mlp, gelu = seqs[i]
            mm = "aten::mm"
            self.backward_op(b, "GeluBackward0", gelu, [("aten::gelu_backward", GELU, p.elementwise_us)])
            self.backward_op(b, "AddmmBackward0", mlp, [(mm, GEMM, 1.5 * gemm), (mm, GEMM, 1.5 * gemm)])
            self.backward_op(b, "AddmmBackward0", out, [(mm, GEMM, 0.5 * gemm), (mm, GEMM, 0.5 * gemm)])
            self.backward_op(b, "ScaledDotProductFlashAttentionBackward0", attn,
                             [("aten::_scaled_dot_product_flash_attention_backward", FLASH_BWD, 2 * p.attention_us)])
            self.backward_op(b, "AddmmBackward0", qkv, [(mm, GEMM, gemm), (mm, GEMM, gemm)])
            with self.op(b, "FullyShardedDataParallel._post_backward_hook", cat="user_annotation", share=0.3):
                self.collective(b, f"{n}.rs{i}", gather=False)
        with self.op(b, "FullyShardedDataParallel._post_backward_final_callback", cat="user_annotation"):
            self.wait(b, COMPUTE, f"{n}.rs0")
        if b != m:
            self.threads[b].append(Action("signal", event=f"{n}.bwd.done"))
            self.threads[m].append(Action("await", event=f"{n}.bwd.done", us=self._j(15.0, 0.3)))
        with self.op(m, "Optimizer.step#AdamW.step", cat="user_annotation"):
            for _ in range(3):
                with self.op(m, "aten::_fused_adamw_"):
                    self.launch(m, ADAM, 2 * p.elementwise_us)
        if p.sync is Sync.END:
            self.item(m)
        elif p.sync is Sync.LAGGED:
            with self.op(m, "aten::to"), self.op(m, "aten::copy_", share=0.4):
                self.copy(m, "Memcpy DtoH (Device -> Pinned)", 4, blocking=False)
            self.record(m, f"{n}.loss", COMPUTE)
            if n > 0:
                self.sync(m, "cudaEventSynchronize", event=f"{n - 1}.loss")
        self.cpu(m)
        self.threads[m].append(Action("end"))

    def item(self, t: int) -> None:
        """loss.item(): a copy to pageable memory (returns when it has ended), then a stream sync."""
        with self.op(t, "aten::item"), self.op(t, "aten::_local_scalar_dense", share=0.4):
            self.copy(t, "Memcpy DtoH (Device -> Pageable)", 4, blocking=True)
            self.sync(t, "cudaStreamSynchronize", stream=COMPUTE)


def build(p: Program, seed: int) -> dict[int, list[Action]]:
    """Every thread's actions: the warm-up steps, the profiled ones, the profiler's stop."""
    b = _Builder(p, seed)
    for n in range(p.warmup_steps + p.steps):
        b.step(n)
    b.cpu(MAIN)
    b.sync(MAIN, "cudaDeviceSynchronize")  # torch.profiler's stop synchronizes the device
    return b.threads


# --- the simulation ------------------------------------------------------------------------------------

@dataclass
class GpuOp:
    corr: int
    work: GpuWork
    stream: int
    call_us: float  # its launch call's start
    start_us: float
    end_us: float
    bound: str  # which term of the start rule set its start: launch | stream | event

    @property
    def is_comm(self) -> bool:
        return self.work.comm_args is not None


@dataclass
class Call:
    thread: int
    name: str
    start_us: float
    end_us: float
    corr: int
    span: Span | None  # the innermost enclosing cpu_op
    op: GpuOp | None = None
    sync: dict | None = None  # the cuda_sync record's args, if CUPTI makes one
    awaited_us: float | None = None  # a blocking call: when what it waited for ended


@dataclass
class Span:
    thread: int
    name: str
    cat: str
    start_us: float
    args: dict | None
    flow: tuple[str, int] | None
    end_us: float = math.nan


@dataclass
class Schedule:
    """One run of a program: everything that happened, in simulation time (us)."""

    program: Program
    ops: list[GpuOp] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    window: tuple[float, float] = (0.0, 0.0)  # what the profiler recorded

    def steps(self) -> list[Span]:
        """The profiled ProfilerStep annotations, in order."""
        marks = [s for s in self.spans if s.name.startswith("ProfilerStep#")]
        return marks[self.program.warmup_steps:]


def simulate(p: Program, comm: float = 1.0, compute: float = 1.0, cpu: float = 1.0, seed: int = 0) -> Schedule:
    """Run the program once: collectives' GPU time x ``comm``, compute kernels' x ``compute``,
    the CPU's own time between calls x ``cpu``."""
    threads = build(p, seed)
    out = Schedule(p)
    now = dict.fromkeys(threads, 0.0)
    pc = dict.fromkeys(threads, 0)
    stack: dict[int, list[Span]] = {t: [] for t in threads}
    tail: dict[int, float] = {}  # stream -> when everything enqueued on it so far has ended
    tail_why: dict[int, str] = {}
    events: dict[str, tuple[float, int, int]] = {}  # key -> (time, stream, record call's correlation)
    signals: dict[str, float] = {}
    corr = 0

    def runnable(t: int) -> bool:
        if pc[t] >= len(threads[t]):
            return False
        a = threads[t][pc[t]]
        return a.kind != "await" or a.event in signals

    while True:
        ready = [t for t in threads if runnable(t)]
        if not ready:
            break
        t = min(ready, key=lambda x: (now[x], x))
        a = threads[t][pc[t]]
        pc[t] += 1
        at = now[t]
        if a.kind == "cpu":
            now[t] = at + a.us * cpu
        elif a.kind == "begin":
            span = Span(t, a.name, a.cat, at, a.args, a.flow)
            stack[t].append(span)
            out.spans.append(span)
        elif a.kind == "end":
            stack[t].pop().end_us = at
        elif a.kind == "signal":
            signals[a.event] = at
        elif a.kind == "await":
            now[t] = max(at, signals[a.event]) + a.us
        else:  # a runtime call
            corr += 1
            owner = next((s for s in reversed(stack[t]) if s.cat == "cpu_op"), None)
            call = Call(t, a.name, at, at + a.us, corr, owner)
            s = a.stream
            if a.kind == "launch":
                assert a.work is not None
                w = a.work
                factor = (comm if w.comm_args is not None else compute) if w.kernel is not None else 1.0
                earliest = at + a.latency_us
                start = max(earliest, tail.get(s, 0.0))
                bound = "launch" if earliest >= tail.get(s, 0.0) else tail_why[s]
                op = GpuOp(corr, w, s, at, start, start + w.dur_us * factor, bound)
                tail[s], tail_why[s] = op.end_us, "stream"
                out.ops.append(op)
                call.op = op
                if a.blocking:
                    call.awaited_us = op.end_us
            elif a.kind == "record":
                events[a.event] = (tail.get(s, 0.0), s, corr)
            elif a.kind == "wait":
                done, producer, record_corr = events[a.event]
                if done > tail.get(s, 0.0):
                    tail[s], tail_why[s] = done, "event"
                call.sync = {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": producer,
                             "wait_on_cuda_event_record_corr_id": record_corr, "stream": s}
            elif a.name == "cudaStreamSynchronize":
                call.awaited_us = tail.get(s, 0.0)
                call.sync = {"cuda_sync_kind": "Stream Sync", "stream": s}
            elif a.name == "cudaEventSynchronize":
                done, producer, record_corr = events[a.event]
                call.awaited_us = done
                call.sync = {"cuda_sync_kind": "Event Sync", "wait_on_stream": producer,
                             "wait_on_cuda_event_record_corr_id": record_corr, "stream": -1}
            else:  # cudaDeviceSynchronize
                call.awaited_us = max(tail.values(), default=0.0)
                call.sync = {"cuda_sync_kind": "Context Sync", "stream": -1}
            if call.awaited_us is not None:
                call.end_us = max(call.end_us, call.awaited_us + a.return_us)
            out.calls.append(call)
            now[t] = call.end_us
    if any(pc[t] < len(threads[t]) for t in threads):
        raise ValueError(f"{p.name}: a thread waits for a hand-over that never comes")
    _check_queue(out)
    stop = [c for c in out.calls if c.thread == MAIN][-1]  # the profiler's cudaDeviceSynchronize
    out.window = (out.steps()[0].start_us, stop.end_us + 2.0)
    return out


def _check_queue(s: Schedule) -> None:
    """Refuse a program whose launches would have filled CUDA's launch queue (not modelled)."""
    points = sorted([(op.call_us, 1) for op in s.ops] + [(op.start_us, -1) for op in s.ops])
    pending = 0
    for _, d in points:
        pending += d
        if pending > QUEUE_LIMIT:
            raise ValueError(f"{s.program.name}: over {QUEUE_LIMIT} launches pending; the CPU runs too far ahead")


# --- the truth ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTruth:
    name: str
    iteration_us: float  # the GPU's period
    comm_us: float  # merged time of the collectives launched in the step
    exposed_comm_us: float  # the part of it no compute kernel overlaps


@dataclass(frozen=True)
class RunTruth:
    steps: tuple[StepTruth, ...]
    gpu_busy_pct: float  # merged GPU op time over the complete steps' span
    launch_bound_pct: float  # share of the steps' GPU ops whose start their launch set

    @property
    def mean_iteration_us(self) -> float:
        return sum(s.iteration_us for s in self.steps) / len(self.steps)


@dataclass(frozen=True)
class PairTruth:
    first: RunTruth
    second: RunTruth

    @property
    def change(self) -> float:
        """The mean step's relative change, second run against the first."""
        return self.second.mean_iteration_us / self.first.mean_iteration_us - 1.0


# What a replay's prediction of the second run must meet (issue 17): the median step within
# 2%, the mean step's change within 15% of the true change; a true change under 0.2% of the
# step is nil, and a prediction within 0.2% of the step then counts as nil too.
MAX_MEDIAN_STEP_ERROR = 0.02
CHANGE_TOLERANCE = 0.15
NIL_CHANGE = 0.002


@dataclass(frozen=True)
class Verdict:
    median_step_error: float
    predicted_change: float
    true_change: float

    @property
    def change_ok(self) -> bool:
        allowed = max(CHANGE_TOLERANCE * abs(self.true_change), NIL_CHANGE)
        return abs(self.predicted_change - self.true_change) <= allowed

    @property
    def passed(self) -> bool:
        return self.median_step_error <= MAX_MEDIAN_STEP_ERROR and self.change_ok


def verdict(truth: PairTruth, predicted_us: list[float]) -> Verdict:
    """A prediction of the second run's steps (in ``truth.second.steps``' order) judged."""
    errors = [abs(p - t.iteration_us) / t.iteration_us for p, t in zip(predicted_us, truth.second.steps)]
    change = sum(predicted_us) / len(predicted_us) / truth.first.mean_iteration_us - 1.0
    return Verdict(statistics.median(errors), change, truth.change)


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def truth(s: Schedule) -> RunTruth:
    """Per complete profiled step: the GPU's period, and the merged time of the collectives
    launched in the step with the part of it no compute kernel overlaps."""
    steps = s.steps()
    launched = [[op for op in s.ops if st.start_us <= op.call_us < st.end_us] for st in steps]
    firsts = [min(ops, key=lambda op: op.call_us).start_us for ops in launched]
    compute = merged([(op.start_us, op.end_us) for op in s.ops if op.work.kernel is not None and not op.is_comm])
    out = []
    for k in range(len(steps) - 1):
        comm = merged([(op.start_us, op.end_us) for op in launched[k] if op.is_comm])
        exposed = _length(merged(comm + compute)) - _length(compute)  # comm time no compute kernel overlaps
        out.append(StepTruth(steps[k].name, firsts[k + 1] - firsts[k], _length(comm), exposed))
    span = (firsts[0], firsts[-1])
    inside = [(max(op.start_us, span[0]), min(op.end_us, span[1])) for op in s.ops
              if op.end_us > span[0] and op.start_us < span[1]]
    ops = [op for ops in launched[:-1] for op in ops]
    return RunTruth(tuple(out), 100.0 * _length(merged(inside)) / (span[1] - span[0]),
                    100.0 * sum(op.bound == "launch" for op in ops) / len(ops))


# --- the trace ------------------------------------------------------------------------------------------

def _ts(t_us: float) -> float:
    return round(T0_US + t_us, 3)


def trace_doc(s: Schedule) -> dict:
    """What Kineto writes for the profiled window of a run."""
    p = s.program
    lo, hi = s.window
    inside = lambda a, b: lo <= a and b <= hi  # noqa: E731 - Kineto's out-of-range rule
    spans = [sp for sp in s.spans if inside(sp.start_us, sp.end_us)]
    ext = {id(sp): i + 1 for i, sp in enumerate(sorted(spans, key=lambda x: x.start_us))}
    ev: list[dict] = []
    flow_ends: dict[int, list[dict]] = {}
    for sp in spans:
        args = {"External id": ext[id(sp)], **(sp.args or {})}
        ev.append({"ph": "X", "cat": sp.cat, "name": sp.name, "pid": PID, "tid": sp.thread, "ts": _ts(sp.start_us),
                   "dur": round(sp.end_us - sp.start_us, 3), "args": args})
        if sp.flow:
            ph, fid = sp.flow
            mark = {"ph": ph, "id": fid, "pid": PID, "tid": sp.thread, "ts": _ts(sp.start_us), "cat": "fwdbwd",
                    "name": "fwdbwd", **({"bp": "e"} if ph == "f" else {})}
            flow_ends.setdefault(fid, []).append(mark)
    ev += [m for marks in flow_ends.values() if len(marks) == 2 for m in marks]
    for c in s.calls:
        if not inside(c.start_us, c.end_us):
            continue
        e_id = ext[id(c.span)] if c.span is not None and id(c.span) in ext else c.corr
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": c.name, "pid": PID, "tid": c.thread,
                   "ts": _ts(c.start_us), "dur": round(c.end_us - c.start_us, 3),
                   "args": {"External id": e_id, "cbid": CBID[c.name], "correlation": c.corr}})
        has_gpu = c.op is not None and inside(c.op.start_us, c.op.end_us)
        if c.sync is not None and p.cuda_sync_events:
            ev.append({"ph": "X", "cat": "cuda_sync", "name": c.sync["cuda_sync_kind"], "pid": 0,
                       "tid": c.sync["stream"], "ts": _ts(c.start_us + 0.5),
                       "dur": round(max(c.end_us - c.start_us - 1.0, 0.5), 3),
                       "args": {"External id": e_id, **c.sync, "correlation": c.corr, "device": 0, "context": 1}})
            has_gpu = True
        if has_gpu:
            ev.append({"ph": "s", "id": c.corr, "pid": PID, "tid": c.thread, "ts": _ts(c.start_us), "cat": "ac2g",
                       "name": "ac2g"})
    ext_by_corr = {c.corr: (ext.get(id(c.span), c.corr) if c.span is not None else c.corr)
                   for c in s.calls if inside(c.start_us, c.end_us)}
    for op in s.ops:
        if not inside(op.start_us, op.end_us):
            continue
        ev += _gpu_events(op, ext_by_corr.get(op.corr, 0))
    ev += _metadata(s)
    return {"schemaVersion": 1, "deviceProperties": [{**A100, "id": i} for i in range(p.world_size)],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": p.world_size, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                               "pg_size": p.world_size, "ranks": list(range(p.world_size))}],
                                "nccl_version": NCCL_VERSION},
            "traceEvents": ev, "traceName": f"{p.name}.json", "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}


def _gpu_events(op: GpuOp, ext: int) -> list[dict]:
    w = op.work
    dur = round(op.end_us - op.start_us, 3)
    base = {"External id": ext, "device": 0, "context": 1, "stream": op.stream, "correlation": op.corr}
    out: list[dict] = []
    args: dict[str, object]
    if w.kernel is None:
        args = {**base, "bytes": w.copy_bytes, "memory bandwidth (GB/s)": round(w.copy_bytes / 1e3 / dur, 6)}
        out.append({"ph": "X", "cat": "gpu_memcpy", "name": w.copy, "pid": 0, "tid": op.stream,
                    "ts": _ts(op.start_us), "dur": dur, "args": args})
    else:
        k = w.kernel
        blocks = k.grid[0] * k.grid[1] * k.grid[2]
        warps = blocks * k.block[0] * k.block[1] * k.block[2] / 32
        args = {**base, "queued": 0, "registers per thread": k.registers, "shared memory": k.shared_memory,
                "blocks per SM": round(blocks / SMS, 6), "warps per SM": round(warps / SMS, 6),
                "grid": list(k.grid), "block": list(k.block), "est. achieved occupancy %": 0 if op.is_comm else 50,
                **(w.comm_args or {})}
        out.append({"ph": "X", "cat": "kernel", "name": k.name, "pid": 0, "tid": op.stream, "ts": _ts(op.start_us),
                    "dur": dur, "args": args})
        if w.comm_args is not None:
            name = "nccl:_all_gather_base" if k is ALL_GATHER else "nccl:_reduce_scatter_base"
            if k is not ALL_GATHER and k is not REDUCE_SCATTER:  # tests/kineto_ranks.py's collectives
                name = f"nccl:{w.comm_args['Collective name']}"
            out.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "pid": 0, "tid": op.stream,
                        "ts": _ts(op.start_us), "dur": dur, "args": {"External id": ext}})
    if ext:  # its launch call is in the trace
        out.append({"ph": "f", "id": op.corr, "pid": 0, "tid": op.stream, "ts": _ts(op.start_us), "cat": "ac2g",
                    "name": "ac2g", "bp": "e"})
    return out


def _metadata(s: Schedule) -> list[dict]:
    lo, hi = s.window
    ts = _ts(lo)
    out: list[dict] = [
        {"name": "process_name", "ph": "M", "ts": ts, "pid": PID, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_name", "ph": "M", "ts": ts, "pid": 0, "tid": 0, "args": {"name": "python3"}},
        {"name": "process_labels", "ph": "M", "ts": ts, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "Trace", "ts": ts, "dur": round(hi - lo, 3), "pid": "Spans", "tid": "PyTorch Profiler",
         "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": ts},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": _ts(hi)},
    ]
    for tid in sorted({c.thread for c in s.calls}):
        out.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": PID, "tid": tid,
                    "args": {"name": f"thread {tid} ({'python3' if tid == MAIN else 'pt_autograd_0'})"}})
    for stream in sorted({op.stream for op in s.ops}):
        out.append({"name": "thread_name", "ph": "M", "ts": ts, "pid": 0, "tid": stream,
                    "args": {"name": f"stream {stream} "}})
    return out


def write_trace(s: Schedule, path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps(trace_doc(s)).encode(), compresslevel=5, mtime=0))
    return path


def paired(p: Program, directory: Path, *, comm: float = 1.0, compute: float = 1.0, cpu: float = 1.0,
           seed: int = 0) -> tuple[Path, Path, PairTruth]:
    """The program run as recorded and again with the factors; both traces and both truths."""
    first = simulate(p, seed=seed)
    second = simulate(p, comm=comm, compute=compute, cpu=cpu, seed=seed)
    tag = f"{p.name}_s{seed}_comm{comm:g}_compute{compute:g}_cpu{cpu:g}"
    return (write_trace(first, directory / f"{p.name}_s{seed}_first.json.gz"),
            write_trace(second, directory / f"{tag}_second.json.gz"), PairTruth(truth(first), truth(second)))
