"""Public GPU specifications as data, and which row a trace's device is.

One row per device as the runtime sees it (an MI250X is two devices, one per graphics
compute die, so its row is half the package's datasheet figures). Units are in the
field names; each row's source is the comment above it; ``approx`` names the figures
that are estimates rather than published numbers. Where a trace records a number
itself (``deviceProperties.numSms``), the trace's wins (:func:`gpu_spec`).

:func:`match_gpu` reads what a trace records (device name, SMs, memory, compute
capability) and picks a row; how it decided is part of the answer, so a note can say
it. Rules, in order: the model a name spells (``A100`` in ``NVIDIA A100-PG509-200``)
gives the candidate rows; among them the row with the trace's SM count, then the form
the name says (``PCIe``, ``SXM``), then the nearest memory size (40 vs 80 GB), then
table order. A name that spells no model of the table (``AMD Radeon Graphics``, or no
name at all) is matched on SM count and compute capability alone, and only when that
leaves one model.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from costmodel.cluster import GpuSpec

NVIDIA = "nvidia"
AMD = "amd"
REACH_NODE = "node"  # GPU-GPU links reach every GPU of a node (NVSwitch, or a direct mesh)
REACH_PAIRS = "pairs"  # bridges between pairs of cards: a ring over the node still crosses PCIe
REACH_NONE = "none"


@dataclass(frozen=True)
class GpuRow:
    key: str  # the row's name, e.g. "A100-SXM4-40GB"
    model: str  # what a device name spells (lagom.orchestration.trace_context.gpu_model): "A100"
    vendor: str  # NVIDIA or AMD
    form: str  # "sxm", "pcie" or "oam" (the OCP module AMD's Instinct parts come in)
    sm_count: int  # SMs (NVIDIA) or compute units (AMD) of one device
    mem_gb: float  # memory of one device, GB as marketed
    mem_bw_gb_per_s: float  # peak DRAM bandwidth, GB/s = 1e9 bytes/s
    l2_mib: float  # last-level cache the SMs share (L2; AMD's Infinity Cache is not counted)
    bf16_dense_tflops: float  # dense (no sparsity) BF16 matrix peak
    fp32_tflops: float  # FP32 peak on the CUDA cores / vector units
    max_threads_per_sm: int
    max_blocks_per_sm: int
    compute_capability: tuple[int, int]  # CUDA major.minor; AMD: as HIP reports it (gfx90a 9.0, gfx942 9.4)
    nvlink_gen: int | None  # NVLink generation; None: none (AMD's GPU-GPU links are Infinity Fabric)
    link_gb_per_s: float  # GPU-GPU links of one device, per direction, peak, all links together; 0: none
    link_reach: str  # REACH_NODE, REACH_PAIRS or REACH_NONE
    pcie_gen: int
    approx: str = ""  # the figures that are estimates, in words; "" when every figure is published
    aliases: tuple[str, ...] = ()  # other models a device name may spell for this row

    @property
    def link_name(self) -> str:
        if self.nvlink_gen is not None:
            return f"NVLink{self.nvlink_gen}"
        return "Infinity Fabric" if self.vendor == AMD and self.link_gb_per_s > 0 else "none"


# CUDA programming guide, "Features and Technical Specifications": threads / resident blocks per SM
_CC70 = _CC80 = _CC90 = _CC100 = (2048, 32)
_CC86 = (1536, 16)
_CC89 = (1536, 24)
_CDNA = (2048, 32)  # HIP maxThreadsPerMultiProcessor 2048 (the MI250 trace's deviceProperties); 32 blocks: approx

# Columns: key, model, vendor, form, SMs, memory GB, DRAM GB/s, L2 MiB, dense BF16 TFLOP/s, FP32 TFLOP/s,
# threads / blocks per SM, compute capability, NVLink generation, GPU-GPU GB/s per direction, link reach, PCIe gen.
# A row that differs from a sibling only in a few figures is that sibling with those figures replaced.

# NVIDIA V100 datasheet (SXM2): 900 GB/s HBM2, 125 FP16 tensor TFLOP/s, 15.7 FP32, NVLink2 300 GB/s total, PCIe 3;
# Volta whitepaper: 80 SMs, 6 MB L2
_V100_SXM2 = GpuRow("V100-SXM2-16GB", "V100", NVIDIA, "sxm", 80, 16, 900, 6, 125, 15.7, *_CC70, (7, 0), 2, 150,
                    REACH_NODE, 3, approx="BF16: V100 has no BF16 tensor cores, its FP16 tensor peak stands in; "
                                          "NVLink2 reach: DGX-1's hybrid cube mesh, not every pair")
# NVIDIA V100 datasheet (PCIe): 900 GB/s, 112 FP16 tensor TFLOP/s, 14 FP32, no NVLink, PCIe 3
_V100_PCIE = GpuRow("V100-PCIE-16GB", "V100", NVIDIA, "pcie", 80, 16, 900, 6, 112, 14.0, *_CC70, (7, 0), None, 0,
                    REACH_NONE, 3, approx="BF16: no BF16 tensor cores, the FP16 tensor peak stands in")
# NVIDIA A100 datasheet: 1555 GB/s HBM2 (40GB), 312 dense BF16, 19.5 FP32, NVLink3 600 GB/s total, PCIe 4;
# A100 whitepaper: 108 SMs, 40 MB L2. NVIDIA A100-PG509-200 is this board (HGX, 40 GB).
_A100_SXM4 = GpuRow("A100-SXM4-40GB", "A100", NVIDIA, "sxm", 108, 40, 1555, 40, 312, 19.5, *_CC80, (8, 0), 3, 300,
                    REACH_NODE, 4)
ROWS: tuple[GpuRow, ...] = (
    _V100_SXM2,
    replace(_V100_SXM2, key="V100-SXM2-32GB", mem_gb=32),
    _V100_PCIE,
    replace(_V100_PCIE, key="V100-PCIE-32GB", mem_gb=32),
    _A100_SXM4,
    # docs/reference.md §2: A100 SXM 80GB 2039 GB/s HBM2e; the rest as the 40 GB part (A100 datasheet)
    replace(_A100_SXM4, key="A100-SXM4-80GB", mem_gb=80, mem_bw_gb_per_s=2039),
    # NVIDIA A100 datasheet (PCIe 40GB): 1555 GB/s; NVLink bridge 600 GB/s between two cards only
    replace(_A100_SXM4, key="A100-PCIE-40GB", form="pcie", link_reach=REACH_PAIRS),
    # NVIDIA A100 datasheet (PCIe 80GB): 1935 GB/s; NVLink bridge 600 GB/s between two cards only
    replace(_A100_SXM4, key="A100-PCIE-80GB", form="pcie", mem_gb=80, mem_bw_gb_per_s=1935, link_reach=REACH_PAIRS),
    # docs/reference.md §2 (132 SMs, 3350 GB/s, 50 MB L2, 989 dense BF16); H100 datasheet: 67 FP32, NVLink4 900 GB/s
    # total, PCIe 5
    GpuRow("H100-SXM5-80GB", "H100", NVIDIA, "sxm", 132, 80, 3350, 50, 989, 67.0, *_CC90, (9, 0), 4, 450, REACH_NODE,
           5),
    # H100 datasheet (PCIe): 2000 GB/s HBM2e, 756 dense BF16 (1513 sparse), 51 FP32, NVLink bridge 600 GB/s total,
    # PCIe 5; H100 whitepaper: 114 SMs, 50 MB L2
    GpuRow("H100-PCIE-80GB", "H100", NVIDIA, "pcie", 114, 80, 2000, 50, 756, 51.0, *_CC90, (9, 0), 4, 300, REACH_PAIRS,
           5),
    # docs/reference.md §2 (132 SMs, 4800 GB/s, 50 MB L2, 989 dense BF16); H200 datasheet: 141 GB HBM3e, 67 FP32,
    # NVLink4 900 GB/s total, PCIe 5
    GpuRow("H200-SXM-141GB", "H200", NVIDIA, "sxm", 132, 141, 4800, 50, 989, 67.0, *_CC90, (9, 0), 4, 450, REACH_NODE,
           5),
    # NVIDIA Blackwell datasheet, HGX B200 at 1000 W: 2250 dense BF16, 80 FP32, 8 TB/s HBM3e, NVLink5 1.8 TB/s total,
    # PCIe 6; DGX B200: 1440 GB over 8 GPUs; 148 SMs (chipsandcheese.com, "Nvidia's B200")
    GpuRow("B200-SXM-180GB", "B200", NVIDIA, "sxm", 148, 180, 8000, 126, 2250, 80.0, *_CC100, (10, 0), 5, 900,
           REACH_NODE, 6, approx="L2 126 MB: NVIDIA publishes no figure"),
    # NVIDIA Blackwell datasheet, GB200 at 1200 W: 2500 dense BF16, 90 FP32, 8 TB/s; GB200 NVL72: 13.4 TB HBM3e over
    # 72 GPUs, NVLink5 1.8 TB/s total per GPU
    GpuRow("GB200", "GB200", NVIDIA, "sxm", 148, 186, 8000, 126, 2500, 90.0, *_CC100, (10, 0), 5, 900, REACH_NODE, 6,
           approx="SMs (B200's 148) and L2 126 MB: NVIDIA publishes no figure for GB200"),
    # NVIDIA L40S datasheet: 48 GB GDDR6 864 GB/s, 362 dense BF16 (733 sparse), 91.6 FP32, PCIe 4, no NVLink;
    # Ada whitepaper (AD102): 142 SMs, 96 MB L2
    GpuRow("L40S", "L40S", NVIDIA, "pcie", 142, 48, 864, 96, 362, 91.6, *_CC89, (8, 9), None, 0, REACH_NONE, 4),
    # docs/reference.md §2 (84 SMs, 696 GB/s, 6 MB L2, ~150 dense BF16); A40 datasheet: 48 GB, 149.7 BF16, 37.4 FP32,
    # NVLink bridge 112.5 GB/s total between two cards, PCIe 4
    GpuRow("A40", "A40", NVIDIA, "pcie", 84, 48, 696, 6, 149.7, 37.4, *_CC86, (8, 6), 3, 56.25, REACH_PAIRS, 4),
    # AWS G5 (A10G): 24 GB GDDR6 600 GB/s; 80 SMs (deviceQuery on G5); GA102: 6 MB L2; PCIe 4, no NVLink
    GpuRow("A10G", "A10G", NVIDIA, "pcie", 80, 24, 600, 6, 70, 35.0, *_CC86, (8, 6), None, 0, REACH_NONE, 4,
           approx="BF16 70 and FP32 35 TFLOP/s: NVIDIA publishes no A10G datasheet (the A10's are 125 and 31.2)"),
    # ROCm GPU specifications: MI250X 220 CUs (110 per GCD), 128 GiB (64 per GCD), 8 MiB L2 per GCD; MI250X
    # datasheet: 383 BF16, 47.9 FP32 vector, 3.2 TB/s, per package of two GCDs (halved here); PCIe 4; ROCm MI250
    # microarchitecture: 50 GB/s per Infinity Fabric link and direction
    GpuRow("MI250X-GCD", "MI250X", AMD, "oam", 110, 64, 1638.4, 8, 191.5, 23.95, *_CDNA, (9, 0), None, 100, REACH_NODE,
           4, approx="Infinity Fabric: two links per GCD towards the node's other GCDs assumed; blocks per CU",
           aliases=("MI250",)),
    # ROCm GPU specifications: MI250 208 CUs (104 per GCD), 64 GiB and 8 MiB L2 per GCD; MI250 datasheet: 362.1 BF16,
    # 45.3 FP32 vector, 3.2 TB/s per package (halved here). An MI210 (one 104-CU die, 64 GB) has the same figures.
    GpuRow("MI250-GCD", "MI250", AMD, "oam", 104, 64, 1638.4, 8, 181.05, 22.65, *_CDNA, (9, 0), None, 100, REACH_NODE,
           4, approx="Infinity Fabric: two links per GCD towards the node's other GCDs assumed; blocks per CU",
           aliases=("MI250X", "MI210")),
    # ROCm GPU specifications: 304 CUs, 192 GiB, 32 MiB L2 (256 MiB Infinity Cache not counted); MI300X datasheet:
    # 5.3 TB/s HBM3, 1307.4 dense BF16, 163.4 FP32, 7 Infinity Fabric links of 128 GB/s (both directions) to the
    # other 7 GPUs of a node, PCIe 5
    GpuRow("MI300X", "MI300X", AMD, "oam", 304, 192, 5300, 32, 1307.4, 163.4, *_CDNA, (9, 4), None, 448, REACH_NODE, 5,
           approx="blocks per CU"),
)

# A GPU model in a device name: one or two letters and two or three digits, optionally a
# letter (A100, H100, A40, V100, B200, GB200, L40S, A10G, MI250X), not inside a longer token.
_MODEL_RE = re.compile(r"(?<![A-Z0-9])([A-Z]{1,2}\d{2,3}[A-Z]?)(?![A-Z0-9])")
_AMD_RE = re.compile(r"\b(AMD|RADEON|INSTINCT)\b")
_MEM_RE = re.compile(r"(?<![0-9])(\d{2,3})\s*GB\b")
_GIB = float(1 << 30)


def device_model(device_name: str | None) -> str | None:
    """The GPU model a device name spells (``NVIDIA A100-PG509-200`` -> ``A100``), or None."""
    if not device_name:
        return None
    m = _MODEL_RE.search(device_name.upper())
    return m.group(1) if m else None


def is_amd_name(device_name: str | None) -> bool:
    return device_name is not None and _AMD_RE.search(device_name.upper()) is not None


@dataclass(frozen=True)
class DeviceFacts:
    """What a trace records of its device (``deviceProperties[0]``), each None when absent."""

    name: str | None = None
    sm_count: int | None = None  # numSms
    mem_bytes: int | None = None  # totalGlobalMem
    compute_capability: tuple[int, int] | None = None  # computeMajor, computeMinor


@dataclass(frozen=True)
class GpuMatch:
    row: GpuRow  # the first of ``fits``
    basis: str  # how the row was chosen, e.g. "name A100, 40 GB"
    fits: tuple[GpuRow, ...]  # every row the trace's facts fit equally (several when it records no memory size)


def match_gpu(facts: DeviceFacts) -> GpuMatch | None:
    """The table row for a device (see the module doc), or None when the table has no row for it."""
    model = device_model(facts.name)
    amd = is_amd_name(facts.name)
    mem_gb = facts.mem_bytes / _GIB if facts.mem_bytes else _name_memory_gb(facts.name)
    candidates = [r for r in ROWS if model is not None and model in (r.model, *r.aliases)]
    if candidates:
        basis = f"name {model}"
    else:  # the name says no model of the table: SM count and compute capability, one model only
        if facts.sm_count is None:
            return None
        candidates = [r for r in ROWS if r.sm_count == facts.sm_count
                      and (facts.compute_capability is None or r.compute_capability == facts.compute_capability)
                      and (not amd or r.vendor == AMD)]
        if not candidates or (len({r.model for r in candidates}) > 1 and mem_gb is None):
            return None
        basis = f"{facts.sm_count} {'CUs' if candidates[0].vendor == AMD else 'SMs'}"
        if facts.compute_capability is not None:
            basis += f", compute capability {facts.compute_capability[0]}.{facts.compute_capability[1]}"
    form = _name_form(facts.name)

    def rank(row: GpuRow) -> tuple[int, int, int, float]:
        return (int(facts.sm_count is not None and row.sm_count != facts.sm_count),
                int(form is not None and row.form != form),
                int(model is not None and row.model != model),
                round(abs(math.log(mem_gb / row.mem_gb)), 6) if mem_gb else 0.0)

    best_rank = min(rank(r) for r in candidates)
    fits = tuple(r for r in candidates if rank(r) == best_rank)  # table order
    unit = "CUs" if candidates[0].vendor == AMD else "SMs"
    if model is not None and facts.sm_count is not None and len({r.sm_count for r in candidates}) > 1:
        basis += f", {facts.sm_count} {unit}"
    if mem_gb and len({r.mem_gb for r in candidates}) > 1:
        basis += f", {facts.mem_bytes / 1e9:.1f} GB" if facts.mem_bytes else f", {mem_gb:.0f} GB"
    if form is not None and len({r.form for r in candidates}) > 1:
        basis += ", SXM" if form == "sxm" else ", PCIe"
    return GpuMatch(fits[0], basis, fits)


def gpu_spec(row: GpuRow, sm_count: int | None = None) -> GpuSpec:
    """The ClusterSpec GPU of a row; ``sm_count`` (the trace's) wins over the table's."""
    return GpuSpec(
        name=row.key,
        sm_count=sm_count or row.sm_count,
        mem_bw_gb_per_s=row.mem_bw_gb_per_s,
        l2_bytes=int(row.l2_mib * (1 << 20)),
        peak_tflops=row.bf16_dense_tflops,
        max_threads_per_sm=row.max_threads_per_sm,
        max_blocks_per_sm=row.max_blocks_per_sm,
        fp32_tflops=row.fp32_tflops,
    )


def row_by_key(key: str) -> GpuRow | None:
    return next((r for r in ROWS if r.key == key), None)


def _name_form(name: str | None) -> str | None:
    upper = (name or "").upper()
    if "PCIE" in upper:
        return "pcie"
    if "SXM" in upper:
        return "sxm"
    return None


def _name_memory_gb(name: str | None) -> float | None:
    m = _MEM_RE.search((name or "").upper())
    return float(m.group(1)) if m else None
