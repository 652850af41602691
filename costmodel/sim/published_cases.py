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
  preset models); each figure holds within ``relative``;
* ``collective_alone_rate``: the collective alone on its path (``sm``: NCCL's defaults,
  ``symmetric``, ``copy_engine``) at each size, as a time or a rate in the stated
  convention (``unknown``: holds if algbw or busbw does, and says which); a point whose
  time does not grow with its bytes (:func:`harness_floor`) is on the source's per-call
  floor and bounds the model's time from above; a case all on the floor is not judged;
* ``path_gain_end_to_end``: one iteration of the case's ``workload`` (or the job the project
  chooses to stand for it, :mod:`costmodel.sim.case_stand_ins`, printed) under NCCL's
  defaults and with the change (the named collectives on the named path); the throughput
  change in %.

A field the source does not state is ``null``: NCCL's default where one exists (channels, the
NCCL version: :data:`UNSTATED_NCCL_VERSION`), else the case is *not judged* and the result says
why, as it does for a cluster no preset models (``other:GPU``). An ``other:`` cluster naming
GPUs some presets model is judged on those presets. A case's optional ``split`` (``fit`` or
``check``) says which set it belongs to (:func:`assign_splits`, docs/simulator.md).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from costmodel.evaluator import MODELLED_ALGORITHMS
from costmodel.gpu_specs import DeviceFacts, GpuRow, device_model, match_gpu
from costmodel.nccl_defaults import algo_estimates, nccl_default_config, symmetric_kernel, tuning_cells
from costmodel.nccl_tuning_tables import tuning_table
from costmodel.sim.case_stand_ins import (
    FABRIC_WORDS,
    OTHER_PREFIX,
    NotJudged,
    presets_for_other,
    stand_in_spec,
    stand_in_specs,
)
from costmodel.sim.simulator import Simulator, tiny_overlap_workload
from costmodel.trace_cluster import stated_cluster
from nccl_env.errors import LagomError
from nccl_env.files import read_text
from nccl_env.knob_table import ALGORITHM, CHANNELS, PATH, PROTOCOL, config_from
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.plan import Plan, Signature
from nccl_env.rules import NcclVersion
from traces.gemm_names import GemmDtype
from traces.generate import gemm_op, generate_workload
from traces.intervals import CoverIndex, union
from traces.workload import ComputeOp, Stream, StreamKind, Workload

CASES_FORMAT = "lagom.published-cases"
VERSION = 1
_GROUP = "published"
SPLITS = ("fit", "check")
# A case that needs a path and states no NCCL: the first NCCL with both paths (symmetric kernels
# from 2.27, copy-engine collectives and CTA policies from 2.28; nccl_env.rules)
UNSTATED_NCCL_VERSION = "2.28.9"


# ---- results ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One printed line: a quantity, the model's and the measured value, the tolerance, the verdict."""

    label: str
    model: str
    measured: str
    tolerance: str
    holds: bool | None  # None: shown for information, not judged
    error: float | None = None  # model / measured - 1 (or the distance outside a range): the size of a miss


@dataclass
class CaseResult:
    id: str
    kind: str
    holds: bool | None  # None: not judged (``not_judged`` says why)
    model: Any  # JSON-ready, same shape as ``measured`` where the kind allows
    measured: Any
    detail: dict
    rows: list[Row] = field(default_factory=list)  # first row: the case; more: its points/quantities
    split: str | None = None  # "fit", "check", or None when the file has no split
    not_judged: str | None = None
    cluster: str = ""  # the cluster the case was judged on (preset or built from the case), with nodes and NCCL

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "holds": self.holds, "model": self.model,
                "measured": self.measured, "detail": self.detail, "split": self.split,
                "not_judged": self.not_judged, "cluster": self.cluster}

    @property
    def worst_row(self) -> Row | None:
        """The judged row furthest from its measurement."""
        rows = [r for r in self.rows if r.error is not None]
        return max(rows, key=lambda r: abs(r.error or 0.0), default=None)


# ---- reading a cases file -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChannelSweep:
    signature: Signature
    pair: CommConfig  # the case's algorithm and protocol; the sweep sets the channels
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
    workloads: tuple[tuple[str, Workload, ClusterSpec], ...]
    mean_min: float
    mean_max: float
    largest_max: float
    stand_in: bool = False  # the workloads are the project's choice for a described job


@dataclass(frozen=True)
class AloneRate:
    signature_for: Callable[[int], Signature]  # the collective's signature for a point's bytes
    path: CommPath | None  # None: NCCL's defaults (the SM ring)
    points: tuple[tuple[int, str, float], ...]  # (bytes as the case gives them, "GBps" or "time_us", value)
    convention: str  # algbw, busbw or unknown
    bytes_are: str  # "shard" (per rank) or "buffer" (nccl-tests' size)
    relative: float
    nccl_version: NcclVersion
    measured_us: tuple[float, ...]  # per point: its published time (a rate read in the convention)
    at_floor: tuple[bool, ...]  # per point: the source's time does not grow with the bytes (harness_floor)


@dataclass(frozen=True)
class PathGain:
    spec: str
    workload: Workload
    stand_in: bool
    collectives: frozenset[CollectiveType]
    path: CommPath
    nccl_version: NcclVersion
    measured_pct: float
    absolute_pct: float | None
    relative: float | None


@dataclass(frozen=True)
class OverlapVsSequential:
    gemm: ComputeOp
    signature: Signature
    nccl_version: NcclVersion
    published_nccl: str  # the version as the publication gives it (e.g. "2.28"), for the report
    sequential_ms: float
    overlap_ms: tuple[tuple[str, float], ...]  # (CTA policy, measured ms)
    relative: float


@dataclass(frozen=True)
class TableCellCase:
    """One cell of NCCL's printed table: (collective, algorithm, protocol, latency us, algbw GB/s)."""

    collective: CollectiveType
    algo: Algorithm
    proto: Protocol
    latency_us: float
    algbw_gb_per_s: float


@dataclass(frozen=True)
class TuningTableQuantity:
    cluster: ClusterSpec
    ranks: int
    nodes: int
    cells: tuple[TableCellCase, ...]
    relative: float


@dataclass(frozen=True)
class ChoicePoint:
    signature: Signature
    stated_bytes: bool  # False: the source gives no size (a statement about large messages, judged at 1 GiB)
    algo: str  # NCCL's name (Ring, NVLSTree, ...) or a symmetric kernel's (ReduceScatter_LD)
    proto: Protocol | None
    ctas: int | None  # channels (NCCL's CTAs)
    symmetric: bool


@dataclass(frozen=True)
class NcclChoice:
    cluster: ClusterSpec
    points: tuple[ChoicePoint, ...]


@dataclass(frozen=True)
class BusbwCurve:
    cluster: ClusterSpec
    signature_for: Callable[[int], Signature]
    forced: CommConfig
    forced_text: str | None
    points: tuple[tuple[int, float], ...]  # (bytes, busbw GB/s)
    relative: float


