"""The simulator held against measurements other people made (``bench/fidelity.py`` prints them).

A cases file is ``{"format": "lagom.published-cases", "version": 1, "cases": [CASE, ...]}``;
every case has ``id``, ``source``, ``note``, ``kind``, ``cluster`` (a preset name) and the
fields of its kind (docs/simulator.md, "Published measurements"). :func:`load_cases`
validates a file (a :class:`~nccl_env.errors.LagomError` naming the case and the field
otherwise); :func:`run_case` asks the simulator, noise off, for the case's quantity:

* ``collective_vs_channels``: the collective alone at each channel count, minus its mean
  over ``plateau_channels``; a point holds when ``|model - delta| <= max(relative x |delta|,
  absolute_us)``;
* ``busbw_ceiling``: nccl-tests bus bandwidth of the collective alone under NCCL's default;
* ``gemm_beside_collective``: the GEMM's time with the collective running beside it for the
  GEMM's whole duration (back-to-back copies on a communication stream), over its time alone;
* ``compute_slowdown_range``: each workload's iteration under NCCL's defaults; over every
  compute kernel a collective overlaps, the slowdown is time beside / time alone. The mean is
  the duration-weighted mean over all workloads' overlapped kernels (total time beside over
  total time alone); the largest is the largest *workload's* such mean, because published
  ranges are aggregates per experiment (a per-kernel maximum, which one wave-quantised kernel
  sets, is reported in the detail but not judged);
* ``overlap_vs_sequential``: one iteration of a GEMM and a collective on the case's NCCL
  version: one after the other on one stream (``sequential``, NCCL's defaults), and started
  together on two streams under each CTA policy measured (``overlap``: ``default`` is NCCL's
  defaults; ``zero`` puts the collective's group on the copy-engine path, buffers registered;
  ``efficiency`` on CTA policy EFFICIENCY, whose only effect, NCCL's NVLS re-selection, no
  preset models); each figure holds within ``relative``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from costmodel.evaluator import MODELLED_ALGORITHMS
from costmodel.sim.simulator import Simulator, tiny_overlap_workload
from nccl_env.errors import LagomError
from nccl_env.files import read_text
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.rules import NcclVersion
from traces.gemm_names import GemmDtype
from traces.generate import gemm_op, generate_workload
from traces.intervals import CoverIndex, union
from traces.workload import ComputeOp, Stream, StreamKind, Workload

FORMAT = "lagom.published-cases"
VERSION = 1
_GROUP = "published"


# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One printed line: a quantity, the model's and the measured value, the tolerance, the verdict."""

    label: str
    model: str
    measured: str
    tolerance: str
    holds: bool | None  # None: shown for information, not judged


@dataclass
class CaseResult:
    id: str
    kind: str
    holds: bool
    model: Any  # JSON-ready, same shape as ``measured`` where the kind allows
    measured: Any
    detail: dict
    rows: list[Row] = field(default_factory=list)  # first row: the case; more: its points/quantities

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "holds": self.holds, "model": self.model,
                "measured": self.measured, "detail": self.detail}


# ---- reading a cases file -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelSweep:
    signature: Signature
    algorithm: Algorithm
    protocol: Protocol
    plateau_channels: tuple[int, ...]
    points: tuple[tuple[int, float], ...]  # (channels, measured delta_us)
    relative: float
    absolute_us: float


@dataclass(frozen=True)
class BusbwCeiling:
    signature: Signature
    busbw_gb_per_s: float
    relative: float


@dataclass(frozen=True)
class GemmBeside:
    gemm: ComputeOp
    signature: Signature
    config: CommConfig
    slowdown_min: float
    slowdown_max: float


@dataclass(frozen=True)
class SlowdownRange:
    workloads: tuple[tuple[str, Workload], ...]
    mean_min: float
    mean_max: float
    largest_max: float


@dataclass(frozen=True)
class OverlapVsSequential:
    gemm: ComputeOp
    signature: Signature
    nccl_version: NcclVersion
    published_nccl: str  # the version as the publication gives it (e.g. "2.28"), for the report
    sequential_ms: float
    overlap_ms: tuple[tuple[str, float], ...]  # (CTA policy, measured ms)
    relative: float


Quantity = ChannelSweep | BusbwCeiling | GemmBeside | SlowdownRange | OverlapVsSequential

