"""ClusterSpec: the hardware and NCCL facts every Evaluator and the tuner work from.

A cluster is a YAML file: a preset shipped in ``costmodel/presets/NAME.yaml`` or a
file written by ``lagom calibrate``. Schema (units in the key names)::

    name: low-bw
    nodes: 2
    gpus_per_node: 8
    nccl_version: "2.18.3"
    gpu:
      name: A40
      sm_count: 84
      mem_bw_gb_per_s: 696          # GB/s = 1e9 bytes/s
      l2_bytes: 6291456
      peak_tflops: 149.7            # dense BF16 tensor-core TFLOP/s
      max_threads_per_sm: 1536
      max_blocks_per_sm: 16
      fp32_tflops: 37.4             # optional: CUDA-core FP32 TFLOP/s (FP32 GEMMs)
    intra_node:
      kind: pcie                    # pcie | nvlink | nvswitch
      bw_gb_per_s: 25.0             # per GPU, per direction, achievable
      latency_us: 1.0               # per hop
      copy_engine_bw_gb_per_s: 376  # optional: what the copy engines reach over the link (default: bw_gb_per_s)
      nvls: false                   # optional: the NVLink domain's switches reduce (NVLink SHARP, NVSwitch 3+)
    inter_node:
      nics_per_node: 1
      nic_bw_gb_per_s: 12.5         # per NIC, per direction
      latency_us: 5.0
      collnet: false                # optional: the network reduces in-switch (SHARP/CollNet plugin)
    nccl_graph:                     # optional: what NCCL's topology search finds (costmodel.nccl_defaults)
      type_intra: pci               # pci | nvl: the ring's intra-node path class
      ring_channels: 1              # rings found by the search, before init doubles them
      ring_bw_intra_gb_per_s: 24.0  # per-channel bandwidth the search settled on
      ring_bw_inter_gb_per_s: 12.0
      compute_capability: 86
    nccl_defaults: {}               # optional overrides of NCCL's modelled choices
    sim: {}                         # simulator mechanism constants (costmodel.sim)
    model: {}                       # fitted analytic-model parameters (costmodel.analytic)

Every number in a preset carries a source comment. :func:`load_cluster` raises
LagomError naming the file and the key on bad input.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from nccl_env.errors import LagomError
from nccl_env.files import check_keys, check_not_empty, read_yaml
from nccl_env.nccl_releases import released_version
from nccl_env.rules import NcclVersion, Topology
from traces.limits import MAX_GPUS_PER_NODE, MAX_NODES, check_bound

INTRA_KINDS = ("pcie", "nvlink", "nvswitch")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    sm_count: int
    mem_bw_gb_per_s: float
    l2_bytes: int
    peak_tflops: float
    max_threads_per_sm: int
    max_blocks_per_sm: int
    fp32_tflops: float | None = None  # CUDA-core FP32 peak (FP32 GEMMs); None: not given


@dataclass(frozen=True)
class IntraNodeSpec:
    kind: str  # one of INTRA_KINDS
    bw_gb_per_s: float  # per GPU, per direction
    latency_us: float
    copy_engine_bw_gb_per_s: float | None = None  # per GPU, per direction, copy engines (None: bw_gb_per_s)
    nvls: bool = False  # the NVLink switches reduce in-switch (NVLink SHARP): NCCL may pick NVLS / NVLSTree

    @property
    def copy_engine_bw(self) -> float:
        """GB/s the copy engines reach over the link (a measured figure, else the link's)."""
        return self.copy_engine_bw_gb_per_s if self.copy_engine_bw_gb_per_s is not None else self.bw_gb_per_s


@dataclass(frozen=True)
class InterNodeSpec:
    nics_per_node: int
    nic_bw_gb_per_s: float  # per NIC, per direction
    latency_us: float
    collnet: bool = False  # the network reduces in-switch (CollNet): NCCL may pick CollNetDirect / CollNetChain


@dataclass
class ClusterSpec:
    name: str
    nodes: int
    gpus_per_node: int
    nccl_version: NcclVersion
    gpu: GpuSpec
    intra_node: IntraNodeSpec
    inter_node: InterNodeSpec
    nccl_defaults: dict = field(default_factory=dict)
    nccl_graph: dict = field(default_factory=dict)
    sim: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    source: str = ""  # file it was loaded from

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def path_topology(self) -> Topology:
        """What the path rules (``nccl_env.rules.collective_mechanism``) need: every GPU pair of
        a node on NVLink (an NVSwitch node), and whether its switches reduce (NVLS)."""
        return Topology(all_nvlink=self.intra_node.kind == "nvswitch", nvls=self.intra_node.nvls)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.pop("source")
        out["nccl_version"] = str(self.nccl_version)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml())


