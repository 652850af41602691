"""Calibration: measure a cluster a few hundred times, fit the analytic model to it.

``calibrate(backend, budget=300, progress=None) -> CalibrationResult``

1. A measurement plan (:func:`measurement_plan`), deterministic for a seed:
   collectives alone over message sizes, algorithms, protocols, channels, chunks and
   threads (a random design plus one-knob sweeps around NCCL's default), a few
   compute shapes alone, and the same shapes under concurrent collectives with
   channels and chunks varied.
2. The backend measures each item (:mod:`costmodel.calibration.backend`).
3. ``scipy.optimize.least_squares`` fits the parameters of :data:`costmodel.analytic.params.PARAMS`
   on log-ratio residuals (model / measured) with a soft-L1 loss, so a few noisy or
   unmodellable points do not drag the fit: first the collective terms on the
   collectives alone, then the contention terms on the overlap measurements, then
   everything together.
4. The result is the backend's cluster with its ``model:`` section filled (plus a
   summary of the fit), which every ``--cluster`` option accepts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
from scipy.optimize import least_squares

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.analytic.params import PARAMS, default_params, model_section, params_for
from costmodel.calibration.backend import CalibrationBackend
from costmodel.cluster import ClusterSpec
from costmodel.nccl_defaults import cluster_max_channels, nccl_default_config
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, PROTOCOL, THREADS
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plan import Signature
from traces.generate import gemm_tile as generator_gemm_tile
from traces.workload import ComputeOp

Progress = Callable[[int, int, str], None]

_KIB = 1024
_MIB = 1024 * 1024



@dataclass
class Measurement:
    """One item of the plan, and what the backend measured for it (microseconds)."""

    kind: str  # "collective" | "compute" | "overlap"
    group: str  # the fit report's row: which term of the model this measurement pins
    signature: Signature | None = None
    config: CommConfig | None = None
    op: ComputeOp | None = None
    measured_us: tuple[float, ...] = ()


@dataclass
class TermResidual:
    term: str
    count: int
    mape_pct: float
    max_abs_pct: float
    bias_pct: float  # mean signed error: > 0 means the model over-predicts


@dataclass
class FitReport:
    backend: str
    measurements: int
    residuals: list[TermResidual]
    params: list[tuple[str, float, float, str, bool]]  # name, fitted, default, term, was fitted
    mape_pct: float
    default_mape_pct: float  # the model at the fit's starting point (hardware defaults) on the same measurements

    def summary(self) -> dict:
        """A plain mapping for the cluster file's ``model.fit_report``."""
        return {
            "backend": self.backend,
            "measurements": self.measurements,
            "mape_pct": round(self.mape_pct, 3),
            "uncalibrated_mape_pct": round(self.default_mape_pct, 3),
            "terms": {r.term: {"n": r.count, "mape_pct": round(r.mape_pct, 3), "max_pct": round(r.max_abs_pct, 3)}
                      for r in self.residuals},
        }


@dataclass
class CalibrationResult:
    cluster: ClusterSpec  # the backend's cluster with ``model:`` filled
    params: dict[str, float]
    report: FitReport
    measurements: list[Measurement] = field(default_factory=list)


# ---- the measurement plan ------------------------------------------------------------------------
def gemm_op(m: int, n: int, k: int, label: str = "calib") -> ComputeOp:
    """A BF16 GEMM C[m,n] = A[m,k] B[k,n] launched the way the workload generators launch one
    (cuBLAS-like tile choice and kernel name, compulsory DRAM bytes; duration is a hint)."""
    bm, bn, block_threads, bps, smem = generator_gemm_tile(m, n)
    flops = 2.0 * m * n * k
    dram = float((m * k + k * n + m * n) * 2)
    return ComputeOp(op_id=1, name=f"ampere_bf16_s16816gemm_bf16_{bm}x{bn}_ldg8_f2f_stages_32x3_tn [{label}]",
                     stream=0, start_us=0.0, duration_us=flops / 1e8, grid=(math.ceil(n / bn), math.ceil(m / bm), 1),
                     block=(block_threads, 1, 1), blocks_per_sm=float(bps), shared_memory_bytes=smem, flops=flops,
                     dram_bytes=dram)