# The path each CTA policy of an ``overlap_vs_sequential`` case puts the collective's group on.
POLICY_PATHS: dict[str, CommPath | None] = {"default": None, "efficiency": CommPath.EFFICIENCY,
                                            "zero": CommPath.COPY_ENGINE}


@dataclass(frozen=True)
class Case:
    """One published measurement, validated: what the simulator is asked and what was measured."""

    id: str
    kind: str
    source: str
    cluster: ClusterSpec
    quantity: Quantity


class _Fields:
    """Typed access to one case's fields; every error names the case and the field."""

    def __init__(self, where: str, data: dict):
        self.where = where
        self.data = data

    def error(self, message: str) -> LagomError:
        return LagomError(f"{self.where}: {message}")

    def raw(self, key: str, data: dict | None = None, prefix: str = "") -> Any:
        data = self.data if data is None else data
        if key not in data:
            raise self.error(f"missing field '{prefix}{key}'")
        return data[key]

    def mapping(self, key: str, data: dict | None = None, prefix: str = "") -> dict:
        value = self.raw(key, data, prefix)
        if not isinstance(value, dict):
            raise self.error(f"'{prefix}{key}' must be an object, got {value!r}")
        return value

    def text(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"'{key}' must be a non-empty string, got {value!r}")
        return value

    def integer(self, key: str, data: dict | None = None, prefix: str = "") -> int:
        value = self.raw(key, data, prefix)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value) or value < 1:
            raise self.error(f"'{prefix}{key}' must be an integer >= 1, got {value!r}")
        return int(value)

    def number(self, key: str, data: dict | None = None, prefix: str = "", signed: bool = False) -> float:
        value = self.raw(key, data, prefix)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(f"'{prefix}{key}' must be a finite number, got {value!r}")
        if value < 0 and not signed:
            raise self.error(f"'{prefix}{key}' must be >= 0, got {value!r}")
        return float(value)

    def bounds(self, key: str, low: str | None, high: str) -> tuple[float, float]:
        """(low, high) of a ``{"min", "max"}`` object (low 0 when ``low`` is None), low <= high."""
        data = self.mapping(key)
        lo = self.number(low, data, f"{key}.") if low else 0.0
        hi = self.number(high, data, f"{key}.")
        if lo > hi:
            raise self.error(f"'{key}.{low}' {lo:g} is above '{key}.{high}' {hi:g}")
        return lo, hi


