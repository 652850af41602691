"""Synthetic training iterations for the Lagom paper's jobs: FSDP, tensor-parallel and expert-parallel.

``generate_workload(spec)`` turns a spec string into one rank's (rank 0's) iteration as a
:class:`~traces.workload.Workload`. Spec grammar::

    KIND:MODEL[:PARAMS]
    KIND   = fsdp | tp | ep
    MODEL  = phi2 | llama3-8b | mpt-7b | deepseek-moe-16b (deepseek-moe) | olmoe-1b-7b (olmoe)
           | hidden=H,layers=L,ffn=F,heads=A,vocab=V[,kv_heads=K][,experts=E,topk=k,shared_experts=S]
    PARAMS = comma-separated key=value:
             fsdp: gpus (default 8)    tp: tp (8), dp (1) or gpus (= tp x dp)    ep: ep (8), gpus (= ep)
             any:  mb (micro-batch), seq (sequence length, 2048), steps (micro-batches per
                   iteration), gpus_per_node (8)

e.g. ``fsdp:llama3-8b:gpus=16``, ``tp:phi2:tp=8,dp=2``, ``ep:olmoe:ep=8``,
``fsdp:hidden=5120,layers=40,ffn=13824,heads=40,vocab=32000:gpus=16``.

What is generated (the real schedule, simplified where said):

* Compute ops carry FLOPs, DRAM bytes and a launch shape from GEMM tiling: a GEMM of
  M x N x K picks a cuBLAS-like tile (256x128 with 256 threads, one block per SM, when
  there are enough tiles; else 128x128 / 64x64), ``grid = (ceil(N/bn), ceil(M/bm), 1)``,
  and is named like the cuBLAS kernel (``..._256x128_ldg8_..._tn``) so evaluators can read
  the tile back. ``dram_bytes`` is the compulsory traffic (each operand read once, the
  result written once); how much more a GEMM really moves depends on the L2 it gets, which
  is the evaluator's business. Element-wise and normalisation kernels are memory ops
  (256 threads, 6 blocks per SM). ``duration_us`` is an uncontended roofline estimate on
  an A40 (the paper's GPU): a hint only; evaluators recompute from FLOPs and bytes.
* FSDP (PyTorch FULL_SHARD, bf16 mixed precision, one unit per transformer layer plus the
  root unit): forward AllGather of layer l+1 is issued when layer l-1's compute has
  finished (forward prefetch with the two-in-flight rate limiter) so it overlaps layer l;
  backward re-gathers each layer with BACKWARD_PRE prefetch, and each layer's
  ReduceScatter follows its gradients. Message sizes are the flat parameter bytes padded
  to a multiple of the group size. The paper's global batch 2 x GPUs gives 1 (Phi-2,
  micro-batch 2) or 2 (Llama-3, MPT, micro-batch 1) micro-batches per iteration.
* TP (Megatron-style, TP group inside a node): column-parallel QKV/FC1, row-parallel
  out-projection/FC2, an AllReduce after each row-parallel GEMM forward and after each
  column-parallel GEMM's input gradient backward, with Domino-style overlap: the
  micro-batch is cut in two halves so one half's AllReduce overlaps the other half's
  compute. With dp > 1, gradient AllReduces (DDP buckets, one per layer) overlap backward.
  ``steps`` defaults to 1 micro-batch (the paper's global batch would be
  512/(mb x dp) micro-batches, which only repeats the same pattern; pass ``steps=`` for it).
* EP (MoE layers, experts spread over the EP group, attention data-parallel): router,
  dispatch AlltoAll, grouped expert GEMMs, combine AlltoAll, with two-batch overlap:
  the micro-batch's two halves alternate so one half's AlltoAll overlaps the other
  half's compute. Dense gradients are AllReduced over all GPUs, expert gradients over
  the replicas when gpus > ep.
* TP and EP iterations leave out the LM head and loss (FSDP has them): their cost is
  small next to the layers and they add no collective the tuner could act on.

Bad specs raise LagomError with one line saying what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nccl_env.errors import LagomError
from nccl_env.knobs import CollectiveType
from traces.gemm_names import GemmDtype, gemm_kernel_name
from traces.limits import MAX_GPUS_PER_NODE, MAX_OPS, MAX_RANKS, check_bound
from traces.workload import (
    CollectiveOp,
    ComputeOp,
    Dependency,
    DependencyKind,
    ProcessGroup,
    Stream,
    StreamKind,
    Workload,
)
from traces.workload_io import out_of_bounds

BF16_BYTES = 2
COMPUTE_STREAM = 7
COMM_STREAM_BASE = 20

# Reference GPU for the duration hint only (A40: 149.7 TFLOP/s dense BF16, 696 GB/s, 84 SMs).
REF_FLOPS_PER_US = 149.7e6 * 0.7  # 70% of peak, cuBLAS-like
REF_BYTES_PER_US = 696e3 * 0.85  # 85% of peak DRAM bandwidth
REF_COMM_BYTES_PER_US = 20e3  # ~20 GB/s: a PCIe-class ring, for start-time hints only
REF_SMS = 84
KERNEL_GAP_US = 2.0


@dataclass(frozen=True)
class ModelShape:
    """A transformer's shape (public model configs, docs/reference.md §1)."""

    name: str
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None
    mlp: str = "gelu"  # "gelu" (two matrices) or "swiglu" (gate + up + down)
    tied_embeddings: bool = False
    experts: int = 0  # routed experts (0 = dense)
    topk: int = 0
    shared_experts: int = 0  # DeepSeek-MoE style always-on experts, each of size ffn

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def mlp_params(self, ffn: int) -> int:
        return self.hidden * ffn * (3 if self.mlp == "swiglu" else 2)

    def attn_params(self) -> int:
        return self.hidden * (self.heads + 2 * self.kv) * self.head_dim + self.hidden * self.hidden

    def layer_params(self) -> int:
        """Dense layer: attention + MLP + two norms. MoE: attention + router + all experts."""
        norms = 2 * self.hidden
        if self.is_moe:
            return (self.attn_params() + norms + self.hidden * self.experts
                    + (self.experts + self.shared_experts) * self.mlp_params(self.ffn))
        return self.attn_params() + norms + self.mlp_params(self.ffn)

    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden


MODELS: dict[str, ModelShape] = {
    # microsoft/phi-2 config: hidden 2560, 32 layers, 32 heads, FFN 10240 (GELU), vocab 51200
    "phi2": ModelShape("phi2", 2560, 32, 32, 10240, 51200, mlp="gelu"),
    # meta-llama/Meta-Llama-3-8B: hidden 4096, 32 layers, 32 heads / 8 KV heads, FFN 14336 (SwiGLU), vocab 128256
    "llama3-8b": ModelShape("llama3-8b", 4096, 32, 32, 14336, 128256, kv_heads=8, mlp="swiglu"),
    # mosaicml/mpt-7b: hidden 4096, 32 layers, 32 heads, FFN 16384 (GELU), vocab 50432, tied embeddings
    "mpt-7b": ModelShape("mpt-7b", 4096, 32, 32, 16384, 50432, mlp="gelu", tied_embeddings=True),
    # deepseek-ai/deepseek-moe-16b-base: hidden 2048, 28 layers, 16 heads,
    # 64 routed (top-6) + 2 shared experts of FFN 1408
    "deepseek-moe-16b": ModelShape("deepseek-moe-16b", 2048, 28, 16, 1408, 102400, mlp="swiglu",
                                   experts=64, topk=6, shared_experts=2),
    # allenai/OLMoE-1B-7B: hidden 2048, 16 layers, 16 heads, 64 experts (top-8) of FFN 1024, vocab 50304
    "olmoe-1b-7b": ModelShape("olmoe-1b-7b", 2048, 16, 16, 1024, 50304, mlp="swiglu", experts=64, topk=8),
}
ALIASES = {"deepseek-moe": "deepseek-moe-16b", "olmoe": "olmoe-1b-7b", "llama3": "llama3-8b", "mpt": "mpt-7b",
           "phi-2": "phi2"}

# Paper micro-batch sizes (docs/reference.md §1, the Lagom paper's evaluation table).
PAPER_MICRO_BATCH = {
    ("fsdp", "phi2"): 2, ("fsdp", "llama3-8b"): 1, ("fsdp", "mpt-7b"): 1,
    ("tp", "phi2"): 8, ("tp", "llama3-8b"): 4, ("tp", "mpt-7b"): 2,
    ("ep", "deepseek-moe-16b"): 2, ("ep", "olmoe-1b-7b"): 2,
}
FSDP_SAMPLES_PER_GPU = 2  # paper: FSDP global batch = 2 x GPUs
DEFAULT_SEQ = 2048

# Every number a spec can carry has a bound (traces.limits), checked before anything is built:
# ranks and ops allocate (process groups list their ranks; ops grow with layers x steps); the
# model's sizes only feed FLOPs and bytes, bounded far above any published model (Llama 3 405B:
# hidden 16384, ffn 53248, 126 layers, vocab 128256, 128 heads).
SPEC_BOUNDS = {"gpus": MAX_RANKS, "tp": MAX_GPUS_PER_NODE, "dp": MAX_RANKS, "ep": MAX_RANKS,
               "gpus_per_node": MAX_GPUS_PER_NODE, "mb": 1 << 16, "seq": 1 << 24, "steps": MAX_OPS,
               "hidden": 1 << 20, "layers": MAX_OPS, "ffn": 1 << 22, "heads": 1 << 14, "kv_heads": 1 << 14,
               "vocab": 1 << 24, "experts": 1 << 14, "topk": 1 << 14, "shared_experts": 1 << 14}
OPS_PER_LAYER_STEP = 80  # measured: 23 (FSDP), 49 (TP), 54-70 (EP) ops per layer and micro-batch

KINDS = ("fsdp", "tp", "ep")
_PARAMS = {"fsdp": {"gpus"}, "tp": {"tp", "dp", "gpus"}, "ep": {"ep", "gpus"}}
_COMMON = {"mb", "seq", "steps", "gpus_per_node"}
_SHAPE_KEYS = {"hidden", "layers", "ffn", "heads", "vocab", "kv_heads", "experts", "topk", "shared_experts"}