def preset_names() -> list[str]:
    folder = resources.files("costmodel") / "presets"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_cluster(name_or_path: str | Path) -> ClusterSpec:
    """A preset name (``low-bw``) or a path to a cluster YAML file."""
    check_not_empty(name_or_path if isinstance(name_or_path, str) else str(name_or_path), "--cluster")
    text_name = str(name_or_path)
    path = Path(text_name)
    if not path.exists() and "/" not in text_name and not text_name.endswith((".yaml", ".yml")):
        candidate = resources.files("costmodel") / "presets" / f"{text_name}.yaml"
        if not candidate.is_file():
            names = ", ".join(preset_names())
            raise LagomError(f"unknown cluster {text_name!r}: not a file and not a preset ({names})")
        return parse_cluster(yaml.safe_load(candidate.read_text()), f"preset {text_name}")
    spec = parse_cluster(read_yaml(path), str(path))
    spec.source = str(path)
    return spec


CLUSTER_KEYS = ("name", "nodes", "gpus_per_node", "nccl_version", "gpu", "intra_node", "inter_node",
                "nccl_defaults", "nccl_graph", "sim", "model")

# The physical range of every number of a cluster file (section.key: lowest, highest), checked by
# parse_cluster for every command that reads one: past it a file describes no hardware (bw 1e-300 GB/s
# or 10^12 SMs simulated an iteration of 8.65e307 us). nodes and gpus_per_node: traces.limits.
BOUNDS: dict[str, tuple[float, float]] = {
    "gpu.sm_count": (1, 1024),  # B200: 148 SMs, MI300X: 304 CUs (the largest today); 1024 leaves room
    "gpu.mem_bw_gb_per_s": (1.0, 100_000.0),  # B200 HBM3e: 8,000 GB/s; 12x room
    "gpu.l2_bytes": (1 << 10, 1 << 34),  # MI300X Infinity Cache 256 MB, B200 L2 126 MB; 16 GiB leaves room
    "gpu.peak_tflops": (0.01, 100_000.0),  # B200 dense BF16: 2,250 TFLOP/s; 40x room
    "gpu.max_threads_per_sm": (32, 4096),  # a warp at least; CUDA CC 8.x-10.x: 1,536-2,048
    "gpu.max_blocks_per_sm": (1, 256),  # CUDA CC 8.x-10.x: 16-32 resident blocks per SM
    "gpu.fp32_tflops": (0.01, 100_000.0),  # B200 FP32: 80 TFLOP/s
    "intra_node.bw_gb_per_s": (0.1, 10_000.0),  # PCIe 3 x16 ~12 GB/s .. NVLink 5: 900 GB/s per direction
    "intra_node.latency_us": (0.0, 1_000.0),  # NCCL tuning.cc hwLat: 0.4-1.0 us a hop; 1 ms is no interconnect
    "intra_node.copy_engine_bw_gb_per_s": (0.1, 10_000.0),  # as the link's bandwidth
    "inter_node.nics_per_node": (1, 1024),  # DGX: 8 NICs; never more than MAX_GPUS_PER_NODE
    "inter_node.nic_bw_gb_per_s": (0.1, 10_000.0),  # 1 GbE: 0.125 GB/s .. 800 Gb/s XDR: 100 GB/s
    "inter_node.latency_us": (0.0, 1_000.0),  # NCCL tuning.cc hwLat[NET]: 2.7-5 us; 1 ms is no fabric
}