def load_cases(path: str | Path) -> list[Case]:
    """Every case of a ``lagom.published-cases`` file, validated; LagomError (one line) otherwise."""
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise LagomError(f"{path}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse_cases(data, str(path))


def parse_cases(data: object, origin: str) -> list[Case]:
    if not isinstance(data, dict):
        raise LagomError(f"{origin}: not a {FORMAT} file (expected a JSON object)")
    if data.get("format") != FORMAT:
        raise LagomError(f"{origin}: 'format' is {data.get('format')!r}, expected {FORMAT!r}")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise LagomError(f"{origin}: {FORMAT} version {version!r} is not supported (this runner reads "
                         f"version {VERSION})")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        raise LagomError(f"{origin}: 'cases' must be a non-empty list")
    out: list[Case] = []
    seen: set[str] = set()
    for index, raw in enumerate(cases):
        case = _parse_case(raw, f"{origin}: case {index + 1}")
        if case.id in seen:
            raise LagomError(f"{origin}: case {index + 1}: id {case.id!r} is used twice")
        seen.add(case.id)
        out.append(case)
    return out


def _parse_case(raw: object, where: str) -> Case:
    if not isinstance(raw, dict):
        raise LagomError(f"{where}: must be an object, got {raw!r}")
    f = _Fields(where, raw)
    case_id = f.text("id")
    f.where = f"{where} ({case_id})"
    kind = f.text("kind")
    if kind not in _KINDS:
        raise f.error(f"unknown kind {kind!r} (known: {', '.join(KINDS)})")
    source = f.text("source")
    f.text("note")
    preset = f.text("cluster")
    if preset not in preset_names():
        raise f.error(f"unknown preset {preset!r} (presets: {', '.join(preset_names())})")
    cluster = load_cluster(preset)
    return Case(case_id, kind, source, cluster, _KINDS[kind](f, cluster))


def _signature(f: _Fields, cluster: ClusterSpec, data: dict | None = None, prefix: str = "") -> Signature:
    name = f.raw("collective", data, prefix)
    try:
        collective = CollectiveType.parse(name) if isinstance(name, str) else None
    except ValueError:
        collective = None
    if collective is None:
        known = ", ".join(c.value for c in CollectiveType)
        raise f.error(f"'{prefix}collective' {name!r} is not a collective ({known})")
    message_bytes = f.integer("bytes", data, prefix)
    ranks = f.integer("ranks", data, prefix)
    nodes = f.integer("nodes", data, prefix)
    if ranks % nodes or ranks // nodes > cluster.gpus_per_node:
        raise f.error(f"{ranks} ranks on {nodes} node(s) do not fit {cluster.name}'s {cluster.gpus_per_node} "
                      "GPUs per node evenly")
    return Signature(_GROUP, collective, message_bytes, ranks, nodes)


def _channels(f: _Fields, cluster: ClusterSpec, key: str, data: dict | None = None, prefix: str = "") -> int:
    value = f.integer(key, data, prefix)
    if value >= cluster.gpu.sm_count:
        raise f.error(f"'{prefix}{key}' {value} leaves no SM for compute on {cluster.name} "
                      f"({cluster.gpu.sm_count} SMs)")
    return value


def _enum(f: _Fields, key: str, enum_cls: type[Algorithm] | type[Protocol], modelled: tuple) -> Any:
    value = f.raw(key)
    names = ", ".join(m.name.lower() for m in modelled)
    if not isinstance(value, str) or value.strip().upper() not in enum_cls.__members__:
        raise f.error(f"'{key}' {value!r} is not one of {names}")
    member = enum_cls[value.strip().upper()]
    if member not in modelled:
        raise f.error(f"'{key}' {value!r}: the simulator models only {names}")
    return member


def _channel_sweep(f: _Fields, cluster: ClusterSpec) -> ChannelSweep:
    plateau = f.raw("plateau_channels")
    if not isinstance(plateau, list) or not plateau:
        raise f.error(f"'plateau_channels' must be a non-empty list of channel counts, got {plateau!r}")
    points = f.raw("points")
    if not isinstance(points, list) or not points or not all(isinstance(p, dict) for p in points):
        raise f.error(f"'points' must be a non-empty list of {{\"channels\", \"delta_us\"}}, got {points!r}")
    tolerance = f.mapping("tolerance")
    return ChannelSweep(
        signature=_signature(f, cluster),
        algorithm=_enum(f, "algorithm", Algorithm, MODELLED_ALGORITHMS),
        protocol=_enum(f, "protocol", Protocol, tuple(Protocol)),
        plateau_channels=tuple(_channels(f, cluster, "channels", {"channels": c}, f"plateau_channels[{i}].")
                               for i, c in enumerate(plateau)),
        points=tuple((_channels(f, cluster, "channels", p, f"points[{i}]."),
                      f.number("delta_us", p, f"points[{i}].", signed=True)) for i, p in enumerate(points)),
        relative=f.number("relative", tolerance, "tolerance."),
        absolute_us=f.number("absolute_us", tolerance, "tolerance."),
    )


def _busbw_ceiling(f: _Fields, cluster: ClusterSpec) -> BusbwCeiling:
    busbw = f.number("busbw_GBps")
    if busbw <= 0:
        raise f.error(f"'busbw_GBps' must be > 0, got {busbw:g}")
    return BusbwCeiling(_signature(f, cluster), busbw, f.number("relative", f.mapping("tolerance"), "tolerance."))


def _gemm(f: _Fields, cluster: ClusterSpec, gemm: dict) -> ComputeOp:
    m, n, k = (f.integer(key, gemm, "gemm.") for key in ("m", "n", "k"))
    dtype_name = f.raw("dtype", gemm, "gemm.")
    dtypes = {d.value: d for d in GemmDtype}
    if not isinstance(dtype_name, str) or dtype_name.strip().lower() not in dtypes:
        raise f.error(f"'gemm.dtype' {dtype_name!r} is not one of {', '.join(dtypes)}")
    dtype = dtypes[dtype_name.strip().lower()]
    if dtype.peak_rate(cluster.gpu.peak_tflops, cluster.gpu.fp32_tflops) is None:
        raise f.error(f"an FP32 GEMM needs the GPU's FP32 peak: preset {cluster.name} has no gpu.fp32_tflops")
    blocks = f.integer("grid_blocks", gemm, "gemm.") if gemm.get("grid_blocks") is not None else None
    return gemm_op(f"gemm {m}x{n}x{k} {dtype.value}", m, n, k, grid_blocks=blocks, stream=1, dtype=dtype)


def _gemm_beside(f: _Fields, cluster: ClusterSpec) -> GemmBeside:
    gemm = f.mapping("gemm")
    f.integer("grid_blocks", gemm, "gemm.")  # required here: the measured launch's blocks
    op = _gemm(f, cluster, gemm)
    coll = f.mapping("collective")
    signature = _signature(f, cluster, coll, "collective.")
    channels = _channels(f, cluster, "channels", coll, "collective.")
    low, high = f.bounds("slowdown", "min", "max")
    return GemmBeside(op, signature, CommConfig(channels=channels), low, high)


def _slowdown_range(f: _Fields, cluster: ClusterSpec) -> SlowdownRange:
    specs = f.raw("workloads")
    if not isinstance(specs, list) or not specs or not all(isinstance(s, str) for s in specs):
        raise f.error(f"'workloads' must be a non-empty list of workload spec strings, got {specs!r}")
    workloads = []
    for spec in specs:
        try:
            workload = generate_workload(spec)
        except LagomError as exc:
            raise f.error(f"workload {spec!r}: {exc}") from None
        if workload.world_size > cluster.world_size:
            raise f.error(f"workload {spec!r} needs {workload.world_size} GPUs; {cluster.name} has "
                          f"{cluster.world_size}")
        workloads.append((spec, workload))
    mean_min, mean_max = f.bounds("slowdown_mean", "min", "max")
    _, largest_max = f.bounds("slowdown_max", None, "max")
    return SlowdownRange(tuple(workloads), mean_min, mean_max, largest_max)


def _overlap_vs_sequential(f: _Fields, cluster: ClusterSpec) -> OverlapVsSequential:
    published = f.text("nccl_version")
    try:
        version = NcclVersion.parse(published)  # a publication may name the minor only: not a release check
    except LagomError as exc:
        raise f.error(f"'nccl_version': {exc}") from None
    measured = f.mapping("measured_ms")
    overlap = f.mapping("overlap", measured, "measured_ms.")
    if not overlap:
        raise f.error("'measured_ms.overlap' must name at least one CTA policy")
    unknown = set(overlap) - set(POLICY_PATHS)
    if unknown:
        raise f.error(f"'measured_ms.overlap' has CTA policy {sorted(unknown)[0]!r} (known: {', '.join(POLICY_PATHS)})")
    values = tuple((policy, f.number(policy, overlap, "measured_ms.overlap.")) for policy in POLICY_PATHS
                   if policy in overlap)
    if any(ms <= 0 for _, ms in values):
        raise f.error("every 'measured_ms.overlap' figure must be > 0")
    sequential = f.number("sequential", measured, "measured_ms.")
    if sequential <= 0:
        raise f.error("'measured_ms.sequential' must be > 0")
    return OverlapVsSequential(_gemm(f, cluster, f.mapping("gemm")),
                               _signature(f, cluster, f.mapping("collective"), "collective."), version, published,
                               sequential,
                               values, f.number("relative", f.mapping("tolerance"), "tolerance."))


_KINDS: dict[str, Callable[[_Fields, ClusterSpec], Quantity]] = {
    "collective_vs_channels": _channel_sweep,
    "busbw_ceiling": _busbw_ceiling,
    "gemm_beside_collective": _gemm_beside,
    "compute_slowdown_range": _slowdown_range,
    "overlap_vs_sequential": _overlap_vs_sequential,
}
KINDS = tuple(_KINDS)


# ---- asking the simulator -------------------------------------------------------------------------


def bus_bandwidth_gb_per_s(signature: Signature, time_us: float) -> float:
    """nccl-tests' bus bandwidth: algbw = bytes / time, x 2(n-1)/n for AllReduce, x (n-1)/n for
    AllGather, ReduceScatter and AllToAll, x 1 otherwise."""
    n = signature.ranks
    if signature.collective is CollectiveType.ALLREDUCE:
        factor = 2.0 * (n - 1) / n
    elif signature.collective in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLTOALL):
        factor = (n - 1) / n
    else:
        factor = 1.0
    return signature.message_bytes / time_us / 1e3 * factor


