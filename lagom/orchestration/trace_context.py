"""The cluster and NCCL version a trace's own metadata decides, for ``lagom tune`` and ``lagom simulate``.

A trace records what its job ran on: the GPU (``deviceProperties``), the NCCL version
(``distributedInfo.nccl_version``), the world size and process groups
(``distributedInfo``, ``pg_config``; read by :mod:`traces.kineto`). So for a trace
``--cluster`` is optional; :func:`resolve_cluster` decides:

- the GPU: the row of Lagom's GPU table (:mod:`costmodel.gpu_specs`) that the trace's
  device name, SM count, memory size and compute capability match; a trace without
  ``deviceProperties`` is matched on the SM count its kernels were launched against
  (Kineto's ``blocks per SM``), when that leaves one GPU model;
- the cluster: ``--cluster`` when given; else the one preset whose GPU is the same model
  and form (SXM or PCIe) as the trace's, with as many nodes as the trace's world needs
  and, where the trace's GPU is another variant (``NVIDIA A100-PG509-200`` is the 40 GB
  A100, the a100-nvswitch preset's the 80 GB one) or has another SM count, the trace's
  GPU numbers; else (no preset for that GPU, or several: the A40 presets low-bw and
  high-bw differ in exactly the links a trace measures) a cluster derived from the trace
  (:mod:`costmodel.trace_cluster`), written to the cache folder so that a tuned file can
  name it. One note line says which, and from what;
- the NCCL version: ``--nccl-version`` when given, else the trace's, else the cluster's;
- one warning line naming both sides where a given ``--cluster`` models another GPU
  than the trace's, or a given ``--nccl-version`` (or a ``--config`` file's ``nccl_version``, for
  simulate) is not the one the trace ran; the warning names which.

A trace that records no GPU at all (no ``deviceProperties``, no GPU kernels: a CPU-only
trace), or a GPU that neither a preset nor the table knows, is a LagomError asking for
``--cluster``. A generator spec or a workload file records none of this: ``--cluster``
is required.

:func:`refuse_to_tune` says when a trace's job is not NCCL's to tune: an AMD GPU runs
RCCL, whose knobs and tuner plugin are not the ones Lagom sets; a job of one rank
moves no data between ranks; a trace without one GPU collective kernel of known size
(only CPU-side calls, e.g. a trace without its GPU kernels) has nothing NCCL's knobs
reach, and a replay of it would predict from calls, not kernels.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from costmodel.gpu_specs import AMD, DeviceFacts, GpuMatch, GpuRow, device_model, gpu_spec, is_amd_name, match_gpu
from costmodel.trace_cluster import derive_cluster, device_facts
from lagom.orchestration.tuning import with_nccl_version
from nccl_env.cache import cache_dir, write_cached
from nccl_env.errors import LagomError
from nccl_env.nccl_releases import reported_version
from nccl_env.rules import NcclVersion
from traces.workload import Workload


@dataclass
class ClusterChoice:
    """The cluster to model and what the user should know about the choice."""

    cluster: ClusterSpec  # with the NCCL version decided (ClusterSpec.nccl_version)
    cluster_arg: str  # the preset name, the --cluster text or the derived cluster's file: what a tuned file records
    warnings: list[str] = field(default_factory=list)  # disagreements, one line each
    notes: list[str] = field(default_factory=list)  # what was taken from the trace
    derived: bool = False  # derived from the trace (costmodel.trace_cluster), not a preset or a file

    def notes_for(self, workload: Workload, from_trace: bool) -> list[str]:
        """The notes a command says first (``tune``, ``simulate``): the choice's own, then, for a
        trace, where NCCL's pick on this cluster disagrees with the kernels the trace ran."""
        if not from_trace:
            return list(self.notes)
        from costmodel.nccl_defaults import disagreement_line, recorded_pick_disagreements

        picked = disagreement_line(self.cluster, recorded_pick_disagreements(self.cluster, workload))
        return [*self.notes, *([picked] if picked else [])]


def gpu_model(device_name: str | None) -> str | None:
    """The GPU model a device name spells (``NVIDIA A100-PG509-200`` -> ``A100``), or None."""
    return device_model(device_name)


def is_amd(device_name: str | None) -> bool:
    return is_amd_name(device_name)


def presets_for_gpu(device_name: str | None) -> list[str]:
    """The presets whose GPU is the same model as ``device_name``."""
    model = gpu_model(device_name)
    if model is None:
        return []
    return [name for name in preset_names() if gpu_model(load_cluster(name).gpu.name) == model]


