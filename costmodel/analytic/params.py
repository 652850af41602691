"""The analytic model's parameters: the cluster file's ``model:`` mapping.

``lagom calibrate`` fits these; without a ``model:`` section the analytic model
uses :func:`default_params`, derived from the cluster's hardware numbers, so the
tuner also works on an uncalibrated preset. Schema (all floats, units in the names)::

    model:
      version: 1
      fitted_from: sim:low-bw          # what calibration measured (free text)
      intra_bw_gb_per_s: 22.0          # achievable per-GPU ring bandwidth inside a node
      net_bw_gb_per_s: 11.5            # achievable per-node ring bandwidth between nodes
      channel_bw_gb_per_s: 18.0        # one channel (CTA) at 512 threads, Simple
      ...

Unknown keys are rejected (one line naming the key), missing keys take their
default, so a file written by an older Lagom still loads. What each parameter
means is in :data:`PARAMS`; how they enter the equations is in
:mod:`costmodel.analytic.collective_model` and :mod:`costmodel.analytic.contention_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.cluster import ClusterSpec
from costmodel.nccl_algorithms import nvls_efficiency
from costmodel.nccl_defaults import nccl_graph
from nccl_env.errors import LagomError

MODEL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class ParamSpec:
    """One fitted parameter: its meaning, default from hardware, and fit bounds."""

    name: str
    doc: str
    default: Callable[[ClusterSpec], float]
    lower: float
    upper: float
    term: str  # which term of the model it belongs to (the fit report groups by it)


def _intra_bw(c: ClusterSpec) -> float:
    return c.intra_node.bw_gb_per_s


def _net_bw(c: ClusterSpec) -> float:
    return c.inter_node.nic_bw_gb_per_s * c.inter_node.nics_per_node


def _sm86(c: ClusterSpec) -> bool:
    """GA10x (A40, sm_86): NCCL halves its per-channel bandwidth figures there."""
    return int((c.nccl_graph or {}).get("compute_capability", 86 if c.gpu.sm_count == 84 else 80)) == 86


def _nvls_channel_bw(c: ClusterSpec) -> float:
    """NCCL's per-channel NVLink figure times its NVLS efficiency (tuning.cc nvlsEfficiency), as the
    simulator's NVLS channel (sim: simple_bw_per_channel x nvls_efficiency)."""
    graph = nccl_graph(c)
    sim = c.sim or {}
    simple = float(sim.get("simple_bw_per_channel_gb_per_s", graph.bw_intra_gb_per_s))
    return simple * float(sim.get("nvls_efficiency") or nvls_efficiency(graph.compute_capability))