class FidelityRunner:
    """Runs cases on one noise-free simulator per preset."""

    def __init__(self) -> None:
        self._sims: dict[str, Simulator] = {}

    def simulator(self, cluster: ClusterSpec) -> Simulator:
        key = f"{cluster.name}@{cluster.nccl_version}"
        sim = self._sims.get(key)
        if sim is None:
            sim = self._sims[key] = Simulator(cluster, noise=0.0)
        return sim

    def run(self, case: Case) -> CaseResult:
        q = case.quantity
        if isinstance(q, OverlapVsSequential):
            return _run_overlap(case, self.simulator(replace(case.cluster, nccl_version=q.nccl_version)), q)
        sim = self.simulator(case.cluster)
        if isinstance(q, ChannelSweep):
            return _run_sweep(case, sim, q)
        if isinstance(q, BusbwCeiling):
            return _run_busbw(case, sim, q)
        if isinstance(q, GemmBeside):
            return _run_gemm(case, sim, q)
        return _run_range(case, sim, q)


def run_cases(cases: list[Case]) -> list[CaseResult]:
    runner = FidelityRunner()
    return [runner.run(case) for case in cases]


def _run_sweep(case: Case, sim: Simulator, q: ChannelSweep) -> CaseResult:
    def alone_us(channels: int) -> float:
        config = CommConfig(algorithm=q.algorithm, protocol=q.protocol, channels=channels)
        return sim.collective_time_us(q.signature, config)

    plateau_us = sum(alone_us(c) for c in q.plateau_channels) / len(q.plateau_channels)
    rows: list[Row] = []
    model_points: list[dict] = []
    detail_points: list[dict] = []
    for channels, measured in q.points:
        model = alone_us(channels) - plateau_us
        limit = max(q.relative * abs(measured), q.absolute_us)
        holds = abs(model - measured) <= limit
        model_points.append({"channels": channels, "delta_us": round(model, 1)})
        detail_points.append({"channels": channels, "model_us": round(model, 1), "measured_us": measured,
                              "limit_us": round(limit, 1), "holds": holds})
        rows.append(Row(f"  {channels} channel{'s' if channels > 1 else ''}", f"{model:,.0f} us",
                        f"{measured:,.0f} us", f"±{limit:,.0f} us", holds))
    held = sum(bool(p["holds"]) for p in detail_points)
    holds = held == len(detail_points)
    head = Row(case.id, f"{held}/{len(rows)} points", f"{len(rows)} points",
               f"max({q.relative:.0%}, {q.absolute_us:,.0f} us)", holds)
    resolved = sim.collective_model(q.signature, CommConfig(algorithm=q.algorithm, protocol=q.protocol)).config
    return CaseResult(case.id, case.kind, holds, model_points,
                      [{"channels": c, "delta_us": d} for c, d in q.points],
                      {"points": detail_points, "plateau_us": round(plateau_us, 1),
                       "plateau_channels": list(q.plateau_channels),
                       "config": {**resolved.to_dict(), "channels": "swept"}},
                      [head, *rows])