def resolve_cluster(workload: Workload, from_trace: bool, cluster_arg: str | None,
                    nccl_version_arg: NcclVersion | None = None, version_from: str = "--nccl-version",
                    purpose: str = "tuning for") -> ClusterChoice:
    """The cluster (and NCCL version) to model ``workload`` on; see the module doc.
    ``version_from`` names where ``nccl_version_arg`` came from (the flag, or a ``--config``
    file's ``nccl_version``) and ``purpose`` what the command does with it, for the warning."""
    if not from_trace:
        if cluster_arg is None:
            raise LagomError("--cluster is required for a generator spec or a workload file "
                             "(only a profiler trace records the GPU and NCCL it ran on)")
        return ClusterChoice(with_nccl_version(load_cluster(cluster_arg), nccl_version_arg), cluster_arg)
    device = workload.device_name
    choice = ClusterChoice(load_cluster(cluster_arg), cluster_arg) if cluster_arg else _cluster_for_trace(workload)
    if cluster_arg is not None:
        model, modelled = gpu_model(device), gpu_model(choice.cluster.gpu.name)
        if device and model != modelled:
            choice.warnings.append(f"the trace ran on {device} but --cluster {cluster_arg} models "
                                   f"{choice.cluster.gpu.name}: predictions are for that GPU, not the trace's")
    traced = _trace_version(workload, choice.warnings)
    if nccl_version_arg is not None:
        version = nccl_version_arg
        if traced is not None and version != traced:
            choice.warnings.append(f"the trace ran NCCL {traced} but {version_from} is {version}: "
                                   f"{purpose} {version}, whose knobs and defaults may differ")
    elif traced is not None:
        version = traced
        if choice.derived:
            choice.notes.append(f"NCCL {traced} from the trace's distributedInfo")
        elif traced != choice.cluster.nccl_version:
            choice.notes.append(f"NCCL {traced} from the trace's distributedInfo "
                                f"({choice.cluster_arg} says {choice.cluster.nccl_version})")
    else:
        version = choice.cluster.nccl_version
    choice.cluster = with_nccl_version(choice.cluster, version)
    if choice.derived:
        path = _write_derived(choice.cluster)
        choice.cluster.source = choice.cluster_arg = str(path)
        choice.notes[0] += f"; written to {path} (--cluster takes it)"
    return choice


def refuse_to_tune(workload: Workload, cluster_given: bool = False) -> str | None:
    """Why a trace's job is not NCCL's to tune (one line), or None. A trace whose collectives
    all ran on the CPU (a gloo job) is tuned only for a cluster the user names (``cluster_given``):
    the figures are then the model's for those collectives on it, not a prediction for the job."""
    source = workload.source or "the trace"
    match = match_gpu(device_facts(workload))
    if is_amd(workload.device_name) or (match is not None and match.row.vendor == AMD):
        device = workload.device_name or f"an {match.row.model if match else 'AMD GPU'}"
        return (f"{source}: the job ran on {device}, an AMD GPU, whose collectives are RCCL's: "
                f"Lagom's knobs and tuner plugin are NCCL's, so there is nothing to tune "
                f"(lagom analyze and lagom simulate read it)")
    if workload.world_size_known and workload.world_size == 1:
        return f"{source}: one rank: nothing to tune (the job's collectives move no data between ranks)"
    if not any(c.on_gpu and c.tunable for c in workload.collectives):
        cpu = sum(not c.on_gpu for c in workload.collectives)
        if cpu and cluster_given and any(c.tunable for c in workload.collectives):
            return None
        seen = (f"its {cpu} collectives are CPU-side calls without their GPU kernels, as a gloo job's are; give "
                f"--cluster NAME|FILE to tune them for that cluster's NCCL (the model's figures, not this job's)"
                if cpu else f"its {len(workload.collectives)} communication kernels have no size or are not NCCL's"
                if workload.collectives else "it has no collectives")
        return f"{source}: no GPU collective kernel with a size: nothing to tune ({seen})"
    return None


@lru_cache(maxsize=1)
def _preset_rows() -> tuple[tuple[str, GpuRow], ...]:
    """Each preset with the table row of its GPU."""
    out = []
    for name in preset_names():
        gpu = load_cluster(name).gpu
        match = match_gpu(DeviceFacts(gpu.name, gpu.sm_count))
        if match is not None:
            out.append((name, match.row))
    return tuple(out)