def attention_op(batch: int, seq: int, heads: int, head_dim: int, backward: bool) -> ComputeOp:
    """A causal FlashAttention-2 kernel (2 products of b*h*s*s*d, halved by the mask; backward 2.5x)."""
    flops = 2.0 * 2.0 * batch * heads * seq * seq * head_dim / 2.0 * (2.5 if backward else 1.0)
    dram = float(4 * batch * seq * heads * head_dim * 2 * (2 if backward else 1))
    kind = "bwd" if backward else "fwd"
    return ComputeOp(op_id=1, name=f"flash_{kind}_kernel [calib]", stream=0, start_us=0.0, duration_us=flops / 1e8,
                     grid=(math.ceil(seq / 128), batch * heads, 1), block=(128, 1, 1), blocks_per_sm=1.0,
                     shared_memory_bytes=96 * 1024, flops=flops, dram_bytes=dram)


def elementwise_op(elements: int, bytes_per_element: float) -> ComputeOp:
    """A memory-bound element-wise kernel (256 threads, 8 elements per thread, 6 blocks per SM)."""
    dram = float(elements * bytes_per_element)
    return ComputeOp(op_id=1, name="vectorized_elementwise_kernel [calib]", stream=0, start_us=0.0,
                     duration_us=dram / 5e5, grid=(max(1, math.ceil(elements / (256 * 8))), 1, 1),
                     block=(256, 1, 1), blocks_per_sm=6.0, flops=4.0 * elements, dram_bytes=dram)


def calibration_shapes(cluster: ClusterSpec) -> list[ComputeOp]:
    """Kernels the compute measurements use: GEMMs of every tile class, attention, element-wise."""
    return [
        gemm_op(4096, 14336, 4096),  # FFN up, 256x128 tiles
        gemm_op(4096, 4096, 14336),  # FFN down
        gemm_op(4096, 4096, 4096),  # attention projection
        gemm_op(2048, 10240, 2560),  # Phi-2 FFN
        gemm_op(2048, 2560, 2560),  # Phi-2 projection, 128x128 tiles
        gemm_op(512, 4096, 4096),  # a skinny GEMM
        gemm_op(256, 2048, 1024),  # small, 64x64 tiles
        gemm_op(4096, 50304, 2560),  # an LM head
        attention_op(2, 2048, 32, 128, backward=False),
        attention_op(2, 2048, 32, 128, backward=True),
        elementwise_op(64 * 1024 * 1024, 4.0),
        elementwise_op(4 * 1024 * 1024, 6.0),
    ]