def paper_workloads(gpus: int = 16) -> list[str]:
    """The paper's eight jobs as spec strings, on ``gpus`` (8 or 16) GPUs."""
    dp = max(1, gpus // 8)
    return [
        f"fsdp:phi2:gpus={gpus}",
        f"fsdp:llama3-8b:gpus={gpus}",
        f"fsdp:mpt-7b:gpus={gpus}",
        f"tp:phi2:tp=8,dp={dp}",
        f"tp:llama3-8b:tp=8,dp={dp}",
        f"tp:mpt-7b:tp=8,dp={dp}",
        f"ep:deepseek-moe-16b:ep=8,gpus={gpus}",
        f"ep:olmoe-1b-7b:ep=8,gpus={gpus}",
    ]


PAPER_WORKLOADS: tuple[str, ...] = tuple(paper_workloads(8) + paper_workloads(16))


@dataclass(frozen=True)
class WorkloadSpec:
    kind: str
    model: ModelShape
    gpus: int
    tp: int = 1
    dp: int = 1
    ep: int = 1
    micro_batch: int = 1
    seq: int = DEFAULT_SEQ
    steps: int = 1
    gpus_per_node: int = 8
    text: str = ""


def _accepted() -> str:
    names = ", ".join([*MODELS, *ALIASES])
    return ("expected KIND:MODEL[:PARAMS] with KIND fsdp|tp|ep, MODEL one of " + names
            + " or hidden=..,layers=..,ffn=..,heads=..,vocab=.., PARAMS e.g. gpus=16 | tp=8,dp=2 | ep=8 (+ mb, seq, "
              "steps)")


def _kv_pairs(text: str, spec: str, allowed: set[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in allowed:
            raise LagomError(f"workload spec {spec!r}: unknown parameter {item!r} (accepted: "
                             f"{', '.join(sorted(allowed))})")
        if key in out:
            raise LagomError(f"workload spec {spec!r}: {key} is given twice")
        try:
            number = int(value)
        except ValueError:
            raise LagomError(f"workload spec {spec!r}: {key} must be an integer, got {value!r}") from None
        if number <= 0:
            raise LagomError(f"workload spec {spec!r}: {key} must be positive, got {number}")
        check_bound(key, number, SPEC_BOUNDS[key], f"workload spec {spec!r}")
        out[key] = number
    return out


def parse_spec(spec: str) -> WorkloadSpec:
    """Parse a spec string (grammar in the module docstring); LagomError on anything else."""
    text = spec.strip()
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0].lower() not in KINDS:
        raise LagomError(f"workload spec {spec!r}: {_accepted()}")
    kind = parts[0].lower()
    model_text = parts[1].strip().lower()
    if "=" in model_text:
        shape = _kv_pairs(model_text, spec, _SHAPE_KEYS)
        missing = {"hidden", "layers", "ffn", "heads", "vocab"} - set(shape)
        if missing:
            raise LagomError(f"workload spec {spec!r}: model shape needs {', '.join(sorted(missing))}")
        if shape["hidden"] % shape["heads"]:
            raise LagomError(f"workload spec {spec!r}: hidden must be a multiple of heads")
        experts = shape.get("experts", 0)
        model = ModelShape("custom", shape["hidden"], shape["layers"], shape["heads"], shape["ffn"], shape["vocab"],
                           kv_heads=shape.get("kv_heads"), mlp="swiglu" if experts else "gelu", experts=experts,
                           topk=shape.get("topk", 2 if experts else 0), shared_experts=shape.get("shared_experts", 0))
        model_name = "custom"
    else:
        model_name = ALIASES.get(model_text, model_text)
        if model_name not in MODELS:
            raise LagomError(f"workload spec {spec!r}: unknown model {parts[1]!r}; {_accepted()}")
        model = MODELS[model_name]
    params = _kv_pairs(parts[2] if len(parts) == 3 else "", spec, _PARAMS[kind] | _COMMON)
    per_node = params.get("gpus_per_node", 8)
    mb_default = PAPER_MICRO_BATCH.get((kind, model_name), 1)
    mb = params.get("mb", mb_default)
    seq = params.get("seq", DEFAULT_SEQ)
    if kind == "fsdp":
        gpus = params.get("gpus", 8)
        steps = params.get("steps", max(1, FSDP_SAMPLES_PER_GPU // mb))
        out = WorkloadSpec(kind, model, gpus, dp=gpus, micro_batch=mb, seq=seq, steps=steps, gpus_per_node=per_node)
    elif kind == "tp":
        tp = params.get("tp", 8)
        if "gpus" in params and (params["gpus"] % tp or ("dp" in params and params["dp"] * tp != params["gpus"])):
            raise LagomError(f"workload spec {spec!r}: gpus={params['gpus']} must equal tp x dp")
        dp = params.get("dp", params.get("gpus", tp) // tp)
        if model.heads % tp or model.ffn % tp:
            raise LagomError(f"workload spec {spec!r}: tp={tp} must divide heads ({model.heads}) and ffn ({model.ffn})")
        if tp > per_node:
            raise LagomError(f"workload spec {spec!r}: tp={tp} must fit in a node ({per_node} GPUs)")
        out = WorkloadSpec(kind, model, tp * dp, tp=tp, dp=dp, micro_batch=mb, seq=seq, steps=params.get("steps", 1),
                           gpus_per_node=per_node)
    else:
        if not model.is_moe:
            raise LagomError(f"workload spec {spec!r}: ep needs a mixture-of-experts model (deepseek-moe-16b, "
                             "olmoe-1b-7b, or experts=..)")
        ep = params.get("ep", 8)
        gpus = params.get("gpus", ep)
        if model.experts % ep or gpus % ep:
            raise LagomError(f"workload spec {spec!r}: ep={ep} must divide the experts ({model.experts}) and gpus "
                             f"({gpus})")
        out = WorkloadSpec(kind, model, gpus, ep=ep, dp=gpus, micro_batch=mb, seq=seq, steps=params.get("steps", 1),
                           gpus_per_node=per_node)
    where = f"workload spec {spec!r}"
    check_bound("gpus", out.gpus, MAX_RANKS, where)
    check_bound("layers x steps", out.model.layers * out.steps, MAX_OPS // OPS_PER_LAYER_STEP, where)
    return replace(out, text=text)


# ---- building ---------------------------------------------------------------------------------


def gemm_tile(m: int, n: int) -> tuple[int, int, int, int, int]:
    """(bm, bn, threads, blocks_per_sm, shared_memory_bytes) a cuBLAS-like heuristic picks.

    3-stage pipelines with k-slabs of 32 BF16 elements: smem = 3 x (bm + bn) x 32 x 2 bytes.
    """
    tiles_big = math.ceil(m / 256) * math.ceil(n / 128)
    if tiles_big >= REF_SMS:
        return 256, 128, 256, 1, 3 * (256 + 128) * 32 * BF16_BYTES
    if math.ceil(m / 128) * math.ceil(n / 128) >= REF_SMS // 2:
        return 128, 128, 128, 2, 3 * (128 + 128) * 32 * BF16_BYTES
    return 64, 64, 128, 4, 3 * (64 + 64) * 32 * BF16_BYTES


def gemm_op(label: str, m: int, n: int, k: int, grid_blocks: int | None = None, op_id: int = 0,
            stream: int = COMPUTE_STREAM, start_us: float = 0.0, dtype: GemmDtype = GemmDtype.BF16) -> ComputeOp:
    """A GEMM of M x N x K launched as cuBLAS would: the :func:`gemm_tile` tile, ``grid =
    (ceil(N/bn), ceil(M/bm), 1)`` (or ``(grid_blocks, 1, 1)`` when a measured launch says how many
    blocks), the cuBLAS-style name that carries tile and precision, FLOPs and compulsory DRAM bytes
    (the duration hint is the BF16 one whatever ``dtype``)."""
    bm, bn, block_threads, bps, smem = gemm_tile(m, n)
    smem = smem * dtype.operand_bytes // BF16_BYTES
    flops = 2.0 * m * n * k
    dram = float((m * k + k * n + m * n) * dtype.operand_bytes)
    duration = max(flops / REF_FLOPS_PER_US, dram / REF_BYTES_PER_US) + KERNEL_GAP_US
    name = f"{gemm_kernel_name(dtype, bm, bn)} [{label}]"
    grid = (math.ceil(n / bn), math.ceil(m / bm), 1) if grid_blocks is None else (grid_blocks, 1, 1)
    return ComputeOp(op_id, name, stream, start_us, duration, grid=grid, block=(block_threads, 1, 1),
                     blocks_per_sm=float(bps), shared_memory_bytes=smem, flops=flops, dram_bytes=dram)


@dataclass
class _Builder:
    """Places ops in time; what it places accumulates in ``out`` (a Workload's own op, group and
    dependency lists), put in order by :meth:`workload`."""

    world_size: int
    gpus_per_node: int
    out: Workload = field(init=False)
    comm_streams: dict[str, int] = field(default_factory=dict)
    _next_id: int = 0
    _stream_free: dict[int, float] = field(default_factory=dict)
    _end: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.out = Workload(rank=0, world_size=self.world_size)

    def group(self, name: str, ranks: list[int]) -> None:
        nodes = len({r // self.gpus_per_node for r in ranks})
        self.out.groups[name] = ProcessGroup(name, tuple(ranks), nodes)
        self.comm_streams[name] = COMM_STREAM_BASE + len(self.comm_streams)

    def _place(self, stream: int, duration: float, after: tuple[int, ...]) -> tuple[int, float]:
        op_id = self._next_id
        self._next_id += 1
        start = self._stream_free.get(stream, 0.0)
        for a in after:
            start = max(start, self._end[a])
            self.out.dependencies.append(Dependency(a, op_id, DependencyKind.DATA))
        self._end[op_id] = start + duration
        self._stream_free[stream] = start + duration + KERNEL_GAP_US
        return op_id, start

    def gemm(self, label: str, m: int, n: int, k: int, after: tuple[int, ...] = ()) -> int:
        op = gemm_op(label, m, n, k)
        op_id, start = self._place(COMPUTE_STREAM, op.duration_us, after)
        self.out.compute_ops.append(replace(op, op_id=op_id, start_us=start))
        return op_id

    def attention(self, label: str, batch: int, seq: int, heads: int, head_dim: int, backward: bool,
                  after: tuple[int, ...] = ()) -> int:
        # FlashAttention-2, causal: 2 GEMM-like products of b*h*s*s*d (halved by the mask); backward 2.5x
        flops = 2.0 * 2.0 * batch * heads * seq * seq * head_dim / 2.0 * (2.5 if backward else 1.0)
        dram = float(4 * batch * seq * heads * head_dim * BF16_BYTES * (2 if backward else 1))
        duration = max(flops / (REF_FLOPS_PER_US * 0.8), dram / REF_BYTES_PER_US) + KERNEL_GAP_US
        op_id, start = self._place(COMPUTE_STREAM, duration, after)
        kind = "bwd" if backward else "fwd"
        name = f"flash_{kind}_kernel [{label}]"
        self.out.compute_ops.append(ComputeOp(op_id, name, COMPUTE_STREAM, start, duration,
                                              grid=(math.ceil(seq / 128), batch * heads, 1), block=(128, 1, 1),
                                              blocks_per_sm=1.0, shared_memory_bytes=96 * 1024, flops=flops,
                                              dram_bytes=dram))
        return op_id

    def elementwise(self, label: str, elements: int, bytes_per_element: float, after: tuple[int, ...] = (),
                    flops_per_element: float = 4.0) -> int:
        dram = float(elements * bytes_per_element)
        flops = float(elements * flops_per_element)
        duration = dram / REF_BYTES_PER_US + KERNEL_GAP_US
        op_id, start = self._place(COMPUTE_STREAM, duration, after)
        self.out.compute_ops.append(ComputeOp(op_id, f"vectorized_elementwise_kernel [{label}]", COMPUTE_STREAM,
                                              start, duration, grid=(max(1, math.ceil(elements / (256 * 8))), 1, 1),
                                              block=(256, 1, 1), blocks_per_sm=6.0, flops=flops, dram_bytes=dram))
        return op_id

    def collective(self, label: str, kind: CollectiveType, group: str, message_bytes: int,
                   after: tuple[int, ...] = ()) -> int:
        stream = self.comm_streams[group]
        duration = message_bytes / REF_COMM_BYTES_PER_US + 10.0
        op_id, start = self._place(stream, duration, after)
        nccl = {CollectiveType.ALLGATHER: "AllGather", CollectiveType.REDUCESCATTER: "ReduceScatter",
                CollectiveType.ALLREDUCE: "AllReduce", CollectiveType.ALLTOALL: "SendRecv"}[kind]
        self.out.collectives.append(CollectiveOp(op_id, f"ncclDevKernel_{nccl}_Sum_bf16_RING_SIMPLE [{label}]", kind,
                                                 int(message_bytes), stream, start, duration, group, dtype="BFloat16"))
        return op_id

    def workload(self, source: str) -> Workload:
        streams = [Stream(COMPUTE_STREAM, StreamKind.COMPUTE, "compute")]
        streams += [Stream(s, StreamKind.COMMUNICATION, f"nccl:{g}") for g, s in self.comm_streams.items()]
        return replace(
            self.out,
            streams=streams,
            compute_ops=sorted(self.out.compute_ops, key=lambda o: o.start_us),
            collectives=sorted(self.out.collectives, key=lambda o: o.start_us),
            groups=dict(self.out.groups),
            dependencies=list(self.out.dependencies),
            source=source,
            device_name="generated (durations: A40 roofline hint)",
            sm_count=None,
            gpus_per_node=self.gpus_per_node,
        )


def _last(ids: list[int]) -> tuple[int, ...]:
    return (ids[-1],) if ids else ()


class _Layer:
    """Compute of one transformer layer on ``tokens`` tokens, with tensor-parallel degree ``tp``."""

    def __init__(self, b: _Builder, model: ModelShape, batch: int, seq: int, tp: int = 1):
        self.b, self.m, self.batch, self.seq, self.tp = b, model, batch, seq, tp
        self.tokens = batch * seq

    def attention_fwd(self, tag: str, after: tuple[int, ...]) -> list[int]:
        m, t, tp, b = self.m, self.tokens, self.tp, self.b
        ids = [b.elementwise(f"{tag} norm1 fwd", t * m.hidden, 2 * BF16_BYTES, after)]
        ids.append(b.gemm(f"{tag} qkv fwd", t, (m.heads + 2 * m.kv) * m.head_dim // tp, m.hidden, _last(ids)))
        ids.append(b.attention(f"{tag} attn fwd", self.batch, self.seq, m.heads // tp, m.head_dim, False, _last(ids)))
        ids.append(b.gemm(f"{tag} out-proj fwd", t, m.hidden, m.hidden // tp, _last(ids)))
        return ids

    def mlp_fwd(self, tag: str, after: tuple[int, ...], ffn: int | None = None, tokens: int | None = None) -> list[int]:
        m, tp, b = self.m, self.tp, self.b
        t = tokens or self.tokens
        f = (ffn or m.ffn) // tp
        ids = [b.elementwise(f"{tag} residual+norm2 fwd", t * m.hidden, 3 * BF16_BYTES, after)] if ffn is None else []
        up = 2 * f if m.mlp == "swiglu" else f
        ids.append(b.gemm(f"{tag} fc1 fwd", t, up, m.hidden, _last(ids) or after))
        ids.append(b.elementwise(f"{tag} act fwd", t * f, (3 if m.mlp == "swiglu" else 2) * BF16_BYTES, _last(ids)))
        ids.append(b.gemm(f"{tag} fc2 fwd", t, m.hidden, f, _last(ids)))
        return ids

    def mlp_bwd(self, tag: str, after: tuple[int, ...], ffn: int | None = None, tokens: int | None = None) -> list[int]:
        m, tp, b = self.m, self.tp, self.b
        t = tokens or self.tokens
        f = (ffn or m.ffn) // tp
        up = 2 * f if m.mlp == "swiglu" else f
        ids = [b.gemm(f"{tag} fc2 dgrad", t, f, m.hidden, after)]
        ids.append(b.gemm(f"{tag} fc2 wgrad", f, m.hidden, t, _last(ids)))
        ids.append(b.elementwise(f"{tag} act bwd", t * f, (5 if m.mlp == "swiglu" else 3) * BF16_BYTES, _last(ids)))
        ids.append(b.gemm(f"{tag} fc1 dgrad", t, m.hidden, up, _last(ids)))
        ids.append(b.gemm(f"{tag} fc1 wgrad", m.hidden, up, t, _last(ids)))
        if ffn is None:
            ids.append(b.elementwise(f"{tag} norm2 bwd", t * m.hidden, 4 * BF16_BYTES, _last(ids)))
        return ids

    def attention_bwd(self, tag: str, after: tuple[int, ...]) -> list[int]:
        m, t, tp, b = self.m, self.tokens, self.tp, self.b
        qkv = (m.heads + 2 * m.kv) * m.head_dim // tp
        ids = [b.gemm(f"{tag} out-proj dgrad", t, m.hidden // tp, m.hidden, after)]
        ids.append(b.gemm(f"{tag} out-proj wgrad", m.hidden // tp, m.hidden, t, _last(ids)))
        ids.append(b.attention(f"{tag} attn bwd", self.batch, self.seq, m.heads // tp, m.head_dim, True, _last(ids)))
        ids.append(b.gemm(f"{tag} qkv dgrad", t, m.hidden, qkv, _last(ids)))
        ids.append(b.gemm(f"{tag} qkv wgrad", m.hidden, qkv, t, _last(ids)))
        ids.append(b.elementwise(f"{tag} norm1 bwd", t * m.hidden, 4 * BF16_BYTES, _last(ids)))
        return ids


def _padded_bytes(params: int, ranks: int) -> int:
    return math.ceil(params / ranks) * ranks * BF16_BYTES


def _fsdp(spec: WorkloadSpec) -> Workload:
    m, n = spec.model, spec.gpus
    b = _Builder(n, spec.gpus_per_node)
    b.group("0", list(range(n)))
    layer = _Layer(b, m, spec.micro_batch, spec.seq)
    t = layer.tokens
    layer_bytes = _padded_bytes(m.layer_params(), n)
    root_bytes = _padded_bytes(m.root_params(), n)
    last_compute: tuple[int, ...] = ()
    for step in range(spec.steps):
        s = f"s{step}"
        # root unit stays gathered through the step (reshard_after_forward=False for the root)
        ag_root = b.collective(f"{s} root allgather", CollectiveType.ALLGATHER, "0", root_bytes, last_compute)
        emb = b.elementwise(f"{s} embedding fwd", t * m.hidden, 2 * BF16_BYTES, (ag_root, *last_compute))
        ends: list[int] = [emb]  # last compute op of each layer, forward
        ag: dict[int, int] = {0: b.collective(f"{s} L0 allgather fwd", CollectiveType.ALLGATHER, "0", layer_bytes,
                                              last_compute)}
        prev_end: tuple[int, ...] = (emb,)
        for li in range(m.layers):
            if li + 1 < m.layers:  # forward prefetch of the next layer, after layer li-1 freed its params
                gate = (ends[li],) if li >= 1 else ()
                ag[li + 1] = b.collective(f"{s} L{li + 1} allgather fwd", CollectiveType.ALLGATHER, "0", layer_bytes,
                                          gate)
            ids = layer.attention_fwd(f"{s} L{li}", (*prev_end, ag[li]))
            ids += layer.mlp_fwd(f"{s} L{li}", _last(ids))
            ends.append(ids[-1])
            prev_end = _last(ids)
        head = [b.elementwise(f"{s} final norm fwd", t * m.hidden, 2 * BF16_BYTES, prev_end)]
        head.append(b.gemm(f"{s} lm-head fwd", t, m.vocab, m.hidden, _last(head)))
        head.append(b.elementwise(f"{s} loss fwd+bwd", t * m.vocab, 3 * BF16_BYTES + 4, _last(head)))
        head.append(b.gemm(f"{s} lm-head dgrad", t, m.hidden, m.vocab, _last(head)))
        head.append(b.gemm(f"{s} lm-head wgrad", m.vocab, m.hidden, t, _last(head)))
        # backward: re-gather each layer (BACKWARD_PRE prefetch), ReduceScatter after its gradients
        agb: dict[int, int] = {
            m.layers - 1: b.collective(f"{s} L{m.layers - 1} allgather bwd", CollectiveType.ALLGATHER,
                                       "0", layer_bytes, (ends[-1],))}
        bwd_end: dict[int, int] = {}
        prev = _last(head)
        for li in reversed(range(m.layers)):
            if li - 1 >= 0:  # prefetch the previous layer before this layer's backward compute
                gate = (bwd_end[li + 1],) if li + 1 in bwd_end else ()
                agb[li - 1] = b.collective(f"{s} L{li - 1} allgather bwd", CollectiveType.ALLGATHER, "0", layer_bytes,
                                           gate)
            ids = layer.mlp_bwd(f"{s} L{li}", (*prev, agb[li]))
            ids += layer.attention_bwd(f"{s} L{li}", _last(ids))
            bwd_end[li] = ids[-1]
            b.collective(f"{s} L{li} reducescatter", CollectiveType.REDUCESCATTER, "0", layer_bytes, (ids[-1],))
            prev = _last(ids)
        emb_bwd = b.elementwise(f"{s} embedding bwd", t * m.hidden, 3 * BF16_BYTES, prev)
        rs_root = b.collective(f"{s} root reducescatter", CollectiveType.REDUCESCATTER, "0", root_bytes, (emb_bwd,))
        last_compute = (emb_bwd,)
    shard = (m.layer_params() * m.layers + m.root_params()) / n
    b.elementwise("optimizer step (AdamW, local shard)", int(shard), 16.0, (*last_compute, rs_root))
    return b.workload(spec.text)


def _two_half_overlap(b: _Builder, halves: list[int], layers: int, fwd_attn, fwd_mlp, bwd_mlp, bwd_attn,
                      comm_after_attn, comm_after_mlp, grad_sync=None) -> tuple[int, ...]:
    """Domino / two-batch overlap: two halves of the micro-batch alternate on the compute stream so
    that each half's collective overlaps the other half's compute. Callbacks build the pieces.

    Returns the last compute op id(s)."""
    ready: dict[int, tuple[int, ...]] = {h: () for h in range(len(halves))}
    for li in range(layers):
        after_attn: dict[int, int] = {}
        for h in range(len(halves)):
            ids = fwd_attn(li, h, ready[h])
            after_attn[h] = comm_after_attn(li, h, "fwd", ids[-1])
        for h in range(len(halves)):
            ids = fwd_mlp(li, h, (after_attn[h],))
            ready[h] = (comm_after_mlp(li, h, "fwd", ids[-1]),)
    last: tuple[int, ...] = tuple(x for h in ready for x in ready[h])
    for li in reversed(range(layers)):
        after_mlp: dict[int, int] = {}
        ends = []
        for h in range(len(halves)):
            ids = bwd_mlp(li, h, ready[h])
            after_mlp[h] = comm_after_mlp(li, h, "bwd", ids[-1])
        for h in range(len(halves)):
            ids = bwd_attn(li, h, (after_mlp[h],))
            ends.append(ids[-1])
            ready[h] = (comm_after_attn(li, h, "bwd", ids[-1]),)
        if grad_sync is not None:
            grad_sync(li, ends[-1])
        last = tuple(x for h in ready for x in ready[h])
    return last


def _tp(spec: WorkloadSpec) -> Workload:
    m, tp, dp = spec.model, spec.tp, spec.dp
    n = tp * dp
    b = _Builder(n, spec.gpus_per_node)
    b.group("tp", list(range(tp)))
    if dp > 1:
        b.group("dp", [i * tp for i in range(dp)])
    half_batch = max(1, spec.micro_batch // 2)
    halves = [half_batch, max(1, spec.micro_batch - half_batch)] if spec.micro_batch >= 2 else [1]
    layers = [_Layer(b, m, hb, spec.seq, tp) for hb in halves]
    ar_bytes = [layer.tokens * m.hidden * BF16_BYTES for layer in layers]
    layer_grad_bytes = m.layer_params() // tp * BF16_BYTES
    prev: tuple[int, ...] = ()
    for step in range(spec.steps):
        s = f"s{step}"
        emb = b.elementwise(f"{s} embedding fwd", sum(x.tokens for x in layers) * m.hidden, 2 * BF16_BYTES, prev)

        def ar(li, h, phase, after, what, s=s):
            return b.collective(f"{s} L{li} h{h} {what} allreduce {phase}", CollectiveType.ALLREDUCE, "tp",
                                ar_bytes[h], (after,))

        def grad_sync(li, after, s=s, step=step):
            if dp > 1 and step == spec.steps - 1:
                b.collective(f"{s} L{li} grad allreduce", CollectiveType.ALLREDUCE, "dp", layer_grad_bytes, (after,))

        last = _two_half_overlap(
            b, halves, m.layers,
            fwd_attn=lambda li, h, after, s=s, emb=emb: layers[h].attention_fwd(f"{s} L{li} h{h}", after or (emb,)),
            fwd_mlp=lambda li, h, after, s=s: layers[h].mlp_fwd(f"{s} L{li} h{h}", after),
            bwd_mlp=lambda li, h, after, s=s: layers[h].mlp_bwd(f"{s} L{li} h{h}", after),
            bwd_attn=lambda li, h, after, s=s: layers[h].attention_bwd(f"{s} L{li} h{h}", after),
            comm_after_attn=lambda li, h, phase, after: ar(li, h, phase, after, "attn"),
            comm_after_mlp=lambda li, h, phase, after: ar(li, h, phase, after, "mlp"),
            grad_sync=grad_sync,
        )
        prev = last
    b.elementwise("optimizer step (AdamW, TP shard)", int((m.layer_params() * m.layers + m.root_params()) / tp), 16.0,
                  prev)
    return b.workload(spec.text)


def _ep(spec: WorkloadSpec) -> Workload:
    m, ep, n = spec.model, spec.ep, spec.gpus
    b = _Builder(n, spec.gpus_per_node)
    b.group("ep", list(range(ep)))
    b.group("dp", list(range(n)))
    if n > ep:
        b.group("edp", list(range(0, n, ep)))
    half_batch = max(1, spec.micro_batch // 2)
    halves = [half_batch, max(1, spec.micro_batch - half_batch)] if spec.micro_batch >= 2 else [1]
    layers = [_Layer(b, m, hb, spec.seq) for hb in halves]
    a2a_bytes = [layer.tokens * m.topk * m.hidden * BF16_BYTES for layer in layers]
    local_experts = m.experts // ep
    dense_grad_bytes = (m.attn_params() + 2 * m.hidden + m.hidden * m.experts
                        + m.shared_experts * m.mlp_params(m.ffn)) * BF16_BYTES
    expert_grad_bytes = local_experts * m.mlp_params(m.ffn) * BF16_BYTES
    prev: tuple[int, ...] = ()
    for step in range(spec.steps):
        s = f"s{step}"
        emb = b.elementwise(f"{s} embedding fwd", sum(x.tokens for x in layers) * m.hidden, 2 * BF16_BYTES, prev)

        def fwd_attn(li, h, after, s=s, emb=emb):
            L = layers[h]
            ids = L.attention_fwd(f"{s} L{li} h{h}", after or (emb,))
            ids.append(b.elementwise(f"{s} L{li} h{h} residual+norm2 fwd", L.tokens * m.hidden, 3 * BF16_BYTES,
                                     _last(ids)))
            ids.append(b.gemm(f"{s} L{li} h{h} router fwd", L.tokens, m.experts, m.hidden, _last(ids)))
            ids.append(b.elementwise(f"{s} L{li} h{h} topk+permute fwd", L.tokens * m.topk * m.hidden,
                                     2 * BF16_BYTES, _last(ids)))
            if m.shared_experts:
                ids += L.mlp_fwd(f"{s} L{li} h{h} shared", _last(ids), ffn=m.ffn * m.shared_experts)
            return ids

        def experts(li, h, after, phase, s=s):
            L = layers[h]
            routed_tokens = L.tokens * m.topk  # balanced routing: every rank computes tokens x topk rows
            if phase == "fwd":
                return L.mlp_fwd(f"{s} L{li} h{h} experts", after, ffn=m.ffn, tokens=routed_tokens)
            return L.mlp_bwd(f"{s} L{li} h{h} experts", after, ffn=m.ffn, tokens=routed_tokens)

        def bwd_attn(li, h, after, s=s):
            L = layers[h]
            ids = []
            if m.shared_experts:
                ids += L.mlp_bwd(f"{s} L{li} h{h} shared", after, ffn=m.ffn * m.shared_experts)
            ids.append(b.gemm(f"{s} L{li} h{h} router bwd", L.tokens, m.hidden, m.experts, _last(ids) or after))
            ids += L.attention_bwd(f"{s} L{li} h{h}", _last(ids))
            return ids

        def a2a(li, h, what, phase, after, s=s):
            return b.collective(f"{s} L{li} h{h} {what} alltoall {phase}", CollectiveType.ALLTOALL, "ep",
                                a2a_bytes[h], (after,))

        # forward: attention(h) -> dispatch(h) -> experts(h) -> combine(h); backward mirrors it
        def fwd_mlp(li, h, after):
            return experts(li, h, after, "fwd")

        def bwd_mlp(li, h, after):
            return experts(li, h, after, "bwd")

        def grad_sync(li, after, s=s, step=step):
            if step == spec.steps - 1:
                b.collective(f"{s} L{li} dense grad allreduce", CollectiveType.ALLREDUCE, "dp", dense_grad_bytes,
                             (after,))
                if n > ep:
                    b.collective(f"{s} L{li} expert grad allreduce", CollectiveType.ALLREDUCE, "edp",
                                 expert_grad_bytes, (after,))

        last = _two_half_overlap(
            b, halves, m.layers,
            fwd_attn=fwd_attn, fwd_mlp=fwd_mlp, bwd_mlp=bwd_mlp, bwd_attn=bwd_attn,
            comm_after_attn=lambda li, h, phase, after: a2a(li, h, "dispatch" if phase == "fwd" else "combine-grad",
                                                            phase, after),
            comm_after_mlp=lambda li, h, phase, after: a2a(li, h, "combine" if phase == "fwd" else "dispatch-grad",
                                                           phase, after),
            grad_sync=grad_sync,
        )
        prev = last
    params_local = m.layers * (m.attn_params() + m.experts // ep * m.mlp_params(m.ffn)) + m.root_params()
    b.elementwise("optimizer step (AdamW)", int(params_local), 16.0, prev)
    return b.workload(spec.text)


def generate_workload(spec: str | WorkloadSpec) -> Workload:
    """Rank 0's iteration for a spec string (see the module docstring) or a parsed WorkloadSpec."""
    parsed = parse_spec(spec) if isinstance(spec, str) else spec
    builder = {"fsdp": _fsdp, "tp": _tp, "ep": _ep}[parsed.kind]
    workload = builder(parsed)
    problem = out_of_bounds(workload)  # sizes the model's shape gives (message bytes)
    if problem is not None:
        raise LagomError(f"workload spec {parsed.text!r}: {problem}")
    return workload