Quantity = (ChannelSweep | BusbwCeiling | GemmBeside | SlowdownRange | OverlapVsSequential | AloneRate | PathGain
            | TuningTableQuantity | NcclChoice | BusbwCurve)

# The path each CTA policy of an ``overlap_vs_sequential`` case puts the collective's group on.
POLICY_PATHS: dict[str, CommPath | None] = {"default": None, "efficiency": CommPath.EFFICIENCY,
                                            "zero": CommPath.COPY_ENGINE}


@dataclass(frozen=True)
class Case:
    """One published measurement, validated: what the simulator is asked and what was measured."""

    id: str
    kind: str
    source: str
    cluster: ClusterSpec | None  # None: no preset models it (``not_judged`` says so)
    quantity: Quantity | None  # None: not judged
    split: str | None = None
    not_judged: str | None = None
    clusters: tuple[ClusterSpec, ...] = ()  # every preset an ``other:`` cluster maps to (the first is ``cluster``)


class _Fields:
    """Typed access to one case's fields; every error names the case and the field."""

    def __init__(self, where: str, data: dict):
        self.where = where
        self.data = data
        self.clusters: tuple[ClusterSpec, ...] = ()
        self.note = ""

    def error(self, message: str) -> LagomError:
        return LagomError(f"{self.where}: {message}")

    def raw(self, key: str, data: dict | None = None, prefix: str = "") -> Any:
        data = self.data if data is None else data
        if key not in data:
            raise self.error(f"missing field '{prefix}{key}'")
        return data[key]

    def stated(self, key: str, data: dict | None = None, prefix: str = "", what: str = "") -> Any:
        """The field's value; NotJudged when the source does not state it (``null``)."""
        value = self.raw(key, data, prefix)
        if value is None:
            raise NotJudged(f"the source does not state {what or prefix + key}")
        return value

    def optional(self, key: str, data: dict | None = None) -> Any:
        data = self.data if data is None else data
        return data.get(key)

    def mapping(self, key: str, data: dict | None = None, prefix: str = "") -> dict:
        value = self.raw(key, data, prefix)
        if not isinstance(value, dict):
            raise self.error(f"'{prefix}{key}' must be an object, got {value!r}")
        return value

    def records(self, key: str, shape: str) -> list[dict]:
        """A non-empty list of objects (``shape`` names their fields in the error)."""
        value = self.raw(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
            raise self.error(f"'{key}' must be a non-empty list of {{{shape}}}")
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
        raise LagomError(f"{origin}: not a {CASES_FORMAT} file (expected a JSON object)")
    if data.get("format") != CASES_FORMAT:
        raise LagomError(f"{origin}: 'format' is {data.get('format')!r}, expected {CASES_FORMAT!r}")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise LagomError(f"{origin}: {CASES_FORMAT} version {version!r} is not supported (this runner reads "
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
        raise f.error(f"unknown kind {kind!r} (known: {', '.join(CASE_KINDS)})")
    source = f.text("source")
    f.note = f.text("note")
    split = raw.get("split")
    if split is not None and split not in SPLITS:
        raise f.error(f"'split' must be one of {', '.join(SPLITS)}, got {split!r}")
    preset = f.text("cluster")
    if kind in _SYSTEM_KINDS:  # a system the case states: a preset as stated, or a cluster built from it
        try:
            system = _system_cluster(f, preset)
            quantity = _KINDS[kind](f, system)
        except NotJudged as exc:
            return Case(case_id, kind, source, None, None, split, str(exc))
        return Case(case_id, kind, source, system, quantity, split, None, (system,))
    if preset.startswith(OTHER_PREFIX):
        presets, missing = presets_for_other(preset)
        if not presets:
            return Case(case_id, kind, source, None, None, split, f"no preset: {'; '.join(missing)}")
        f.clusters = tuple(load_cluster(p) for p in presets)
    elif preset not in preset_names():
        raise f.error(f"unknown preset {preset!r} (presets: {', '.join(preset_names())})")
    else:
        f.clusters = (load_cluster(preset),)
    cluster = f.clusters[0]
    try:
        quantity = _KINDS[kind](f, cluster)
    except NotJudged as exc:
        return Case(case_id, kind, source, cluster, None, split, str(exc), f.clusters)
    return Case(case_id, kind, source, cluster, quantity, split, None, f.clusters)


def _signature(f: _Fields, cluster: ClusterSpec, data: dict | None = None, prefix: str = "") -> Signature:
    name = f.raw("collective", data, prefix)
    try:
        collective = CollectiveType.parse(name) if isinstance(name, str) else None
    except ValueError:
        collective = None
    if collective is None:
        known = ", ".join(c.value for c in CollectiveType)
        raise f.error(f"'{prefix}collective' {name!r} is not a collective ({known})")
    for key in ("bytes", "ranks", "nodes"):
        f.stated(key, data, prefix, f"the collective's {key}")
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
        pair=config_from([(ALGORITHM, _enum(f, "algorithm", Algorithm, MODELLED_ALGORITHMS)),
                          (PROTOCOL, _enum(f, "protocol", Protocol, tuple(Protocol)))]),
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
    for key in ("m", "n", "k", "dtype"):
        f.stated(key, gemm, "gemm.", "the GEMM's shape (m, n, k, dtype)")
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
    op = _gemm(f, cluster, gemm)
    f.stated("grid_blocks", gemm, "gemm.", "the GEMM's grid")
    f.integer("grid_blocks", gemm, "gemm.")  # required here: the measured launch's blocks
    coll = f.mapping("collective")
    signature = _signature(f, cluster, coll, "collective.")
    count = _channels(f, cluster, "channels", coll, "collective.") if coll.get("channels") is not None else None
    low, high = f.bounds("slowdown", "min", "max")
    relative = _relative(f)
    return GemmBeside(op, signature, CHANNELS.set(CommConfig(), count), low * (1 - relative), high * (1 + relative))


def _relative(f: _Fields) -> float:
    """A case's optional ``tolerance.relative`` (0 without one)."""
    tolerance = f.data.get("tolerance")
    if not isinstance(tolerance, dict) or tolerance.get("relative") is None:
        return 0.0
    return f.number("relative", tolerance, "tolerance.")


def _slowdown_range(f: _Fields, cluster: ClusterSpec) -> SlowdownRange:
    specs = f.raw("workloads")
    stand_in = isinstance(specs, str)
    if stand_in:  # a description of the jobs: the project's stand-ins (case_stand_ins), printed
        specs = stand_in_specs(specs, cluster.gpus_per_node)
    if not isinstance(specs, list) or not specs or not all(isinstance(s, str) for s in specs):
        raise f.error(f"'workloads' must be a non-empty list of workload spec strings, got {specs!r}")
    workloads = []
    for preset in f.clusters or (cluster,):
        for spec in specs:
            try:
                workload = generate_workload(spec)
            except LagomError as exc:
                raise f.error(f"workload {spec!r}: {exc}") from None
            if workload.world_size > preset.world_size:
                raise f.error(f"workload {spec!r} needs {workload.world_size} GPUs; {preset.name} has "
                              f"{preset.world_size}")
            workloads.append((spec, workload, preset))
    mean_min, mean_max = f.bounds("slowdown_mean", "min", "max")
    _, largest_max = f.bounds("slowdown_max", None, "max")
    relative = _relative(f)
    return SlowdownRange(tuple(workloads), mean_min * (1 - relative), mean_max * (1 + relative),
                         largest_max * (1 + relative), stand_in)


def _overlap_vs_sequential(f: _Fields, cluster: ClusterSpec) -> OverlapVsSequential:
    version = _nccl_version(f)
    published = f.text("nccl_version") if f.data.get("nccl_version") is not None else UNSTATED_NCCL_VERSION
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


def _nccl_version(f: _Fields) -> NcclVersion:
    """The case's NCCL, or :data:`UNSTATED_NCCL_VERSION` when the source does not state it (a
    publication may name the minor only: parsed, not checked against NCCL's releases)."""
    if f.data.get("nccl_version") is None:  # absent or null: not stated
        return NcclVersion.parse(UNSTATED_NCCL_VERSION)
    version = f.text("nccl_version")
    try:
        return NcclVersion.parse(version)
    except LagomError as exc:
        raise f.error(f"'nccl_version': {exc}") from None


_PATHS = {"sm": None, "symmetric": CommPath.SYMMETRIC, "copy_engine": CommPath.COPY_ENGINE}
_CONVENTIONS = ("algbw", "busbw", "unknown")


def _alone_rate(f: _Fields, cluster: ClusterSpec) -> AloneRate:
    name = f.raw("collective")
    if name in ("p2p_copy", "local_copy"):
        raise NotJudged(f"'{name}' is one copy, not a collective: the simulator has copies only as a "
                        "collective's path")
    try:
        collective = CollectiveType.parse(name) if isinstance(name, str) else None
    except ValueError:
        collective = None
    if collective not in (CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE):
        raise f.error(f"'collective' {name!r} is not allgather, reducescatter, allreduce, p2p_copy or local_copy")
    path_name = f.raw("path")
    if path_name not in _PATHS:
        raise f.error(f"'path' {path_name!r} is not one of {', '.join(_PATHS)}")
    ranks = f.integer("ranks")
    nodes = f.integer("nodes") if f.data.get("nodes") is not None else 1
    if ranks % nodes or ranks // nodes > cluster.gpus_per_node:
        raise f.error(f"{ranks} ranks on {nodes} node(s) do not fit {cluster.name}'s {cluster.gpus_per_node} "
                      "GPUs per node evenly")
    convention = f.raw("bw_convention")
    if convention not in _CONVENTIONS:
        raise f.error(f"'bw_convention' {convention!r} is not one of {', '.join(_CONVENTIONS)}")
    bytes_are = f.data.get("bytes_are") or ("shard" if "per-rank shard" in f.note.lower() else "buffer")
    if bytes_are not in ("shard", "buffer"):
        raise f.error(f"'bytes_are' {bytes_are!r} is not shard or buffer")
    raw_points = f.raw("points")
    if not isinstance(raw_points, list) or not raw_points or not all(isinstance(p, dict) for p in raw_points):
        raise f.error(f"'points' must be a non-empty list of {{\"bytes\", \"GBps\" or \"time_us\"}}, "
                      f"got {raw_points!r}")
    points = []
    for i, p in enumerate(raw_points):
        size = f.integer("bytes", p, f"points[{i}].")
        key = "time_us" if p.get("time_us") is not None else "GBps"
        value = f.number(key, p, f"points[{i}].")
        if value <= 0:
            raise f.error(f"'points[{i}].{key}' must be > 0")
        points.append((size, key, value))
    relative = f.number("relative", f.mapping("tolerance"), "tolerance.")
    nccl_version = _nccl_version(f)

    def signature_for(size: int) -> Signature:
        message = size * ranks if bytes_are == "shard" else size
        return Signature(_GROUP, collective, message, ranks, nodes)

    measured_us = tuple(_measured_time_us(signature_for(size), key, value, convention) for size, key, value in points)
    return AloneRate(signature_for, _PATHS[path_name], tuple(points), convention, bytes_are, relative, nccl_version,
                     measured_us, harness_floor([(size, t) for (size, _, _), t in zip(points, measured_us)]))


# A collective's time grows with its bytes once past its latency: a point whose time grows by less
# than this share of its bytes' growth to the next size (x4 bytes, under x1.75 time) is on a floor.
FLOOR_TIME_GROWTH_SHARE = 0.25
# A floor this many times NCCL's own latency for the collective (its model's smallest, tuning.cc
# baseLat + hwLat per hop: ~11 us for a ring AllGather on 8 NVLink GPUs) is not the collective's
# latency but the harness's per-call cost: such a point only bounds the collective's time. A flat
# series at the latency's scale (nccl-tests' small sizes) is judged as it stands.
HARNESS_OVER_NCCL_LATENCY = 3.0


def harness_floor(times: list[tuple[int, float]] | tuple[tuple[int, float], ...]) -> tuple[bool, ...]:
    """Per point (bytes, time in us; in the given order): whether its time is on a floor that does
    not grow with its bytes, judged against every point of the next larger size (points of one size
    share their verdict). Such a point bounds the collective's time from above (the floor is a
    harness's per-call cost, or the collective's latency: :func:`_run_rate` tells them apart)."""
    by_size: dict[int, list[float]] = {}
    for size, time_us in times:
        by_size.setdefault(size, []).append(time_us)
    sizes = sorted(by_size)
    flat: set[int] = set()
    for small, large in zip(sizes, sizes[1:]):
        if any(t_large / t_small - 1.0 < FLOOR_TIME_GROWTH_SHARE * (large / small - 1.0)
               for t_small in by_size[small] for t_large in by_size[large]):
            flat.update((small, large))
    return tuple(size in flat for size, _ in times)


def nccl_latency_us(cluster: ClusterSpec, signature: Signature) -> float:
    """NCCL's own latency for the collective: its model's smallest over the algorithms and protocols."""
    estimates = algo_estimates(cluster, signature)
    return min((e.latency_us for e in estimates), default=0.0)


def _change_set(f: _Fields, change: dict) -> tuple[frozenset[CollectiveType], CommPath]:
    """The collectives a change moves and the path it moves them to: ``change.set``, or read from
    ``change.what`` (symmetric memory: AllGather and ReduceScatter on symmetric kernels; a CTA
    policy that minimises SM use: every collective on the copy engines, NCCL keeping on its
    kernels the ones the copy engines do not run)."""
    chosen = change.get("set")
    if isinstance(chosen, dict):
        path = _PATHS.get(str(chosen.get("path")))
        names = chosen.get("collectives")
        if path is None or not isinstance(names, list) or not names:
            raise f.error("'change.set' must name 'collectives' (a list) and a 'path' (symmetric, copy_engine)")
        try:
            return frozenset(CollectiveType.parse(n) for n in names), path
        except (ValueError, AttributeError):
            raise f.error(f"'change.set.collectives' {names!r} names an unknown collective") from None
    what = str(change.get("what") or "").lower()
    if "symm" in what:
        return frozenset({CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER}), CommPath.SYMMETRIC
    if "cta policy" in what or "sm use" in what or "sm utilization" in what:
        return frozenset(CollectiveType), CommPath.COPY_ENGINE
    raise NotJudged(f"the change {change.get('what')!r} names no path the simulator has")


def _path_gain(f: _Fields, cluster: ClusterSpec) -> PathGain:
    change = f.mapping("change")
    measured = f.number("throughput_change_pct", change, "change.", signed=True)
    collectives, path = _change_set(f, change)
    spec = f.data.get("workload")
    stand_in = spec is None
    if stand_in:
        def count(key: str) -> int | None:
            return f.integer(key) if f.data.get(key) is not None else None
        spec = stand_in_spec(f.data.get("model"), f.data.get("parallelism"), count("gpus"), count("micro_batch"),
                             count("seq"))
    if not isinstance(spec, str):
        raise f.error(f"'workload' must be a workload spec string, got {spec!r}")
    try:
        workload = generate_workload(spec)
    except LagomError as exc:
        raise f.error(f"workload {spec!r}: {exc}") from None
    if workload.world_size > cluster.world_size:
        raise f.error(f"workload {spec!r} needs {workload.world_size} GPUs; {cluster.name} has {cluster.world_size}")
    tolerance = f.mapping("tolerance")
    absolute = f.number("absolute_pct", tolerance, "tolerance.") if tolerance.get("absolute_pct") is not None else None
    relative = f.number("relative", tolerance, "tolerance.") if tolerance.get("relative") is not None else None
    if absolute is None and relative is None:
        raise f.error("'tolerance' must give 'absolute_pct' or 'relative'")
    return PathGain(spec, workload, stand_in, collectives, path, _nccl_version(f), measured, absolute, relative)


# ---- NCCL's own model: tables, choices, nccl-tests curves --------------------------------------------------------

_SYSTEM_KINDS = ("nccl_tuning_table", "nccl_choice", "busbw_curve")
LARGE_MESSAGE_BYTES = 1 << 30  # a statement "for large messages" (bytes null) is judged at 1 GiB
_ALGO_NAMES = {"tree": Algorithm.TREE, "ring": Algorithm.RING, "collnetdirect": Algorithm.COLLNET_DIRECT,
               "collnetchain": Algorithm.COLLNET_CHAIN, "nvls": Algorithm.NVLS, "nvlstree": Algorithm.NVLS_TREE,
               "pat": Algorithm.PAT}


def _stated_version(f: _Fields) -> NcclVersion:
    """The case's NCCL as a release (``2.23+`` and ``2.30.x (master ...)`` read as 2.23 and 2.30); a
    statement with none (``null``) is read with the newest modelled release family's rules."""
    text = f.data.get("nccl_version")
    if text is None:
        return tuning_table(NcclVersion(2, 99, 0)).first
    found = re.match(r"\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not found:
        raise f.error(f"'nccl_version' {text!r} names no NCCL release")
    return NcclVersion(int(found.group(1)), int(found.group(2)), int(found.group(3) or 0))


def _stated_row(text: str) -> GpuRow | None:
    """The GPU table's row for a GPU a case names (``H100-PCIe``, ``NVIDIA GB200 185GB``), or None."""
    upper = text.upper().replace("-", " ")
    if device_model(upper) is None:
        return None
    match = match_gpu(DeviceFacts(name=upper))
    return match.row if match is not None else None


def _system_cluster(f: _Fields, preset: str) -> ClusterSpec:
    """The cluster a system-stating case is judged on: its preset with the case's nodes, GPUs per
    node, NCCL and NVLS; a cluster built from what it states where the preset's GPU or fabric is not
    the case's (or it names ``other:``); else NotJudged with the reason. Never a preset whose fabric
    differs from the case's."""
    version = _stated_version(f)
    nodes = f.data.get("nodes")
    if nodes is None:
        raise NotJudged("the source does not state the number of nodes")
    nodes = f.integer("nodes")
    gpus_per_node = f.integer("gpus_per_node") if f.data.get("gpus_per_node") is not None else None
    nvls = f.data.get("nvls")
    if nvls is not None and not isinstance(nvls, bool):
        raise f.error(f"'nvls' must be true, false or null, got {nvls!r}")
    other = preset.startswith(OTHER_PREFIX)
    if not other and preset not in preset_names():
        raise f.error(f"unknown preset {preset!r} (presets: {', '.join(preset_names())})")
    gpu_text = str(f.data.get("gpu") or (preset[len(OTHER_PREFIX):] if other else ""))
    stated_words = [w for w in FABRIC_WORDS if w in (preset + " " + gpu_text).lower()]
    if not other and not stated_words:
        base = load_cluster(preset)
        model = device_model(gpu_text.upper()) if gpu_text else None
        if model is None or model == device_model(base.gpu.name):
            per_node = gpus_per_node or base.gpus_per_node
            intra = base.intra_node if nvls is None else replace(base.intra_node,
                                                                 nvls=bool(nvls) and base.intra_node.kind == "nvswitch")
            return replace(base, nodes=nodes, gpus_per_node=per_node, nccl_version=version, intra_node=intra)
    row = _stated_row(gpu_text)
    if row is None:
        raise NotJudged(f"{gpu_text or preset!r} names no GPU of Lagom's GPU table, and no preset is that system")
    if stated_words and row.form != "pcie" and "pcie" in stated_words:
        raise NotJudged(f"{gpu_text}: the case states PCIe, the GPU table's {row.key} is not a PCIe card")
    if nodes > 1:
        raise NotJudged(f"{nodes} nodes of {row.key}: the case does not state their network (NICs and their speed), "
                        "and no preset has this GPU on this fabric")
    if gpus_per_node is None:
        gpus_per_node = 8
    return stated_cluster(row, nodes, gpus_per_node, version, nvls=bool(nvls))


def _check_fit(f: _Fields, cluster: ClusterSpec, ranks: int, nodes: int) -> None:
    if ranks % nodes or ranks // nodes > cluster.gpus_per_node:
        raise f.error(f"{ranks} ranks on {nodes} node(s) do not fit {cluster.gpus_per_node} GPUs per node evenly")


def _tuning_table_case(f: _Fields, cluster: ClusterSpec) -> TuningTableQuantity:
    rows = f.records("rows", '"collective", "algorithm", "protocol", "latency_us", "algbw_GBps"')
    cells = []
    for i, r in enumerate(rows):
        where = f"rows[{i}]."
        algo = _ALGO_NAMES.get(str(r.get("algorithm", "")).lower())
        proto_name = str(r.get("protocol", "")).upper()
        if algo is None or proto_name not in Protocol.__members__:
            raise f.error(f"'{where}algorithm/protocol' {r.get('algorithm')!r}/{r.get('protocol')!r} is not NCCL's")
        cells.append(TableCellCase(_collective(f, r, where), algo, Protocol[proto_name],
                                   f.number("latency_us", r, where), f.number("algbw_GBps", r, where)))
    ranks = cluster.nodes * cluster.gpus_per_node
    return TuningTableQuantity(cluster, ranks, cluster.nodes, tuple(cells),
                               f.number("relative", f.mapping("tolerance"), "tolerance."))


def _collective(f: _Fields, data: dict, where: str) -> CollectiveType:
    name = data.get("collective")
    try:
        return CollectiveType.parse(str(name))
    except ValueError:
        raise f.error(f"'{where}collective' {name!r} is not a collective") from None


def _nccl_choice(f: _Fields, cluster: ClusterSpec) -> NcclChoice:
    raw = f.records("points", '"collective", "bytes", "algorithm", "protocol", "channels"')
    points = []
    for i, p in enumerate(raw):
        where = f"points[{i}]."
        ranks = f.integer("ranks", p, where) if p.get("ranks") is not None else cluster.nodes * cluster.gpus_per_node
        nodes = cluster.nodes
        _check_fit(f, cluster, ranks, nodes)
        stated = p.get("bytes") is not None
        size = f.integer("bytes", p, where) if stated else LARGE_MESSAGE_BYTES
        name = str(f.raw("algorithm", p, where))
        symmetric = "symmetric" in name.lower()
        algo = name.split(" (")[0].strip()
        if not symmetric and algo.lower() not in _ALGO_NAMES:
            raise f.error(f"'{where}algorithm' {name!r} is not NCCL's")
        proto = p.get("protocol")
        if proto is not None and str(proto).upper() not in Protocol.__members__:
            raise f.error(f"'{where}protocol' {proto!r} is not NCCL's")
        ctas = f.integer("channels", p, where) if p.get("channels") is not None else None
        points.append(ChoicePoint(Signature(_GROUP, _collective(f, p, where), size, ranks, nodes), stated, algo,
                                  Protocol[str(proto).upper()] if proto is not None else None, ctas, symmetric))
    return NcclChoice(cluster, tuple(points))


def _busbw_curve(f: _Fields, cluster: ClusterSpec) -> BusbwCurve:
    collective = _collective(f, f.data, "")
    forced_text = f.data.get("forced")
    forced = CommConfig()
    if forced_text is not None:
        found = re.fullmatch(r"\s*NCCL_(ALGO|PROTO)=(\w+)\s*", str(forced_text))
        name = found.group(2).lower() if found else ""
        if found and found.group(1) == "ALGO" and name in _ALGO_NAMES:
            forced = ALGORITHM.set(CommConfig(), _ALGO_NAMES[name])
        elif found and found.group(1) == "PROTO" and name.upper() in Protocol.__members__:
            forced = PROTOCOL.set(CommConfig(), Protocol[name.upper()])
        else:
            raise NotJudged(f"forced by {forced_text!r}: not an NCCL_ALGO or NCCL_PROTO setting the model reads")
    raw = f.records("points", '"bytes", "time_us", "busbw_GBps"')
    points = tuple((f.integer("bytes", p, f"points[{i}]."), f.number("busbw_GBps", p, f"points[{i}]."))
                   for i, p in enumerate(raw))
    ranks = cluster.nodes * cluster.gpus_per_node

    def signature_for(size: int) -> Signature:
        return Signature(_GROUP, collective, size, ranks, cluster.nodes)

    return BusbwCurve(cluster, signature_for, forced, forced_text, points,
                      f.number("relative", f.mapping("tolerance"), "tolerance."))


_KINDS: dict[str, Callable[[_Fields, ClusterSpec], Quantity]] = {
    "collective_vs_channels": _channel_sweep,
    "busbw_ceiling": _busbw_ceiling,
    "gemm_beside_collective": _gemm_beside,
    "compute_slowdown_range": _slowdown_range,
    "overlap_vs_sequential": _overlap_vs_sequential,
    "collective_alone_rate": _alone_rate,
    "path_gain_end_to_end": _path_gain,
    "nccl_tuning_table": _tuning_table_case,
    "nccl_choice": _nccl_choice,
    "busbw_curve": _busbw_curve,
}
CASE_KINDS = tuple(_KINDS)


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
    """Runs cases on one noise-free simulator per preset.

    ``cluster_for``, when given, rewrites every preset before its simulator is built (one change of
    the mechanism's constants for every case: ``bench/fidelity_ceiling.py`` sweeps them)."""

    def __init__(self, cluster_for: Callable[[ClusterSpec], ClusterSpec] | None = None) -> None:
        self._sims: dict[str, Simulator] = {}
        self._cluster_for = cluster_for

    def simulator(self, cluster: ClusterSpec) -> Simulator:
        key = (f"{cluster.name}@{cluster.nccl_version}/{cluster.nodes}x{cluster.gpus_per_node}"
               f"{'/nvls' if cluster.intra_node.nvls else ''}")
        sim = self._sims.get(key)
        if sim is None:
            built = self._cluster_for(cluster) if self._cluster_for is not None else cluster
            sim = self._sims[key] = Simulator(built, noise=0.0)
        return sim

    def run(self, case: Case) -> CaseResult:
        result = self._run(case)
        result.split = case.split
        result.cluster = cluster_label(case)
        return result

    def _run(self, case: Case) -> CaseResult:
        q = case.quantity
        if q is None or case.cluster is None:
            reason = case.not_judged or "not judged"
            return CaseResult(case.id, case.kind, None, None, None, {"not_judged": reason},
                              [Row(case.id, "not judged", "", "", None), Row(f"  {reason}", "", "", "", None)],
                              not_judged=reason)
        if isinstance(q, OverlapVsSequential):
            return _run_overlap(case, self.simulator(replace(case.cluster, nccl_version=q.nccl_version)), q)
        if isinstance(q, AloneRate):
            return _run_rate(case, self.simulator(replace(case.cluster, nccl_version=q.nccl_version)), q)
        if isinstance(q, PathGain):
            return _run_gain(case, self.simulator(replace(case.cluster, nccl_version=q.nccl_version)), q)
        if isinstance(q, TuningTableQuantity):
            return _run_table(case, q)
        if isinstance(q, NcclChoice):
            return _run_choice(case, q)
        if isinstance(q, BusbwCurve):
            return _run_curve(case, self.simulator(q.cluster), q)
        sim = self.simulator(case.cluster)
        if isinstance(q, ChannelSweep):
            return _run_sweep(case, sim, q)
        if isinstance(q, BusbwCeiling):
            return _run_busbw(case, sim, q)
        if isinstance(q, GemmBeside):
            return _run_gemm(case, sim, q)
        return _run_range(case, self, q)


def cluster_label(case: Case) -> str:
    """The cluster(s) a case is judged on, as printed: name, nodes x GPUs per node, NCCL release."""
    if case.cluster is None:
        return "none"
    q = case.quantity
    version = getattr(q, "nccl_version", None) or case.cluster.nccl_version
    shown = []
    for cluster in case.clusters or (case.cluster,):
        nvls = ", NVLS" if cluster.intra_node.nvls else ""
        shown.append(f"{cluster.name} {cluster.nodes}x{cluster.gpus_per_node}{nvls}")
    return f"{' | '.join(shown)}, NCCL {version}"


_ALGO_PRINTED = {a: name for name, a in {"Tree": Algorithm.TREE, "Ring": Algorithm.RING,
                                         "CollNetDirect": Algorithm.COLLNET_DIRECT,
                                         "CollNetChain": Algorithm.COLLNET_CHAIN, "NVLS": Algorithm.NVLS,
                                         "NVLSTree": Algorithm.NVLS_TREE, "PAT": Algorithm.PAT}.items()}
_PROTO_PRINTED = {Protocol.LL: "LL", Protocol.LL128: "LL128", Protocol.SIMPLE: "Simple"}
# NCCL prints its table with one decimal: a cell within half a unit of the last digit holds whatever the tolerance
PRINTED_ROUNDING = 0.05


def _run_table(case: Case, q: TuningTableQuantity) -> CaseResult:
    model = {c.key: c for c in tuning_cells(q.cluster, q.ranks, q.nodes)}
    rows: list[Row] = []
    held = 0
    worst = 0.0
    for cell in q.cells:
        m = model.get((cell.collective, cell.algo, cell.proto))
        label = f"  {cell.collective.value} {_ALGO_PRINTED[cell.algo]}/{_PROTO_PRINTED[cell.proto]}"
        measured = f"{cell.latency_us:g}/{cell.algbw_gb_per_s:g}"
        if m is None:
            rows.append(Row(label + " (the model has no such cell)", "-", measured, f"±{q.relative:.0%}", False, 1.0))
            continue
        lat_ok = abs(m.latency_us - cell.latency_us) <= q.relative * cell.latency_us + PRINTED_ROUNDING
        if cell.algbw_gb_per_s == 0:
            bw_ok = m.bw_gb_per_s == 0
        else:
            bw_ok = abs(m.bw_gb_per_s - cell.algbw_gb_per_s) <= q.relative * cell.algbw_gb_per_s + PRINTED_ROUNDING
        errors = [m.latency_us / cell.latency_us - 1 if cell.latency_us else 0.0,
                  m.bw_gb_per_s / cell.algbw_gb_per_s - 1 if cell.algbw_gb_per_s else (1.0 if m.bw_gb_per_s else 0.0)]
        error = max(errors, key=abs)
        if lat_ok and bw_ok:
            held += 1
            continue
        worst = max(worst, abs(error))
        rows.append(Row(label, f"{m.latency_us:.1f}/{m.bw_gb_per_s:.1f}", measured, f"±{q.relative:.0%}", False,
                        error))
    holds = held == len(q.cells)
    head = Row(case.id, f"{held}/{len(q.cells)} cells", f"{len(q.cells)} cells (us/GB/s)", f"±{q.relative:.0%}",
               holds, worst if not holds else 0.0)
    return CaseResult(case.id, case.kind, holds, {"cells_held": held}, {"cells": len(q.cells)},
                      {"misses": [r.label.strip() for r in rows]}, [head, *rows])


def _run_choice(case: Case, q: NcclChoice) -> CaseResult:
    rows: list[Row] = []
    points = []
    cc = int((q.cluster.nccl_graph or {}).get("compute_capability", 80))
    for p in q.points:
        size = f"{p.signature.message_bytes / (1 << 20):g} MiB" if p.stated_bytes else "large (1 GiB)"
        label = f"  {p.signature.collective.value} {size} on {p.signature.ranks} GPUs"
        got: tuple[str, Protocol | None, int | None]
        if p.symmetric:
            kernel = symmetric_kernel(p.signature, compute_capability=cc)
            got = (kernel.name, None, kernel.ctas) if kernel is not None else ("none", None, None)
        else:
            config = nccl_default_config(q.cluster, p.signature)
            algo = ALGORITHM.get(config)  # an IntEnum: TREE is 0, so no ``or``
            got = (_ALGO_PRINTED[Algorithm.RING if algo is None else algo], PROTOCOL.get(config), CHANNELS.get(config))
        holds = (got[0].lower() == p.algo.lower() and (p.proto is None or got[1] is p.proto)
                 and (p.ctas is None or got[2] == p.ctas))
        shown = "/".join(str(x) for x in (got[0], _PROTO_PRINTED.get(got[1]) if got[1] is not None else None,
                                           f"{got[2]} ch" if got[2] is not None else None) if x)
        want = "/".join(str(x) for x in (p.algo, _PROTO_PRINTED[p.proto] if p.proto is not None else None,
                                          f"{p.ctas} ch" if p.ctas is not None else None) if x)
        rows.append(Row(label, shown, want, "same", holds, 0.0 if holds else 1.0))
        points.append({"bytes": p.signature.message_bytes, "model": shown, "nccl": want, "holds": holds})
    held = sum(r.holds is True for r in rows)
    holds_all = held == len(rows)
    head = Row(case.id, f"{held}/{len(rows)} points", f"{len(rows)} points", "same", holds_all,
               0.0 if holds_all else 1.0)
    return CaseResult(case.id, case.kind, holds_all, points, [pt["nccl"] for pt in points], {}, [head, *rows])


def _run_curve(case: Case, sim: Simulator, q: BusbwCurve) -> CaseResult:
    rows: list[Row] = []
    points: list[dict] = []
    for size, measured in q.points:
        signature = q.signature_for(size)
        label = f"  {size / (1 << 20):g} MiB"
        try:
            model = sim.collective_model(signature, q.forced)
        except LagomError as exc:
            reason = str(exc).split(": ", 1)[-1]
            rows.append(Row(f"{label} ({reason})", "-", f"{measured:g} GB/s", f"±{q.relative:.0%}", False, -1.0))
            points.append({"bytes": size, "busbw_GBps": None, "holds": False, "reason": reason})
            continue
        busbw = bus_bandwidth_gb_per_s(signature, model.alone_us)
        config = model.config
        algo, proto = ALGORITHM.get(config), PROTOCOL.get(config)
        pick = (f"{_ALGO_PRINTED[algo] if algo is not None else '?'}/"
                f"{_PROTO_PRINTED[proto] if proto is not None else '?'}")
        # NCCL's own estimate for its pick (latency + bytes / bandwidth): where it is as far from the measurement
        # as the simulator, the gap is outside NCCL's model too (nccl-tests' per-call cost at small sizes)
        own = [e.time_us for e in algo_estimates(q.cluster, signature) if e.pair == (algo, proto)]
        own_busbw = bus_bandwidth_gb_per_s(signature, own[0]) if own else None
        error = busbw / measured - 1
        holds = abs(error) <= q.relative
        nccl_own = f"; NCCL's estimate {own_busbw:,.1f}" if own_busbw is not None else ""
        rows.append(Row(f"{label} ({pick}{nccl_own})", f"{busbw:,.1f} GB/s", f"{measured:g} GB/s",
                        f"±{q.relative:.0%}", holds, error))
        points.append({"bytes": size, "busbw_GBps": round(busbw, 2), "pick": pick, "holds": holds,
                       "nccl_estimate_busbw_GBps": round(own_busbw, 2) if own_busbw is not None else None,
                       "nccl_estimate_holds": own_busbw is not None
                       and abs(own_busbw / measured - 1) <= q.relative})
    held = sum(r.holds is True for r in rows)
    holds_all = held == len(rows)
    forced = f" forced {q.forced_text}" if q.forced_text else ""
    head = Row(case.id + forced, f"{held}/{len(rows)} points", f"{len(rows)} points", f"±{q.relative:.0%}",
               holds_all)
    # the same points judged with NCCL's own estimate (tuning.cc latency + bytes / bandwidth of its pick) as the
    # model: how far NCCL's tuning model itself stands from nccl-tests' curve (bench/fidelity.py's ceiling line)
    own_held = sum(bool(pt.get("nccl_estimate_holds")) for pt in points)
    detail = {"forced": q.forced_text, "nccl_estimate_points_held": own_held,
              "nccl_estimate_holds": own_held == len(q.points)}
    return CaseResult(case.id, case.kind, holds_all, points, [{"bytes": b, "busbw_GBps": v} for b, v in q.points],
                      detail, [head, *rows])


def run_cases(cases: list[Case]) -> list[CaseResult]:
    runner = FidelityRunner()
    return [runner.run(case) for case in cases]


_WEAK_MARKERS = ("~", "single observation", "not a controlled", "approximate")


def is_weak(case: dict) -> bool:
    """A case its own note calls weak: a "~" figure, a single observation, not a controlled benchmark."""
    note = str(case.get("note", "")).lower()
    return any(marker in note for marker in _WEAK_MARKERS)


def _stratum(case: dict) -> tuple[str, str]:
    """(kind, GPU model) of a raw case: the GPU its preset has, or the first an ``other:`` cluster names."""
    cluster = str(case.get("cluster", ""))
    if cluster in preset_names():
        gpu = device_model(load_cluster(cluster).gpu.name) or cluster
    else:
        first = cluster[len(OTHER_PREFIX):].split("|")[0] if cluster.startswith(OTHER_PREFIX) else cluster
        gpu = (device_model(first.upper().lstrip("0123456789X").replace("-", " ")) or first).upper()
    return str(case.get("kind", "")), gpu


def assign_splits(cases: list[dict]) -> dict[str, str]:
    """The fitting/checking split, decided from the cases alone (never from a verdict): cases in
    order of (kind, GPU model, weak after strong, id), alternately ``fit`` and ``check`` from
    ``fit``. Each kind-and-GPU stratum splits about in half, its strong cases first to the
    fitting set; a stratum of one case goes where the alternation falls."""
    ordered = sorted(cases, key=lambda c: (*_stratum(c), is_weak(c), str(c.get("id"))))
    return {str(c.get("id")): SPLITS[i % 2] for i, c in enumerate(ordered)}


def _run_sweep(case: Case, sim: Simulator, q: ChannelSweep) -> CaseResult:
    def alone_us(count: int) -> float:
        return sim.collective_time_us(q.signature, CHANNELS.set(q.pair, count))

    plateau_us = sum(alone_us(c) for c in q.plateau_channels) / len(q.plateau_channels)
    rows: list[Row] = []
    model_points: list[dict] = []
    detail_points: list[dict] = []
    for count, measured in q.points:
        model = alone_us(count) - plateau_us
        limit = max(q.relative * abs(measured), q.absolute_us)
        holds = abs(model - measured) <= limit
        model_points.append({"channels": count, "delta_us": round(model, 1)})
        detail_points.append({"channels": count, "model_us": round(model, 1), "measured_us": measured,
                              "limit_us": round(limit, 1), "holds": holds})
        rows.append(Row(f"  {count} channel{'s' if count > 1 else ''}", f"{model:,.0f} us",
                        f"{measured:,.0f} us", f"±{limit:,.0f} us", holds,
                        (model - measured) / max(abs(measured), 1e-9)))
    held = sum(bool(p["holds"]) for p in detail_points)
    holds = held == len(detail_points)
    head = Row(case.id, f"{held}/{len(rows)} points", f"{len(rows)} points",
               f"max({q.relative:.0%}, {q.absolute_us:,.0f} us)", holds)
    resolved = sim.collective_model(q.signature, q.pair).config
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
    row = Row(case.id, f"{model:.2f} GB/s", f"{q.busbw_gb_per_s:g} GB/s", f"±{q.relative:.0%}", holds,
              model / q.busbw_gb_per_s - 1)
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


def _outside(value: float, low: float, high: float) -> float:
    """How far (relative) ``value`` lies outside [low, high]; 0 inside."""
    if value < low:
        return value / low - 1
    if value > high:
        return value / high - 1
    return 0.0


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
    row = Row(case.id, f"x{slowdown:.3f}", f"x{q.slowdown_min:.3g}..x{q.slowdown_max:.3g}", "range", holds,
              _outside(slowdown, q.slowdown_min, q.slowdown_max))
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


def _run_range(case: Case, runner: FidelityRunner, q: SlowdownRange) -> CaseResult:
    several = len({c.name for _, _, c in q.workloads}) > 1
    per = [overlap_slowdown(runner.simulator(cluster), f"{spec} on {cluster.name}" if several else spec, workload)
           for spec, workload, cluster in q.workloads]
    alone = sum(p.alone_us for p in per)
    mean = sum(p.beside_us for p in per) / alone if alone > 0 else 1.0
    largest = max(p.slowdown for p in per)
    mean_holds = _within(mean, q.mean_min, q.mean_max)
    largest_holds = _within(largest, 0.0, q.largest_max)
    holds = mean_holds and largest_holds
    rows = [Row(case.id, "", "", "", holds),
            Row("  duration-weighted mean", f"x{mean:.3f}", f"x{q.mean_min:.3g}..x{q.mean_max:.3g}", "range",
                mean_holds, _outside(mean, q.mean_min, q.mean_max)),
            Row("  largest workload mean", f"x{largest:.3f}", f"<= x{q.largest_max:.3g}", "bound", largest_holds,
                _outside(largest, 0.0, q.largest_max))]
    if q.stand_in:
        rows.insert(1, Row("  (the project's stand-ins for the described jobs, below)", "", "", "", None))
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
        rows.append(Row(f"  {label}", f"{model_ms:.3f} ms", f"{measured_ms:g} ms", f"±{q.relative:.0%}", holds,
                        model_ms / measured_ms - 1))

    seq_ms = sim.evaluate(sequential_workload(q.gemm, q.signature), Plan()).iteration_us / 1e3
    model["sequential"] = round(seq_ms, 4)
    judge("sequential (NCCL's defaults)", seq_ms, q.sequential_ms)
    together = tiny_overlap_workload(q.gemm, q.signature)
    for policy, measured_ms in q.overlap_ms:
        path = POLICY_PATHS[policy]
        config = PATH.set(CommConfig(), path)
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


def _run_rate(case: Case, sim: Simulator, q: AloneRate) -> CaseResult:
    config = PATH.set(CommConfig(), q.path)
    rows: list[Row] = []
    points: list[dict] = []
    holds_all = True
    mechanisms = set()
    harness = [at_floor and floor_us > HARNESS_OVER_NCCL_LATENCY * nccl_latency_us(sim.cluster, q.signature_for(size))
               for (size, _, _), floor_us, at_floor in zip(q.points, q.measured_us, q.at_floor)]
    if len(harness) > 1 and all(harness):
        sizes = sorted(size for size, _, _ in q.points)
        reason = (f"every point is at the source's per-call floor: its time is flat from {sizes[0] / (1 << 20):g} to "
                  f"{sizes[-1] / (1 << 20):g} MiB and over {HARNESS_OVER_NCCL_LATENCY:g}x NCCL's own latency, so it "
                  "measured the harness's per-call cost, not the collective")
        return CaseResult(case.id, case.kind, None, None, None, {"not_judged": reason},
                          [Row(case.id, "not judged", "", "", None), Row(f"  {reason}", "", "", "", None)],
                          not_judged=reason)
    for (size, key, measured), floor_us, at_floor in zip(q.points, q.measured_us, harness):
        signature = q.signature_for(size)
        model = sim.collective_model(signature, config)
        mechanisms.add(model.mechanism.value)
        time_us = model.alone_us
        label = f"  {size / (1 << 20):g} MiB{' per rank' if q.bytes_are == 'shard' else ''}"
        if at_floor:  # the source's time is a floor above the collective's: the model's must not exceed it
            holds = time_us <= floor_us * (1.0 + q.relative)
            holds_all = holds_all and holds
            rows.append(Row(label + " (at the source's floor: a bound)", f"{time_us:,.1f} us",
                            f"<= {floor_us:,.1f} us", f"+{q.relative:.0%}", holds,
                            max(0.0, time_us / floor_us - 1)))
            points.append({"bytes": size, "time_us": round(time_us, 2), "floor_us": round(floor_us, 2),
                           "convention": "floor", "holds": holds})
            continue
        if key == "time_us":
            value, unit, convention = time_us, "us", "time"
        else:
            algbw = signature.message_bytes / time_us / 1e3
            busbw = bus_bandwidth_gb_per_s(signature, time_us)
            options = {"algbw": algbw, "busbw": busbw}
            if q.convention == "unknown":  # either convention: the closer one, named
                convention = min(options, key=lambda c: abs(options[c] / measured - 1))
            else:
                convention = q.convention
            value, unit = options[convention], "GB/s"
        error = value / measured - 1
        holds = abs(error) <= q.relative
        holds_all = holds_all and holds
        rows.append(Row(label + (f" ({convention})" if key != "time_us" else ""), f"{value:,.1f} {unit}",
                        f"{measured:g} {unit}", f"±{q.relative:.0%}", holds, error))
        points.append({"bytes": size, key: round(value, 2), "convention": convention, "holds": holds})
    held = sum(r.holds is True for r in rows)
    head = Row(case.id, f"{held}/{len(rows)} points", f"{len(rows)} points", f"±{q.relative:.0%}", holds_all)
    return CaseResult(case.id, case.kind, holds_all, points, [{"bytes": b, k: v} for b, k, v in q.points],
                      {"nccl_version": str(q.nccl_version), "mechanism": sorted(mechanisms), "bytes_are": q.bytes_are},
                      [head, *rows])


def _measured_time_us(signature: Signature, key: str, value: float, convention: str) -> float:
    """A point's published time: itself, or the message over its rate (``unknown``: the shorter of
    algbw's and busbw's readings, the stricter bound)."""
    if key == "time_us":
        return value
    algbw_us = signature.message_bytes / value / 1e3
    busbw_us = bus_bandwidth_gb_per_s(signature, 1.0) / value  # the factor x message over the rate
    return {"algbw": algbw_us, "busbw": busbw_us}.get(convention, min(algbw_us, busbw_us))


def _run_gain(case: Case, sim: Simulator, q: PathGain) -> CaseResult:
    gpn = sim.cluster.gpus_per_node
    signatures = {q.workload.signature(c, gpn) for c in q.workload.collectives if c.on_gpu}
    moved = {s: PATH.set(CommConfig(), q.path) for s in signatures if s.collective in q.collectives}
    before = sim.evaluate(q.workload, Plan()).iteration_us
    after = sim.evaluate(q.workload, Plan(entries=moved)).iteration_us
    sim.evaluations -= 2  # asked for a figure, not a search's evaluation
    model = (before / after - 1) * 100
    if q.absolute_pct is not None:
        limit, tolerance = q.absolute_pct, f"±{q.absolute_pct:g} pt"
    else:
        limit, tolerance = abs(q.relative or 0.0) * abs(q.measured_pct), f"±{q.relative:.0%}"
    holds = abs(model - q.measured_pct) <= limit + 1e-9
    mechanisms = sorted({sim.collective_model(s, c).mechanism.value for s, c in moved.items()})
    what = f"{', '.join(sorted(c.value for c in q.collectives if any(s.collective is c for s in moved)))} " \
           f"on {q.path.value}"
    rows = [Row(case.id, f"{model:+.2f}%", f"{q.measured_pct:+g}%", tolerance, holds,
                (model - q.measured_pct) / max(abs(q.measured_pct), 1e-9)),
            Row(f"  {'stand-in ' if q.stand_in else ''}workload {q.spec} on {sim.cluster.name}, NCCL "
                f"{q.nccl_version}: {what} ({', '.join(mechanisms) or 'nothing moved'})", "", "", "", None)]
    return CaseResult(case.id, case.kind, holds, round(model, 3), q.measured_pct,
                      {"workload": q.spec, "stand_in": q.stand_in, "nccl_version": str(q.nccl_version),
                       "iteration_us": {"before": round(before, 1), "after": round(after, 1)},
                       "moved": sorted(s.describe() if hasattr(s, "describe") else str(s) for s in moved),
                       "mechanisms": mechanisms},
                      rows)


__all__ = ["Case", "CaseResult", "FidelityRunner", "Row", "assign_splits", "bus_bandwidth_gb_per_s", "gemm_beside_us",
           "is_weak", "load_cases", "overlap_slowdown", "parse_cases", "run_cases", "sequential_workload"]