def parse_cluster(data: object, origin: str) -> ClusterSpec:
    def bad(msg: str) -> LagomError:
        return LagomError(f"{origin}: {msg}")

    if not isinstance(data, dict):
        raise bad("not a cluster file (expected a YAML mapping)")

    def section(key: str) -> dict:
        value = data.get(key)
        if not isinstance(value, dict):
            raise bad(f"missing or malformed '{key}' section")
        return value

    def number(sec: dict, sec_name: str, key: str, kind: type, minimum: float = 0.0) -> float:
        if key not in sec:
            raise bad(f"'{sec_name}.{key}' is missing")
        raw = sec[key]
        if isinstance(raw, bool) or (kind is int and isinstance(raw, float) and not raw.is_integer()):
            raise bad(f"'{sec_name}.{key}' must be {'an integer' if kind is int else 'a number'}, got {raw!r}")
        try:
            value = kind(raw)
        except (TypeError, ValueError, OverflowError):
            what = "an integer" if kind is int else "a number"
            raise bad(f"'{sec_name}.{key}' must be {what}, got {raw!r}") from None
        if not math.isfinite(value):
            raise bad(f"'{sec_name}.{key}' must be finite, got {raw!r}")
        if value <= minimum:
            raise bad(f"'{sec_name}.{key}' must be > {minimum}, got {value}")
        low, high = BOUNDS.get(f"{sec_name}.{key}", (-math.inf, math.inf))
        if not low <= value <= high:
            raise bad(f"'{sec_name}.{key}' = {raw!r} is outside the physical range {_plain(low)}..{_plain(high)}")
        return value

    check_keys(data, CLUSTER_KEYS, origin)
    gpu = section("gpu")
    intra = section("intra_node")
    inter = section("inter_node")
    kind = str(intra.get("kind", ""))
    if kind not in INTRA_KINDS:
        raise bad(f"'intra_node.kind' must be one of {', '.join(INTRA_KINDS)}, got {kind!r}")

    def flag(sec: dict, sec_name: str, key: str) -> bool:
        raw = sec.get(key, False)
        if not isinstance(raw, bool):
            raise bad(f"'{sec_name}.{key}' must be true or false, got {raw!r}")
        return raw

    nvls = flag(intra, "intra_node", "nvls")
    if nvls and kind != "nvswitch":
        raise bad(f"'intra_node.nvls' needs NVSwitch ('intra_node.kind: nvswitch'), got {kind!r}")
    try:
        version = released_version(data.get("nccl_version", "2.18.3"), "'nccl_version'")
    except LagomError as exc:
        raise bad(str(exc)) from None
    for key in ("nccl_defaults", "nccl_graph", "sim", "model"):
        if data.get(key) is not None and not isinstance(data.get(key), dict):
            raise bad(f"'{key}' must be a mapping")
    nodes = int(number(data, "", "nodes", int))
    gpus_per_node = int(number(data, "", "gpus_per_node", int))
    check_bound("nodes", nodes, MAX_NODES, origin)
    check_bound("gpus_per_node", gpus_per_node, MAX_GPUS_PER_NODE, origin)
    spec = ClusterSpec(
        name=str(data.get("name", origin)),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        nccl_version=version,
        gpu=GpuSpec(
            name=str(gpu.get("name", "gpu")),
            sm_count=int(number(gpu, "gpu", "sm_count", int)),
            mem_bw_gb_per_s=number(gpu, "gpu", "mem_bw_gb_per_s", float),
            l2_bytes=int(number(gpu, "gpu", "l2_bytes", int)),
            peak_tflops=number(gpu, "gpu", "peak_tflops", float),
            max_threads_per_sm=int(number(gpu, "gpu", "max_threads_per_sm", int)),
            max_blocks_per_sm=int(number(gpu, "gpu", "max_blocks_per_sm", int)),
            fp32_tflops=number(gpu, "gpu", "fp32_tflops", float) if gpu.get("fp32_tflops") is not None else None,
        ),
        intra_node=IntraNodeSpec(
            kind=kind,
            bw_gb_per_s=number(intra, "intra_node", "bw_gb_per_s", float),
            latency_us=number(intra, "intra_node", "latency_us", float, -1e-12),
            copy_engine_bw_gb_per_s=(number(intra, "intra_node", "copy_engine_bw_gb_per_s", float)
                                     if intra.get("copy_engine_bw_gb_per_s") is not None else None),
            nvls=nvls,
        ),
        inter_node=InterNodeSpec(
            nics_per_node=int(number(inter, "inter_node", "nics_per_node", int)),
            nic_bw_gb_per_s=number(inter, "inter_node", "nic_bw_gb_per_s", float),
            latency_us=number(inter, "inter_node", "latency_us", float, -1e-12),
            collnet=flag(inter, "inter_node", "collnet"),
        ),
        nccl_defaults=dict(data.get("nccl_defaults") or {}),
        nccl_graph=dict(data.get("nccl_graph") or {}),
        sim=dict(data.get("sim") or {}),
        model=dict(data.get("model") or {}),
    )
    check_mechanism_sections(spec, origin)
    return spec


def _plain(x: float) -> str:
    """A bound as a person reads it: 1,024 or 0.1."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


def check_mechanism_sections(spec: ClusterSpec, origin: str) -> None:
    """The ``sim:`` and ``model:`` sections checked here, by their own modules' rules, so every command
    refuses the same file (``sim.gemm_efficiency: 2`` was refused by simulate and accepted by tune)."""
    from costmodel.analytic.params import params_for  # they import this module: imported when used
    from costmodel.sim.params import sim_params

    prefix = f"cluster {spec.name}: "
    for check in (sim_params, params_for):
        try:
            check(spec)
        except LagomError as exc:
            raise LagomError(f"{origin}: {str(exc).removeprefix(prefix)}") from None