def _cluster_for_trace(workload: Workload) -> ClusterChoice:
    """The preset for the trace's GPU, else a cluster derived from the trace (module doc)."""
    source = workload.source or "the trace"
    facts = device_facts(workload)
    modelled = ", ".join(f"{n} ({load_cluster(n).gpu.name})" for n in preset_names())
    if facts.name is None and facts.sm_count is None:
        raise LagomError(f"{source}: it records no GPU (no deviceProperties, no GPU kernel launch shapes); "
                         f"give --cluster NAME|FILE (presets: {modelled})")
    match = match_gpu(facts)
    if match is None:
        what = (f"its GPU, {facts.name}," if facts.name
                else f"its GPU (no deviceProperties; kernels launched against {facts.sm_count} SMs)")
        raise LagomError(f"{source}: {what} is in neither Lagom's cluster presets nor its GPU table "
                         f"(costmodel/gpu_specs.py); give --cluster NAME|FILE (presets: {modelled})")
    device = facts.name or (f"an {match.row.model} by its kernels' launch shapes, {facts.sm_count} SMs: "
                            f"the trace records no deviceProperties")
    fitting = [name for name, row in _preset_rows() if (row.model, row.form) == (match.row.model, match.row.form)]
    if len(fitting) == 1:
        return _preset_choice(workload, fitting[0], match, facts, device)
    derived = derive_cluster(workload, match)
    if fitting:
        why = (f"the presets {' and '.join(fitting)} both model {device} and differ in links the trace measures; "
               f"--cluster picks one")
    else:
        why = f"no preset models {device}"
        other_form = [f"{name}'s is {row.key}" for name, row in _preset_rows() if row.model == match.row.model]
        if other_form:
            why += f" ({match.row.key}; {', '.join(other_form)})"
    return ClusterChoice(derived.cluster, derived.cluster.name, notes=[f"cluster derived from the trace ({why}): "
                                                                       f"{derived.note}"], derived=True)


def _preset_choice(workload: Workload, preset: str, match: GpuMatch, facts: DeviceFacts,
                   device: str) -> ClusterChoice:
    """The preset, with as many nodes as the trace's world needs and the trace's own GPU numbers."""
    cluster = load_cluster(preset)
    note = f"cluster {preset}: the preset for the trace's GPU ({device})"
    nodes = max(1, -(-workload.world_size // cluster.gpus_per_node))
    if nodes != cluster.nodes:
        world = workload.world_size
        note += f"; {nodes} node{'s' if nodes != 1 else ''} for the job's {world} rank{'s' if world != 1 else ''}"
        cluster = replace(cluster, nodes=nodes)
    preset_row = dict(_preset_rows())[preset]
    if preset_row not in match.fits:
        gpu = gpu_spec(match.row, facts.sm_count)
        old = cluster.gpu
        changed = [f"{what} {a:g} -> {b:g}" for what, a, b in (
            ("SMs", old.sm_count, gpu.sm_count), ("memory GB/s", old.mem_bw_gb_per_s, gpu.mem_bw_gb_per_s),
            ("L2 MiB", old.l2_bytes / (1 << 20), gpu.l2_bytes / (1 << 20)),
            ("BF16 TFLOP/s", old.peak_tflops, gpu.peak_tflops)) if a != b]
        note += (f"; its GPU is the table's {match.row.key} (matched by {match.basis}), not the preset's "
                 f"{old.name}: {', '.join(changed) or 'the same numbers'}")
        cluster = replace(cluster, gpu=gpu)
    elif facts.sm_count is not None and facts.sm_count != cluster.gpu.sm_count:
        note += f"; {facts.sm_count} SMs: the trace's (the preset says {cluster.gpu.sm_count})"
        cluster = replace(cluster, gpu=replace(cluster.gpu, sm_count=facts.sm_count))
    return ClusterChoice(cluster, preset, notes=[note])


def _write_derived(cluster: ClusterSpec) -> Path:
    """The derived cluster as a cluster file in the cache folder, named by its content."""
    text = cluster.to_yaml()
    path = cache_dir() / f"cluster-{cluster.name}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.yaml"
    if not path.exists():
        write_cached(path, text)
    return path


def _trace_version(workload: Workload, warnings: list[str]) -> NcclVersion | None:
    if workload.nccl_version is None:
        return None
    try:  # the same door as --nccl-version's for a release newer than Lagom knows (nccl_releases.in_force)
        return reported_version(workload.nccl_version, "the trace's distributedInfo.nccl_version")
    except LagomError:
        warnings.append(f"the trace's distributedInfo.nccl_version {workload.nccl_version!r} is not an NCCL "
                        f"version: using the cluster's")
        return None

