"""Names a profiler trace uses for communication: NCCL/RCCL kernels, PyTorch comm calls, dtypes.

Pure string functions used by :mod:`traces.kineto`. Every generation of NCCL kernel
name is recognised:

- NCCL <= 2.8: ``ncclAllReduceRingLLKernel_sum_f32(ncclColl)``
- NCCL 2.9 - 2.18: ``ncclKernel_AllReduce_RING_LL_Sum_float(...)``, ``ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t``
- NCCL >= 2.19: ``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)``, ``ncclDevKernel_SendRecv(...)``
- RCCL / NCCL generic kernels: ``ncclDevKernel_Generic(...)``, ``ncclDevKernel_Generic_4(...)``,
  ``ncclKernel_Generic...``: the collective is not in the name (the trace's metadata says).
- NCCL's symmetric kernels (buffers in symmetric windows): ``ncclSymDevKernel_AllGather_ST``
  (NCCL 2.27), ``ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16`` (2.28 on): few CTAs, picked
  by NCCL before any tuner plugin (:func:`is_symmetric_kernel`).

NCCL's copy-engine collectives (CTA policy ZERO) launch no kernel: they are memory copies
on the communicator's stream, launched inside the collective's CPU call
(``traces.kineto`` recognises them by that).

Communication kernels that are not NCCL's are recognised too (:func:`is_comm_kernel`
without :func:`is_nccl_kernel`): they move data between GPUs, but no NCCL knob
reaches them. Matched on the kernel's own identifier (the demangled name without
namespaces, template and call arguments, lower case, underscores dropped):

- PyTorch symmetric memory (``torch.distributed._symmetric_memory``, CUDA >= 12.3):
  ``multimem_all_reduce_kernel``, ``multimem_one_shot_reduce_kernel``,
  ``multimem_all_gather_kernel`` (NVLink SHARP multicast), ``one_shot_all_reduce_kernel``,
  ``two_shot_all_reduce_kernel[_inplace]``;
- PyTorch's intra-node all-reduce (``IntraNodeComm``) and TensorRT-LLM's custom
  all-reduce: ``oneShotAllReduceKernel``, ``twoShotAllReduceKernel``,
  ``hybridCubeMeshAllReduceKernel``, ``allreduce_fusion_kernel_*``;
- vLLM / SGLang custom all-reduce: ``cross_device_reduce_1stage``, ``cross_device_reduce_2stage``.
"""

from __future__ import annotations

import functools
import re

from nccl_env.knobs import Algorithm, CollectiveType, Protocol

# A communication kernel: "nccl...Kernel..." (NCCL and RCCL), optionally after "void ".
_NCCL_KERNEL_RE = re.compile(r"^(?:void\s+)?nccl\w*?Kernel")
# The collective token right after the kernel prefix, per naming generation.
_NEW_NAME_RE = re.compile(r"^(?:void\s+)?nccl(?:Dev|Symk?Dev)?Kernel_([A-Za-z]+)")
# NCCL's symmetric kernels: ncclSymDevKernel_* (2.27), ncclSymkDevKernel_* (2.28 on)
_SYMMETRIC_RE = re.compile(r"^(?:void\s+)?ncclSymk?DevKernel_")
_OLD_NAME_RE = re.compile(
    r"^(?:void\s+)?nccl([A-Z][A-Za-z]*?)(?:Ring|Tree|CollNet|Nvls|Pat)?(?:LL128|LL|Simple)?Kernel")

# PyTorch comm calls on the CPU side: record_param_comms, "nccl:all_reduce",
# "gloo:all_reduce", "c10d::allreduce_" ...
COMM_CALL_PREFIXES = ("nccl:", "gloo:", "mpi:", "ucc:", "c10d::")

