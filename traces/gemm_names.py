"""What a GEMM kernel's name says: its tile and its precision (cuBLAS / CUTLASS naming).

cuBLAS names its kernels after the tile and the math, e.g.
``ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_32x3_tn`` (BF16 on tensor cores),
``ampere_tf32_s1688gemm_tf32_128x128_ldg8_stages_32x3_nn`` (TF32 on tensor cores) and
``ampere_sgemm_128x64_nn`` (FP32 on the CUDA cores). The generator names its GEMMs the
same way (:func:`gemm_kernel_name`) so that the evaluators read the launch back.
"""

from __future__ import annotations

import enum
import re

_TILE = re.compile(r"_(\d{2,3})x(\d{2,3})(?:x\d+)?_")


class GemmDtype(enum.Enum):
    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"
    FP32 = "fp32"

    @property
    def operand_bytes(self) -> int:
        return 2 if self in (GemmDtype.BF16, GemmDtype.FP16) else 4

    def peak_rate(self, tensor_bf16: float, fp32: float | None) -> float | None:
        """Dense peak for this precision, in the unit of the GPU's BF16 tensor and FP32 CUDA-core peaks
        given (None: the GPU's FP32 peak is not known). FP16 runs at the BF16 rate and TF32 at half
        of it on Ampere and Hopper tensor cores (A100 datasheet: 312 / 312 / 156 TFLOP/s dense)."""
        if self is GemmDtype.FP32:
            return fp32
        return tensor_bf16 / 2.0 if self is GemmDtype.TF32 else tensor_bf16


_NAME_TEMPLATES = {
    GemmDtype.BF16: "ampere_bf16_s16816gemm_bf16_{bm}x{bn}_ldg8_f2f_stages_32x3_tn",
    GemmDtype.FP16: "ampere_fp16_s16816gemm_fp16_{bm}x{bn}_ldg8_f2f_stages_32x3_tn",
    GemmDtype.TF32: "ampere_tf32_s1688gemm_tf32_{bm}x{bn}_ldg8_stages_32x3_tn",
    GemmDtype.FP32: "ampere_sgemm_{bm}x{bn}_tn",
}


def gemm_kernel_name(dtype: GemmDtype, bm: int, bn: int) -> str:
    return _NAME_TEMPLATES[dtype].format(bm=bm, bn=bn)


def gemm_tile(name: str) -> tuple[int, int] | None:
    """(bm, bn) from a GEMM kernel's name such as ``..._s16816gemm_bf16_256x128_ldg8_...``."""
    if "gemm" not in name.lower():
        return None
    match = _TILE.search(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def gemm_dtype(name: str) -> GemmDtype:
    """The precision a GEMM kernel's name says (BF16 when it says none of the others)."""
    lowered = name.lower()
    if "sgemm" in lowered:
        return GemmDtype.FP32
    if "tf32" in lowered:
        return GemmDtype.TF32
    if "fp16" in lowered or "h16816gemm" in lowered:
        return GemmDtype.FP16
    return GemmDtype.BF16