def _run_busbw(case: Case, sim: Simulator, q: BusbwCeiling) -> CaseResult:
    time_us = sim.collective_time_us(q.signature)
    model = bus_bandwidth_gb_per_s(q.signature, time_us)
    holds = abs(model - q.busbw_gb_per_s) <= q.relative * q.busbw_gb_per_s
    config = sim.collective_model(q.signature).config
    row = Row(case.id, f"{model:.2f} GB/s", f"{q.busbw_gb_per_s:g} GB/s", f"±{q.relative:.0%}", holds)
    return CaseResult(case.id, case.kind, holds, round(model, 3), q.busbw_gb_per_s,
                      {"time_us": round(time_us, 1), "config": config.to_dict(), "relative": q.relative}, [row])


def beside_workload(op: ComputeOp, signature: Signature, copies: int) -> Workload:
    """``op`` on a compute stream and ``copies`` back-to-back runs of the collective on a
    communication stream, all ready at time 0 (the simulator's two-op workload, repeated)."""
    workload = tiny_overlap_workload(op, signature)
    first = workload.collectives[0]
    return replace(workload, collectives=[replace(first, op_id=first.op_id + i, start_us=float(i))
                                          for i in range(copies)])


def gemm_beside_us(sim: Simulator, op: ComputeOp, signature: Signature, config: CommConfig) -> tuple[float, int]:
    """(the kernel's time, copies of the collective) when the collective runs beside the kernel
    for its whole duration: enough back-to-back copies that the last ends after the kernel."""
    plan = Plan(entries={signature: config})
    alone = sim.compute_time_us(op)
    copies = max(1, math.ceil(alone / sim.collective_time_us(signature, config)) + 1)
    while True:
        workload = beside_workload(op, signature, copies)
        timing = sim.evaluate(workload, plan)
        kernel = timing.ops[workload.compute_ops[0].op_id]
        last_end = max(timing.ops[c.op_id].end_us for c in workload.collectives)
        if last_end >= kernel.end_us:
            return kernel.duration_us, copies
        copies = math.ceil(copies * kernel.end_us / last_end) + 1