# Bytes per element for the dtype spellings in Kineto args ("dtype", "Input type").
# PyTorch's c10::ScalarType names and their C++ spellings.
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "f32": 4, "int": 4, "int32": 4, "uint32": 4, "int32_t": 4, "unsigned int": 4,
    "double": 8, "float64": 8, "f64": 8, "long": 8, "int64": 8, "long int": 8, "int64_t": 8,
    "uint64": 8, "unsigned long": 8, "complexfloat": 8, "c10::complex<float>": 8,
    "complexdouble": 16, "c10::complex<double>": 16,
    "half": 2, "float16": 2, "f16": 2, "c10::half": 2, "bfloat16": 2, "bf16": 2, "c10::bfloat16": 2,
    "short": 2, "int16": 2, "int16_t": 2, "uint16": 2,
    "char": 1, "int8": 1, "int8_t": 1, "signed char": 1, "byte": 1, "uint8": 1, "uint8_t": 1,
    "unsigned char": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1, "fp8": 1, "u8": 1, "i8": 1,
}


# Identifier fragments (lower case, no underscores) of communication kernels that are not
# NCCL's, with the collective they perform; the first fragment found in the identifier wins.
_OTHER_COMM_KERNELS: tuple[tuple[str, CollectiveType], ...] = (
    ("multimemallreduce", CollectiveType.ALLREDUCE),
    ("multimemoneshotallreduce", CollectiveType.ALLREDUCE),
    ("multimemoneshotreduce", CollectiveType.REDUCE),
    ("multimemallgather", CollectiveType.ALLGATHER),
    ("multimemreducescatter", CollectiveType.REDUCESCATTER),
    ("oneshotallreduce", CollectiveType.ALLREDUCE),
    ("twoshotallreduce", CollectiveType.ALLREDUCE),
    ("hybridcubemeshallreduce", CollectiveType.ALLREDUCE),
    ("allreducefusionkernel", CollectiveType.ALLREDUCE),
    ("crossdevicereduce1stage", CollectiveType.ALLREDUCE),
    ("crossdevicereduce2stage", CollectiveType.ALLREDUCE),
)


def kernel_short_name(name: str) -> str:
    """The kernel function's own name: ``void (anonymous namespace)::multimem_all_reduce_kernel<float,
    16>(float*, ...)`` -> ``multimem_all_reduce_kernel``."""
    head = name.replace("(anonymous namespace)", "").split("<", 1)[0].split("(", 1)[0].split()
    return head[-1].rsplit("::", 1)[-1] if head else name


def is_nccl_kernel(name: str) -> bool:
    """True for an NCCL/RCCL kernel name."""
    return _NCCL_KERNEL_RE.match(name) is not None


def is_symmetric_kernel(name: str) -> bool:
    """True for one of NCCL's symmetric kernels (few CTAs, registered buffers: not NCCL's ring kernels)."""
    return _SYMMETRIC_RE.match(name) is not None


@functools.lru_cache(maxsize=1 << 16)  # every kernel of a trace asks; names repeat
def other_comm_collective(name: str) -> CollectiveType | None:
    """The collective of a communication kernel that is not NCCL's, or None for any other kernel."""
    ident = kernel_short_name(name).lower().replace("_", "")
    for fragment, collective in _OTHER_COMM_KERNELS:
        if fragment in ident:
            return collective
    return None


def is_comm_kernel(name: str) -> bool:
    """True for a kernel that moves data between GPUs: NCCL/RCCL's, or one of the others above."""
    return is_nccl_kernel(name) or other_comm_collective(name) is not None


def collective_from_kernel_name(name: str) -> CollectiveType | None:
    """The collective a kernel name spells, or None (generic kernels, unknown tokens)."""
    m = _NEW_NAME_RE.match(name) or _OLD_NAME_RE.match(name)
    if m is None:
        return other_comm_collective(name)
    token = m.group(1)
    if token.lower() == "generic":
        return None
    return collective_from_call_name(token)