PARAMS: tuple[ParamSpec, ...] = (
    # ---- collective alone: links ----------------------------------------------------------------
    ParamSpec("intra_bw_gb_per_s", "link bandwidth per GPU and direction inside a node", _intra_bw, 0.5, 5000.0,
              "bandwidth"),
    ParamSpec("net_bw_gb_per_s", "network bandwidth per node and direction (all its NICs)", _net_bw, 0.1, 5000.0,
              "bandwidth"),
    ParamSpec("tree_bw_factor", "Tree's link bandwidth relative to Ring's", lambda c: 0.92, 0.05, 2.0,
              "bandwidth"),  # NCCL tuning.cc: tree 0.92 of ring
    # ---- collective alone: channels (one CTA each) ------------------------------------------------
    ParamSpec("channel_bw_simple_gb_per_s", "one channel's copy rate with Simple at full threads",
              lambda c: 12.0 if _sm86(c) else 20.0, 0.1, 1000.0, "channels"),  # NCCL topo.h SM86/SM80_NVLINK_BW
    ParamSpec("channel_bw_ll128_gb_per_s", "one channel's copy rate with LL128 at full threads",
              lambda c: 10.0 if _sm86(c) else 20.0, 0.1, 1000.0, "channels"),  # NCCL tuning.cc perChMaxRingLL128Bws
    ParamSpec("channel_bw_ll_gb_per_s", "one channel's copy rate with LL at full threads",
              lambda c: 4.0 if _sm86(c) else 5.5, 0.05, 1000.0, "channels"),  # NCCL tuning.cc llMaxBws / 16
    ParamSpec("saturation_threads", "threads per channel from which its copy rate stops growing",
              lambda c: 256.0, 32.0, 1024.0, "threads"),  # ~8 warps hide a copy loop's latency (Little's law)
    ParamSpec("ll_payload", "LL: payload share of the link (8 flag bytes per 8 data bytes)",
              lambda c: 0.5, 0.05, 1.0, "protocol"),  # NCCL devcomm.h ncclLLFifoLine
    ParamSpec("ll128_payload", "LL128: payload share of the link (8 flag bytes per 128-byte line)",
              lambda c: 120.0 / 128.0, 0.05, 1.0, "protocol"),  # NCCL devcomm.h LL128 line
    # ---- collective alone: latency -------------------------------------------------------------------
    ParamSpec("launch_us", "fixed cost of one collective (kernel launch, work fetch)", lambda c: 5.0, 0.0, 5000.0,
              "latency"),  # NCCL tuning.cc baseLat 6.6-8.4 us
    ParamSpec("intra_hop_us", "latency of one hop inside a node", lambda c: c.intra_node.latency_us, 0.0, 5000.0,
              "latency"),
    ParamSpec("net_hop_us", "latency of one hop across the network", lambda c: c.inter_node.latency_us, 0.0,
              5000.0, "latency"),
    ParamSpec("sync_simple_us", "Simple: synchronisation per chunk step (fence, flag, poll)", lambda c: 1.0, 0.0,
              1000.0, "chunk"),
    ParamSpec("sync_ll128_us", "LL128: synchronisation per chunk step", lambda c: 0.4, 0.0, 1000.0, "chunk"),
    ParamSpec("sync_ll_us", "LL: synchronisation per chunk step", lambda c: 0.2, 0.0, 1000.0, "chunk"),
    # ---- what a collective puts on memory --------------------------------------------------------------
    ParamSpec("coll_dram_per_byte", "DRAM bytes a collective moves per payload byte (its result, its input)",
              lambda c: 1.0, 0.0, 20.0, "contention"),
    ParamSpec("fifo_dram_per_byte", "extra DRAM bytes per payload byte when its FIFO does not fit in L2",
              lambda c: 2.0, 0.0, 20.0, "contention"),
    ParamSpec("fifo_chunks", "chunks per channel resident in L2 (footprint = this x channels x chunk)",
              lambda c: 0.5, 0.0, 16.0, "contention"),  # one slice: NCCL SLICESTEPS/CHUNKSTEPS = 1/2
    # ---- compute alone ------------------------------------------------------------------------------------
    ParamSpec("gemm_efficiency", "share of peak FLOP/s a GEMM block reaches", lambda c: 0.7, 0.05, 1.0,
              "compute"),  # cuBLAS large BF16 GEMMs: ~70% of peak
    ParamSpec("attention_efficiency", "share of peak FLOP/s an attention kernel reaches", lambda c: 0.6, 0.05, 1.0,
              "compute"),  # FlashAttention-2 forward ~60% of peak (Dao 2023)
    ParamSpec("mem_efficiency", "share of peak DRAM bandwidth kernels reach", lambda c: 0.85, 0.1, 1.0,
              "compute"),  # STREAM-like copies ~85%
    ParamSpec("kernel_overhead_us", "fixed cost of one compute kernel (launch, tail)", lambda c: 2.0, 0.0, 1000.0,
              "compute"),
    # ---- contention -----------------------------------------------------------------------------------------
    ParamSpec("cta_wait_waves", "a collective launched beside a GPU-filling kernel waits this many of its waves",
              lambda c: 0.5, 0.0, 4.0, "contention"),  # SMs free at the end of the current wave: half a wave on average
    ParamSpec("gemm_short_reuse", "operand reuse a GEMM keeps when its wave's slabs do not fit in L2",
              lambda c: 1.2, 1.0, 100.0, "contention"),
    ParamSpec("l2_working_set", "L2 a resident GEMM tile needs for full reuse, in shared-memory tiles",
              lambda c: 1.0, 0.05, 20.0, "contention"),
)