def _within(value: float, low: float, high: float) -> bool:
    """low <= value <= high, up to floating-point rounding (a kernel exactly as fast beside as alone
    may come out a few ulps below x1)."""
    return low * (1 - 1e-9) <= value <= high * (1 + 1e-9)


def _run_gemm(case: Case, sim: Simulator, q: GemmBeside) -> CaseResult:
    alone = sim.compute_time_us(q.gemm)
    beside, copies = gemm_beside_us(sim, q.gemm, q.signature, q.config)
    slowdown = beside / alone
    holds = _within(slowdown, q.slowdown_min, q.slowdown_max)
    resolved = sim.collective_model(q.signature, q.config).config
    row = Row(case.id, f"x{slowdown:.3f}", f"x{q.slowdown_min:g}..x{q.slowdown_max:g}", "range", holds)
    return CaseResult(case.id, case.kind, holds, round(slowdown, 4), {"min": q.slowdown_min, "max": q.slowdown_max},
                      {"gemm_alone_us": round(alone, 2), "gemm_beside_us": round(beside, 2),
                       "collective_alone_us": round(sim.collective_time_us(q.signature, q.config), 2),
                       "collective_copies": copies, "kernel": q.gemm.name, "config": resolved.to_dict()}, [row])


@dataclass(frozen=True)
class OverlapSlowdown:
    """One workload's overlapped kernels under NCCL's defaults."""

    spec: str
    kernels: int
    beside_us: float  # their total time with the collectives beside them
    alone_us: float  # their total time alone
    largest_kernel: str
    largest_kernel_slowdown: float

    @property
    def slowdown(self) -> float:
        return self.beside_us / self.alone_us if self.alone_us > 0 else 1.0


def overlap_slowdown(sim: Simulator, spec: str, workload: Workload) -> OverlapSlowdown:
    """Every compute kernel a GPU collective overlaps in the iteration under NCCL's defaults:
    time beside over time alone (memory copies are not compute)."""
    timing = sim.evaluate(workload, Plan())
    spans = CoverIndex(union([(timing.ops[c.op_id].start_us, timing.ops[c.op_id].end_us)
                              for c in workload.collectives if c.on_gpu]))
    beside = alone = 0.0
    kernels = 0
    largest, largest_name = 1.0, ""
    for op in workload.compute_ops:
        t = timing.ops[op.op_id]
        if op.is_memory_op or spans.covered(t.start_us, t.end_us) <= 0.0:
            continue
        op_alone = sim.compute_time_us(op)
        kernels += 1
        beside += t.duration_us
        alone += op_alone
        if op_alone > 0 and t.duration_us / op_alone > largest:
            largest, largest_name = t.duration_us / op_alone, op.name
    return OverlapSlowdown(spec, kernels, beside, alone, largest_name, largest)


