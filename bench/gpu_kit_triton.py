"""The one-GPU kit's streaming kernel (bench/gpu_kit_device.py): imported only where triton is.

Program ``p`` of ``P`` (``P`` = the CTAs asked for, each of ``num_warps`` warps) copies
blocks ``p, p + P, ...`` of ``src`` to ``dst``, ``passes`` times: a CTA that only moves
bytes through DRAM, as an NCCL channel's CTA does. Triton resolves ``tl`` from this
module's globals when it compiles the kernel.
"""

from __future__ import annotations

import triton  # type: ignore[import-not-found,unused-ignore]
import triton.language as tl  # type: ignore[import-not-found,unused-ignore]


@triton.jit
def stream_copy(src, dst, n, passes, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def,unused-ignore]
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    for _ in range(passes):
        for start in range(pid * BLOCK, n, programs * BLOCK):
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(dst + offsets, tl.load(src + offsets, mask=mask), mask=mask)