def measurement_plan(backend: CalibrationBackend, budget: int = 300, seed: int = 0) -> list[Measurement]:
    """The items to measure, at most ``budget`` of them (deterministic for a seed)."""
    if budget < 20:
        raise LagomError(f"calibration budget {budget} is too small (at least 20 measurements)")
    cluster = backend.cluster
    rng = random.Random(seed)
    layouts = backend.rank_layouts()
    max_nc = cluster_max_channels(cluster)
    channel_steps = [c for c in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if c <= max_nc]
    types = [CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLTOALL]
    shapes = calibration_shapes(cluster)

    def sig(ctype: CollectiveType, nbytes: int, layout: tuple[int, int]) -> Signature:
        return Signature("calib", ctype, int(nbytes), layout[0], layout[1])

    cap = getattr(backend, "max_message_bytes", None) or 512 * _MIB

    def log_uniform(lo: float, hi: float) -> float:
        return math.exp(rng.uniform(math.log(lo), math.log(hi)))

    def size(lo: int, hi: int) -> int:
        """A message size, log-uniform in [lo, hi] scaled into the backend's limit, KiB-aligned."""
        if hi > cap:
            lo, hi = max(4 * _KIB, lo * cap // hi), cap
        return max(4 * _KIB, int(log_uniform(lo, hi)) // _KIB * _KIB)

    def random_config(ctype: CollectiveType) -> CommConfig:
        algo = Algorithm.TREE if ctype is CollectiveType.ALLREDUCE and rng.random() < 0.2 else Algorithm.RING
        proto = rng.choices([Protocol.SIMPLE, Protocol.LL128, Protocol.LL], [0.6, 0.2, 0.2])[0]
        chunk = int(log_uniform(16 * _KIB, 8 * _MIB)) // (4 * _KIB) * (4 * _KIB)
        return CommConfig(algo, proto, rng.choice(channel_steps), rng.choice([64, 128, 256, 384, 512]), chunk)

    n_compute = min(len(shapes), max(3, budget // 25))
    shapes = shapes[:n_compute]
    n_overlap = max(4, int(0.3 * budget))
    n_sweep = max(6, int(0.18 * budget))
    n_random = budget - n_compute - n_overlap - n_sweep
    plan: list[Measurement] = []
    # compute alone
    for op in shapes:
        plan.append(Measurement("compute", "compute alone", op=op))
    # collectives alone: random design
    for _ in range(n_random):
        ctype = rng.choice(types)
        layout = rng.choice(layouts)
        nbytes = size(32 * _KIB, 512 * _MIB)
        s = sig(ctype, nbytes, layout)
        cfg = random_config(ctype)
        group = "collective latency-bound" if nbytes < 1 * _MIB else "collective bandwidth-bound"
        proto = PROTOCOL.get(cfg)
        if proto is not None and proto is not Protocol.SIMPLE:
            group = f"collective {proto.nccl_name}"
        plan.append(Measurement("collective", group, s, cfg))
    # one-knob sweeps around NCCL's default for a large AllReduce / AllGather on every layout
    sweeps: list[Measurement] = []
    for layout in layouts:
        for ctype, nbytes in ((CollectiveType.ALLREDUCE, 64 * _MIB), (CollectiveType.ALLGATHER, 16 * _MIB)):
            s = sig(ctype, min(nbytes, cap), layout)
            base = nccl_default_config(cluster, s)
            base = PROTOCOL.set(ALGORITHM.set(base, Algorithm.RING), Protocol.SIMPLE)
            sweeps += [Measurement("collective", "channel sweep", s, CHANNELS.set(base, c)) for c in channel_steps]
            sweeps += [Measurement("collective", "chunk sweep", s, CHUNK.set(base, c * _KIB))
                       for c in (32, 128, 512, 2048, 8192)]
            sweeps += [Measurement("collective", "thread sweep", s, THREADS.set(base, t)) for t in (64, 128, 256)]
    rng.shuffle(sweeps)
    plan += sweeps[:n_sweep]
    # overlap: every shape under collectives with channels and chunk varied
    overlap_types = [CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER]
    for i in range(n_overlap):
        op = shapes[i % len(shapes)]
        layout = layouts[(i // len(shapes)) % len(layouts)]
        ctype = overlap_types[i % len(overlap_types)]
        s = sig(ctype, size(1 * _MIB, 128 * _MIB), layout)
        base = nccl_default_config(cluster, s)
        cfg = ALGORITHM.set(base, Algorithm.RING)
        cfg = CHANNELS.set(cfg, channel_steps[i % len(channel_steps)])
        cfg = CHUNK.set(cfg, int(log_uniform(64 * _KIB, 8 * _MIB)) // (4 * _KIB) * (4 * _KIB))
        cfg = PROTOCOL.set(cfg, Protocol.SIMPLE if rng.random() < 0.8 else Protocol.LL128)
        plan.append(Measurement("overlap", "overlap", s, cfg, op=op))
    return plan[:budget]


# ---- measuring -----------------------------------------------------------------------------------------
def run_measurements(backend: CalibrationBackend, plan: list[Measurement], progress: Progress | None = None) -> None:
    """Fill ``measured_us`` of every item."""
    total = len(plan)
    ordered = sorted(range(total), key=lambda i: {"compute": 0, "collective": 1, "overlap": 2}[plan[i].kind])
    for done, i in enumerate(ordered, 1):
        m = plan[i]
        if m.kind == "compute":
            assert m.op is not None
            m.measured_us = (backend.measure_compute(m.op),)
        elif m.kind == "collective":
            assert m.signature is not None and m.config is not None
            m.measured_us = (backend.measure_collective(m.signature, m.config),)
        else:
            assert m.op is not None and m.signature is not None and m.config is not None
            m.measured_us = tuple(backend.measure_overlap(m.op, m.signature, m.config))
        if progress is not None:
            progress(done, total, m.group)


# ---- fitting ---------------------------------------------------------------------------------------------
def _predict(ev: AnalyticEvaluator, m: Measurement) -> tuple[float, ...]:
    """What the analytic model says for a measurement item (same units as ``measured_us``)."""
    if m.kind == "compute":
        assert m.op is not None
        return (ev.compute_time_us(m.op),)
    assert m.signature is not None and m.config is not None
    if m.kind == "collective":
        return (ev.estimate(m.signature, m.config).time_us,)
    assert m.op is not None
    return ev.overlap_us(m.op, m.signature, m.config)


class _Fitter:
    """Parameters <-> a vector (log scale where positive), residuals over measurements."""

    def __init__(self, cluster: ClusterSpec, items: list[Measurement], start: dict[str, float],
                 names: list[str]) -> None:
        self.cluster = cluster
        self.items = [m for m in items if all(v > 0 for v in m.measured_us)]
        self.start = dict(start)
        self.names = names
        specs = {p.name: p for p in PARAMS}
        self.log = [specs[n].lower > 0 for n in names]
        self.lo = np.array([math.log(specs[n].lower) if lg else specs[n].lower for n, lg in zip(names, self.log)])
        self.hi = np.array([math.log(specs[n].upper) if lg else specs[n].upper for n, lg in zip(names, self.log)])
        self.measured = np.log(np.array([v for m in self.items for v in m.measured_us]))

    def to_vector(self, params: dict[str, float]) -> np.ndarray:
        x = np.array([math.log(params[n]) if lg else params[n] for n, lg in zip(self.names, self.log)])
        return np.clip(x, self.lo + 1e-9, self.hi - 1e-9)

    def to_params(self, x: np.ndarray) -> dict[str, float]:
        out = dict(self.start)
        for n, lg, v in zip(self.names, self.log, x):
            out[n] = math.exp(v) if lg else float(v)
        return out

    def residuals(self, x: np.ndarray) -> np.ndarray:
        ev = AnalyticEvaluator(self.cluster, self.to_params(x))
        pred = [v for m in self.items for v in _predict(ev, m)]
        return np.log(np.maximum(np.array(pred), 1e-6)) - self.measured

    def fit(self, noise_scale: float) -> dict[str, float]:
        if not self.items or not self.names:
            return dict(self.start)
        x0 = self.to_vector(self.start)
        r0 = self.residuals(x0)
        # drop parameters the measurements do not see (e.g. the network on a one-node cluster)
        keep = []
        for i in range(len(x0)):
            step = np.array(x0)
            step[i] = min(self.hi[i], x0[i] + 0.05 * max(1.0, abs(x0[i]))) if x0[i] + 1e-3 < self.hi[i] else self.lo[i]
            if np.max(np.abs(self.residuals(step) - r0)) > 1e-9:
                keep.append(i)
        if not keep:
            return dict(self.start)
        names = [self.names[i] for i in keep]
        sub = _Fitter(self.cluster, self.items, self.start, names)
        result = least_squares(sub.residuals, sub.to_vector(self.start), bounds=(sub.lo, sub.hi), loss="soft_l1",
                               f_scale=noise_scale, x_scale="jac", max_nfev=60 * len(names), diff_step=1e-4)
        return sub.to_params(result.x)


def fit_params(cluster: ClusterSpec, items: list[Measurement], start: dict[str, float] | None = None,
               noise_scale: float = 0.02) -> dict[str, float]:
    """Fitted parameters, in stages: collective terms on collectives alone, compute terms on
    kernels alone, contention terms on the overlaps, then everything on everything."""
    params = dict(start) if start is not None else default_params(cluster)
    by_term: dict[str, list[str]] = {}
    for spec in PARAMS:
        by_term.setdefault(spec.term, []).append(spec.name)
    compute_names = by_term.get("compute", [])
    contention_names = by_term.get("contention", [])
    collective_names = [p.name for p in PARAMS if p.term not in ("compute", "contention")]
    stages = [
        ([m for m in items if m.kind == "collective"], collective_names),
        ([m for m in items if m.kind == "compute"], compute_names),
        ([m for m in items if m.kind == "overlap"], contention_names),
        (items, [p.name for p in PARAMS]),
    ]
    for subset, names in stages:
        params = _Fitter(cluster, subset, params, names).fit(noise_scale)
    return params


def fit_report(backend_name: str, cluster: ClusterSpec, items: list[Measurement], params: dict[str, float],
               fitted: set[str], start: dict[str, float] | None = None) -> FitReport:
    """Residuals per term at the fitted parameters; ``start`` (default: the hardware defaults)
    is the baseline the report compares with."""
    defaults = default_params(cluster)
    start = start if start is not None else defaults

    def errors(values: dict[str, float]) -> list[tuple[str, float]]:
        ev = AnalyticEvaluator(cluster, values)
        out = []
        for m in items:
            pred = _predict(ev, m)
            labels = [m.group] if m.kind != "overlap" else ["overlap: compute", "overlap: collective"]
            for label, p, v in zip(labels, pred, m.measured_us):
                out.append((label, 100.0 * (p - v) / v))
        return out

    fitted_errors = errors(params)
    by_term: dict[str, list[float]] = {}
    for label, e in fitted_errors:
        by_term.setdefault(label, []).append(e)
    rows = [TermResidual(term, len(es), sum(map(abs, es)) / len(es), max(map(abs, es)), sum(es) / len(es))
            for term, es in sorted(by_term.items())]
    mape = sum(abs(e) for _, e in fitted_errors) / max(1, len(fitted_errors))
    default_errors = errors(start)
    default_mape = sum(abs(e) for _, e in default_errors) / max(1, len(default_errors))
    table = [(p.name, params[p.name], defaults[p.name], p.term, p.name in fitted) for p in PARAMS]
    return FitReport(backend_name, len(items), rows, table, mape, default_mape)


def calibrate(backend: CalibrationBackend, budget: int = 300, progress: Progress | None = None,
              seed: int = 0, start: dict[str, float] | None = None) -> CalibrationResult:
    """Measure ``backend`` at most ``budget`` times and fit the analytic model to it.

    The fit starts from ``start`` if given, else from the cluster's ``model:`` section, else
    from the hardware defaults."""
    plan = measurement_plan(backend, budget, seed)
    run_measurements(backend, plan, progress)
    cluster = backend.cluster
    if start is None:
        start = params_for(cluster) if cluster.model else default_params(cluster)
    params = fit_params(cluster, plan, start)
    fitted = {n for n in params if abs(params[n] - start[n]) > 1e-12}
    report = fit_report(backend.name, cluster, plan, params, fitted, start)
    model = model_section(params, backend.name, report.summary(), default_params(cluster))
    out = replace(cluster, model=model, source="")
    return CalibrationResult(out, params, report, plan)