def _run_range(case: Case, sim: Simulator, q: SlowdownRange) -> CaseResult:
    per = [overlap_slowdown(sim, spec, workload) for spec, workload in q.workloads]
    alone = sum(p.alone_us for p in per)
    mean = sum(p.beside_us for p in per) / alone if alone > 0 else 1.0
    largest = max(p.slowdown for p in per)
    mean_holds = _within(mean, q.mean_min, q.mean_max)
    largest_holds = _within(largest, 0.0, q.largest_max)
    holds = mean_holds and largest_holds
    rows = [Row(case.id, "", "", "", holds),
            Row("  duration-weighted mean", f"x{mean:.3f}", f"x{q.mean_min:g}..x{q.mean_max:g}", "range", mean_holds),
            Row("  largest workload mean", f"x{largest:.3f}", f"<= x{q.largest_max:g}", "bound", largest_holds)]
    rows += [Row(f"    {p.spec}: {p.kernels} kernels, largest x{p.largest_kernel_slowdown:.2f}", f"x{p.slowdown:.3f}",
                 "", "", None) for p in per]
    workloads = [{"spec": p.spec, "kernels": p.kernels, "slowdown": round(p.slowdown, 4),
                  "largest_kernel": p.largest_kernel, "largest_kernel_slowdown": round(p.largest_kernel_slowdown, 4)}
                 for p in per]
    return CaseResult(case.id, case.kind, holds,
                      {"slowdown_mean": round(mean, 4), "slowdown_max": round(largest, 4)},
                      {"slowdown_mean": {"min": q.mean_min, "max": q.mean_max},
                       "slowdown_max": {"max": q.largest_max}},
                      {"workloads": workloads,
                       "slowdown_max_is": "the largest workload's duration-weighted mean (published figures are "
                                          "per-experiment aggregates; per-kernel maxima are listed, not judged)"},
                      rows)


def sequential_workload(op: ComputeOp, signature: Signature) -> Workload:
    """The GEMM, then the collective, on one stream (the two-op workload with both on stream 1)."""
    workload = tiny_overlap_workload(op, signature)
    coll = replace(workload.collectives[0], stream=1, start_us=1.0)
    return replace(workload, streams=[Stream(1, StreamKind.COMPUTE)], collectives=[coll])


def _run_overlap(case: Case, sim: Simulator, q: OverlapVsSequential) -> CaseResult:
    rows: list[Row] = []
    model: dict = {"overlap": {}}
    detail: dict = {"nccl_version": q.published_nccl, "gemm_alone_us": round(sim.compute_time_us(q.gemm), 1),
                    "collective_alone_us": round(sim.collective_time_us(q.signature), 1), "paths": {}}
    holds_all = True

    def judge(label: str, model_ms: float, measured_ms: float) -> None:
        nonlocal holds_all
        holds = abs(model_ms - measured_ms) <= q.relative * measured_ms
        holds_all = holds_all and holds
        rows.append(Row(f"  {label}", f"{model_ms:.3f} ms", f"{measured_ms:g} ms", f"±{q.relative:.0%}", holds))

    seq_ms = sim.evaluate(sequential_workload(q.gemm, q.signature), Plan()).iteration_us / 1e3
    model["sequential"] = round(seq_ms, 4)
    judge("sequential (NCCL's defaults)", seq_ms, q.sequential_ms)
    together = tiny_overlap_workload(q.gemm, q.signature)
    for policy, measured_ms in q.overlap_ms:
        path = POLICY_PATHS[policy]
        config = CommConfig(path=path)
        timing = sim.evaluate(together, Plan(entries={q.signature: config}))
        ms = timing.iteration_us / 1e3
        model["overlap"][policy] = round(ms, 4)
        detail["paths"][policy] = {
            "mechanism": sim.collective_model(q.signature, config).mechanism.value,
            "gemm_us": round(timing.ops[together.compute_ops[0].op_id].duration_us, 1),
            "collective_us": round(timing.ops[together.collectives[0].op_id].duration_us, 1),
        }
        judge(f"overlap, CTA policy {policy}", ms, measured_ms)
    sim.evaluations -= 1 + len(q.overlap_ms)  # asked for a figure, not a search's evaluation
    head = Row(case.id, f"{sum(r.holds is True for r in rows)}/{len(rows)} figures", f"{len(rows)} figures",
               f"±{q.relative:.0%}", holds_all)
    measured = {"sequential": q.sequential_ms, "overlap": dict(q.overlap_ms)}
    return CaseResult(case.id, case.kind, holds_all, model, measured, detail, [head, *rows])


__all__ = ["Case", "CaseResult", "FidelityRunner", "Row", "bus_bandwidth_gb_per_s", "gemm_beside_us",
           "load_cases", "overlap_slowdown", "parse_cases", "run_cases", "sequential_workload"]
