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
:mod:`costmodel.collective_model` and :mod:`costmodel.contention_model`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from costmodel.cluster import ClusterSpec
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
    return 0.9 * c.intra_node.bw_gb_per_s  # NCCL rings reach ~90% of link bandwidth (nccl-tests busbw)


def _net_bw(c: ClusterSpec) -> float:
    return 0.9 * c.inter_node.nic_bw_gb_per_s * c.inter_node.nics_per_node  # ~90% of line rate (IB verbs)


PARAMS: tuple[ParamSpec, ...] = (
    # ---- collective alone: bandwidth terms ---------------------------------------
    ParamSpec("intra_bw_gb_per_s", "ring bus bandwidth ceiling per GPU inside a node", _intra_bw, 0.5, 2000.0, "bandwidth"),
    ParamSpec("net_bw_gb_per_s", "ring bus bandwidth ceiling per node across nodes (all NICs)", _net_bw, 0.1, 2000.0, "bandwidth"),
    ParamSpec("channel_bw_simple_gb_per_s", "one channel's bandwidth at 512 threads with Simple",
              lambda c: 12.0, 0.1, 1000.0, "channels"),  # NCCL topo.h SM86_NVLINK_BW: 12 GB/s per channel
    ParamSpec("channel_bw_ll128_gb_per_s", "one channel's bandwidth at 512 threads with LL128",
              lambda c: 10.0, 0.1, 1000.0, "channels"),  # NCCL 2.18 tuning.cc perChMaxRingLL128Bws (sm_86 halved)
    ParamSpec("channel_bw_ll_gb_per_s", "one channel's bandwidth at 512 threads with LL",
              lambda c: 4.0, 0.05, 1000.0, "channels"),  # NCCL 2.18 tuning.cc llMaxBws (sm_86 halved)
    ParamSpec("thread_exponent", "channel bandwidth scales as (threads/512)^this",
              lambda c: 0.5, 0.0, 2.0, "threads"),
    ParamSpec("ll_link_factor", "LL: share of the link that carries payload (8-byte lines carry 4)",
              lambda c: 0.5, 0.05, 1.2, "protocol"),  # NCCL tuning.cc: LL carries half payload
    ParamSpec("ll128_link_factor", "LL128: share of the link that carries payload",
              lambda c: 0.92, 0.05, 1.2, "protocol"),  # NCCL tuning.cc: LL128 ~92% (120 of 128 bytes)
    # ---- collective alone: latency terms -------------------------------------------
    ParamSpec("launch_us", "fixed cost of one collective (launch, setup)", lambda c: 5.0, 0.0, 5000.0, "latency"),
    ParamSpec("step_simple_us", "latency of one pipeline step with Simple (per hop)",
              lambda c: 3.4 + c.intra_node.latency_us, 0.0, 5000.0, "latency"),  # NCCL tuning.cc hw latency
    ParamSpec("step_ll_us", "latency of one pipeline step with LL (per hop)",
              lambda c: 0.6 + c.intra_node.latency_us, 0.0, 5000.0, "latency"),
    ParamSpec("step_ll128_us", "latency of one pipeline step with LL128 (per hop)",
              lambda c: 1.9 + c.intra_node.latency_us, 0.0, 5000.0, "latency"),
    ParamSpec("net_step_us", "extra latency of a step that crosses the network",
              lambda c: c.inter_node.latency_us, 0.0, 5000.0, "latency"),
    ParamSpec("pipeline_fill", "pipeline fill, in stages per hop: time grows with the chunk size past a point",
              lambda c: 0.25, 0.0, 20.0, "chunk"),
    ParamSpec("channel_overhead_us", "cost per channel (setup, synchronisation); makes too many channels slower",
              lambda c: 0.2, 0.0, 50.0, "channels"),
    ParamSpec("tree_bw_factor", "Tree AllReduce bandwidth relative to Ring", lambda c: 0.9, 0.05, 2.0, "bandwidth"),
    # ---- contention --------------------------------------------------------------------
    ParamSpec("mem_traffic_scale", "scale of the device-memory bytes a collective touches per byte it sends (V)",
              lambda c: 1.0, 0.0, 20.0, "contention"),
    ParamSpec("mem_efficiency", "fraction of peak memory bandwidth kernels reach",
              lambda c: 0.85, 0.1, 1.0, "contention"),
    ParamSpec("l2_footprint_per_channel_chunk", "L2 bytes a channel keeps in flight per chunk byte",
              lambda c: 2.0, 0.0, 64.0, "contention"),
    ParamSpec("l2_miss_gain", "extra DRAM traffic of compute when the collective fills the L2 (x bytes)",
              lambda c: 1.0, 0.0, 100.0, "contention"),
    ParamSpec("coll_mem_sensitivity", "how strongly compute's memory traffic slows a collective",
              lambda c: 1.0, 0.0, 20.0, "contention"),
)

PARAM_NAMES = tuple(p.name for p in PARAMS)
_BY_NAME = {p.name: p for p in PARAMS}
_META_KEYS = {"version", "fitted_from", "fit_report"}


def default_params(cluster: ClusterSpec) -> dict[str, float]:
    """Parameters derived from the cluster's hardware numbers (no calibration)."""
    return {p.name: float(p.default(cluster)) for p in PARAMS}


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


def model_section(values: dict[str, float], fitted_from: str, fit_report: dict | None = None) -> dict:
    """The ``model:`` mapping to store in a cluster file."""
    out: dict = {"version": MODEL_FORMAT_VERSION, "fitted_from": fitted_from}
    out.update({name: float(f"{values[name]:.6g}") for name in PARAM_NAMES})
    if fit_report:
        out["fit_report"] = fit_report
    return out


def param_spec(name: str) -> ParamSpec:
    return _BY_NAME[name]
