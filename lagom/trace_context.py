"""The cluster and NCCL version a trace's own metadata decides, for ``lagom tune`` and ``lagom simulate``.

A trace records what its job ran on: the GPU (``deviceProperties``), the NCCL version
(``distributedInfo.nccl_version``), the world size and process groups
(``distributedInfo``, ``pg_config``; read by :mod:`traces.kineto`). So for a trace
``--cluster`` is optional; :func:`resolve_cluster` decides:

- the cluster: ``--cluster`` when given; else the preset whose GPU is the trace's,
  compared by model (:func:`gpu_model`: ``NVIDIA A100-PG509-200`` and the preset's
  ``A100-SXM4-80GB`` are both an A100), with as many nodes as the trace's world
  needs. No GPU recorded, no preset for it, or several (the two A40 presets, low-bw
  and high-bw, differ in links the trace does not record): a LagomError asking for
  ``--cluster``;
- the NCCL version: ``--nccl-version`` when given, else the trace's, else the cluster's;
- one warning line naming both sides where a given ``--cluster`` models another GPU
  than the trace's, or a given ``--nccl-version`` is not the one the trace ran.

A generator spec or a workload file records none of this: ``--cluster`` is required.

:func:`refuse_to_tune` says when a trace's job is not NCCL's to tune: an AMD GPU runs
RCCL, whose knobs and tuner plugin are not the ones Lagom sets; a job of one rank
moves no data between ranks; a trace without one GPU collective kernel of known size
(only CPU-side calls, e.g. a trace without its GPU kernels) has nothing NCCL's knobs
reach, and a replay of it would predict from calls, not kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from lagom.tuning import with_nccl_version
from nccl_env.errors import LagomError
from nccl_env.rules import NcclVersion
from traces.workload import Workload

# A GPU model in a device name: one or two letters and two or three digits, optionally a
# letter (A100, H100, A40, V100, B200, GH200, L40S, MI250X), not inside a longer token.
_MODEL_RE = re.compile(r"(?<![A-Z0-9])([A-Z]{1,2}\d{2,3}[A-Z]?)(?![A-Z0-9])")
# AMD device names as HIP reports them ("AMD Radeon Graphics" on an MI250, "AMD Instinct MI300X").
_AMD_RE = re.compile(r"\b(AMD|RADEON|INSTINCT)\b")


@dataclass
class ClusterChoice:
    """The cluster to model and what the user should know about the choice."""

    cluster: ClusterSpec  # with the NCCL version decided (ClusterSpec.nccl_version)
    cluster_arg: str  # the preset name or the --cluster text: what a tuned file records
    warnings: list[str] = field(default_factory=list)  # disagreements, one line each
    notes: list[str] = field(default_factory=list)  # what was taken from the trace


def gpu_model(device_name: str | None) -> str | None:
    """The GPU model a device name spells (``NVIDIA A100-PG509-200`` -> ``A100``), or None."""
    if not device_name:
        return None
    m = _MODEL_RE.search(device_name.upper())
    return m.group(1) if m else None


def is_amd(device_name: str | None) -> bool:
    return device_name is not None and _AMD_RE.search(device_name.upper()) is not None


def presets_for_gpu(device_name: str | None) -> list[str]:
    """The presets whose GPU is the same model as ``device_name``."""
    model = gpu_model(device_name)
    if model is None:
        return []
    return [name for name in preset_names() if gpu_model(load_cluster(name).gpu.name) == model]


def resolve_cluster(workload: Workload, from_trace: bool, cluster_arg: str | None,
                    nccl_version_arg: str | None = None) -> ClusterChoice:
    """The cluster (and NCCL version) to model ``workload`` on; see the module doc."""
    if not from_trace:
        if cluster_arg is None:
            raise LagomError("--cluster is required for a generator spec or a workload file "
                             "(only a profiler trace records the GPU and NCCL it ran on)")
        return ClusterChoice(with_nccl_version(load_cluster(cluster_arg), nccl_version_arg), cluster_arg)
    device = workload.device_name
    choice = ClusterChoice(load_cluster(cluster_arg), cluster_arg) if cluster_arg else _preset_for(workload)
    if cluster_arg is not None:
        model, modelled = gpu_model(device), gpu_model(choice.cluster.gpu.name)
        if device and model != modelled:
            choice.warnings.append(f"the trace ran on {device} but --cluster {cluster_arg} models "
                                   f"{choice.cluster.gpu.name}: predictions are for that GPU, not the trace's")
    traced = _trace_version(workload, choice.warnings)
    if nccl_version_arg is not None:
        version = NcclVersion.parse(nccl_version_arg)
        if traced is not None and version != traced:
            choice.warnings.append(f"the trace ran NCCL {traced} but --nccl-version is {version}: "
                                   f"tuning for {version}, whose knobs and defaults may differ")
    elif traced is not None:
        version = traced
        if str(traced) != choice.cluster.nccl_version:
            choice.notes.append(f"NCCL {traced} from the trace's distributedInfo "
                                f"({choice.cluster_arg} says {choice.cluster.nccl_version})")
    else:
        version = NcclVersion.parse(choice.cluster.nccl_version)
    choice.cluster = with_nccl_version(choice.cluster, str(version))
    return choice


def refuse_to_tune(workload: Workload) -> str | None:
    """Why a trace's job is not NCCL's to tune (one line), or None."""
    source = workload.source or "the trace"
    if is_amd(workload.device_name):
        return (f"{source}: the job ran on {workload.device_name}, an AMD GPU, whose collectives are RCCL's: "
                f"Lagom's knobs and tuner plugin are NCCL's, so there is nothing to tune "
                f"(lagom analyze and lagom simulate --cluster read it)")
    if workload.world_size_known and workload.world_size == 1:
        return f"{source}: one rank: nothing to tune (the job's collectives move no data between ranks)"
    if not any(c.on_gpu and c.tunable for c in workload.collectives):
        cpu = sum(not c.on_gpu for c in workload.collectives)
        seen = (f"its {cpu} collectives are CPU-side calls without their GPU kernels" if cpu
                else f"its {len(workload.collectives)} communication kernels have no size or are not NCCL's"
                if workload.collectives else "it has no collectives")
        return f"{source}: no GPU collective kernel with a size: nothing to tune ({seen})"
    return None


def _preset_for(workload: Workload) -> ClusterChoice:
    """The preset for the trace's GPU, with as many nodes as its world needs."""
    device = workload.device_name
    source = workload.source or "the trace"
    presets = presets_for_gpu(device)
    if not presets:
        what = (f"its GPU, {device}, has no Lagom cluster preset" if device
                else "it records no GPU (no deviceProperties)")
        modelled = ", ".join(f"{n} ({load_cluster(n).gpu.name})" for n in preset_names())
        raise LagomError(f"{source}: {what}; give --cluster NAME|FILE (presets: {modelled})")
    if len(presets) > 1:
        raise LagomError(f"{source}: its GPU, {device}, is modelled by the presets {' and '.join(presets)}, "
                         f"which differ in links the trace does not record; give --cluster {presets[0]} or another")
    cluster = load_cluster(presets[0])
    nodes = max(1, -(-workload.world_size // cluster.gpus_per_node))
    note = f"cluster {presets[0]}: the preset for the trace's GPU ({device})"
    if nodes != cluster.nodes:
        world = workload.world_size
        note += f"; {nodes} node{'s' if nodes != 1 else ''} for the job's {world} rank{'s' if world != 1 else ''}"
        cluster = replace(cluster, nodes=nodes)
    return ClusterChoice(cluster, presets[0], notes=[note])


def _trace_version(workload: Workload, warnings: list[str]) -> NcclVersion | None:
    if workload.nccl_version is None:
        return None
    try:
        return NcclVersion.parse(workload.nccl_version)
    except LagomError:
        warnings.append(f"the trace's distributedInfo.nccl_version {workload.nccl_version!r} is not an NCCL "
                        f"version: using the cluster's")
        return None