# The algorithm and protocol an NCCL kernel name spells: ``..._RING_LL128`` (2.19+: after the type),
# ``ncclKernel_AllReduce_RING_LL_Sum_float`` (2.9-2.18), ``ncclAllReduceRingLLKernel`` (<= 2.8).
_ALGO_PROTO_RE = re.compile(
    r"_(RING|TREE|COLLNET_DIRECT|COLLNET_CHAIN|COLLNET|NVLS_TREE|NVLS|PAT)_(LL128|LL|SIMPLE)(?![A-Za-z0-9])")
_OLD_ALGO_PROTO_RE = re.compile(r"^(?:void\s+)?nccl[A-Z][A-Za-z]*?(Ring|Tree|CollNet|Nvls|Pat)(LL128|LL|Simple)Kernel")
_ALGO_TOKENS = {"RING": Algorithm.RING, "TREE": Algorithm.TREE, "COLLNET": Algorithm.COLLNET_DIRECT,
                "COLLNET_DIRECT": Algorithm.COLLNET_DIRECT, "COLLNET_CHAIN": Algorithm.COLLNET_CHAIN,
                "NVLS": Algorithm.NVLS, "NVLS_TREE": Algorithm.NVLS_TREE, "PAT": Algorithm.PAT}


def algorithm_protocol_from_kernel_name(name: str) -> tuple[Algorithm, Protocol] | None:
    """The (algorithm, protocol) an NCCL kernel name spells, or None (generic, symmetric and p2p
    kernels name none: ``ncclDevKernel_SendRecv``, ``ncclDevKernel_Generic``). A launch that fused
    several collectives is named after its first, so this is what NCCL ran for that one."""
    if not is_nccl_kernel(name) or is_symmetric_kernel(name):
        return None
    found = _ALGO_PROTO_RE.search(name.split("(", 1)[0])
    if found is None:
        old = _OLD_ALGO_PROTO_RE.match(name)
        if old is None:
            return None
        algo, proto = old.group(1).upper(), old.group(2).upper()
    else:
        algo, proto = found.group(1), found.group(2)
    return _ALGO_TOKENS[algo], Protocol[proto]


def collective_from_call_name(text: str) -> CollectiveType | None:
    """The collective of a PyTorch comm call or metadata spelling, or None.

    ``nccl:all_reduce``, ``gloo:all_reduce``, ``c10d::_allgather_base_``,
    ``allreduce_coalesced``, ``reduce_scatter_tensor``, ``all_to_all``, ``send``,
    ``barrier`` (an allreduce of one element in NCCL), ``gather``/``scatter``
    (grouped send/recv in NCCL).
    """
    for prefix in COMM_CALL_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix):]
            break
    key = text.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    if not key:
        return None
    # Order matters: "reducescatter" and "allreduce" both contain "reduce".
    if "reducescatter" in key:
        return CollectiveType.REDUCESCATTER
    if "allgather" in key:
        return CollectiveType.ALLGATHER
    if "alltoall" in key:
        return CollectiveType.ALLTOALL
    if "allreduce" in key or key.startswith("barrier"):
        return CollectiveType.ALLREDUCE
    if "broadcast" in key:
        return CollectiveType.BROADCAST
    if "sendrecv" in key or key in ("send", "recv", "isend", "irecv", "p2p") or "isendirecv" in key:
        return CollectiveType.SENDRECV
    if key.startswith(("send", "recv")):
        return CollectiveType.SENDRECV
    if key.startswith(("gather", "scatter")):
        return CollectiveType.SENDRECV
    if key.startswith("reduce"):
        return CollectiveType.REDUCE
    try:
        return CollectiveType.parse(text)
    except ValueError:
        return None


def dtype_bytes(dtype: object) -> int | None:
    """Bytes per element of a dtype spelling ("Float", "c10::BFloat16", "unsigned char"), or None."""
    if not isinstance(dtype, str):
        return None
    key = dtype.strip().lower()
    if key.startswith("torch."):
        key = key[len("torch."):]
    return _DTYPE_BYTES.get(key)


def is_comm_call(name: str) -> bool:
    """A CPU-side event that stands for a communication call (or wraps one)."""
    return name == "record_param_comms" or name.startswith(COMM_CALL_PREFIXES)