# The copy-engine and symmetric-kernel paths (collective_model.copy_engine_estimate,
# symmetric_estimate): hardware figures the calibration plan does not measure (it runs NCCL's
# kernels only), so they are not fitted; defaults from the cluster, as the simulator's.
PATH_PARAMS: tuple[ParamSpec, ...] = (
    ParamSpec("ce_bw_gb_per_s", "copy engines' bandwidth per GPU and direction over the intra-node link",
              lambda c: c.intra_node.copy_engine_bw, 0.5, 5000.0, "paths"),  # preset intra_node
    ParamSpec("ce_copy_latency_us", "one small copy-engine write to a peer (a barrier writes one per peer)",
              lambda c: 2.0, 0.0, 1000.0, "paths"),  # p2pBandwidthLatencyTest P2P write latency 1.8-2.3 us
    ParamSpec("direct_dram_per_byte", "DRAM bytes per wire byte of a copy between registered buffers",
              lambda c: 2.0, 0.0, 20.0, "paths"),  # source read + destination write (NVIDIA/nccl #1428)
    # NVLS (collective_model.nvls_estimate): the calibration plan runs ring and tree only
    ParamSpec("nvls_channel_bw_gb_per_s", "one NVLS channel's NVLink rate (multimem loads and stores)",
              _nvls_channel_bw, 0.1, 1000.0, "paths"),
)

PARAM_NAMES = tuple(p.name for p in PARAMS)
_BY_NAME = {p.name: p for p in (*PARAMS, *PATH_PARAMS)}
_META_KEYS = {"version", "fitted_from", "fit_report"}


def default_params(cluster: ClusterSpec) -> dict[str, float]:
    """Parameters derived from the cluster's hardware numbers (no calibration), the fitted ones
    (:data:`PARAMS`) and the path ones (:data:`PATH_PARAMS`)."""
    return {p.name: float(p.default(cluster)) for p in (*PARAMS, *PATH_PARAMS)}


def params_for(cluster: ClusterSpec) -> dict[str, float]:
    """The cluster's ``model:`` values over :func:`default_params`; LagomError on bad keys."""
    out = default_params(cluster)
    origin = cluster.source or f"cluster {cluster.name}"
    for key, value in (cluster.model or {}).items():
        if key in _META_KEYS:
            continue
        spec = _BY_NAME.get(key)
        if spec is None:
            raise LagomError(f"{origin}: unknown model parameter 'model.{key}'")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise LagomError(f"{origin}: 'model.{key}' must be a number, got {value!r}") from None
        if not (spec.lower <= number <= spec.upper):
            raise LagomError(f"{origin}: 'model.{key}' = {number} is outside [{spec.lower}, {spec.upper}]")
        out[key] = number
    return out


def model_section(values: dict[str, float], fitted_from: str, fit_report: dict | None = None,
                  defaults: dict[str, float] | None = None) -> dict:
    """The ``model:`` mapping to store in a cluster file: every fitted parameter, and each path
    parameter in ``values`` that differs from ``defaults`` (the cluster's own figure), so a file
    that set one keeps it without pinning the others."""
    out: dict = {"version": MODEL_FORMAT_VERSION, "fitted_from": fitted_from}
    out.update({name: float(f"{values[name]:.6g}") for name in PARAM_NAMES})
    for spec in PATH_PARAMS:
        value = values.get(spec.name)
        if value is not None and (defaults is None or value != defaults.get(spec.name)):
            out[spec.name] = float(f"{value:.6g}")
    if fit_report:
        out["fit_report"] = fit_report
    return out


def param_spec(name: str) -> ParamSpec:
    return _BY_NAME[name]
