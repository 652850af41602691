"""Warnings for a workload that does not fit the cluster it is simulated or tuned on.

Each check returns sentences, never raises: the numbers can still be computed, but a
user reading them should know what they stand on. ``lagom simulate`` and ``lagom tune``
print them to stderr, once each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from costmodel.cluster import ClusterSpec
from nccl_env.plan import Plan, Signature
from traces.reader import kernel_short_name
from traces.workload import Workload


def fit_warnings(workload: Workload, cluster: ClusterSpec) -> list[str]:
    """What about ``workload`` the cluster ``cluster`` cannot model faithfully."""
    signatures = [workload.signature(c, cluster.gpus_per_node) for c in workload.collectives]
    warnings = list(workload.input_warnings)  # what the reader dropped (traces.kineto)
    lone = [s for s in signatures if s.ranks <= 1]
    if lone and workload.world_size_known and workload.world_size == 1:
        warnings.append(f"the job has one rank: its {len(signatures)} collectives move no data between ranks; "
                        f"the model gives them only launch latency")
    elif lone:
        warnings.append(
            f"{len(lone)} of {len(signatures)} collectives have a group of 1 rank (the workload carries no "
            f"world size or process-group members, e.g. a trace without distributedInfo): "
            f"the model gives them no data to move, only launch latency")
    cluster_gpus = cluster.nodes * cluster.gpus_per_node
    widest = max((s.ranks for s in signatures), default=0)
    if widest > cluster_gpus:
        nodes = max(s.nodes for s in signatures)
        warnings.append(
            f"the workload has a process group of {widest} ranks but {cluster.name} has {cluster_gpus} GPUs "
            f"({cluster.nodes} x {cluster.gpus_per_node}): its collectives are modelled on {nodes} nodes of this kind")
    return warnings


def untunable_warnings(workload: Workload) -> list[str]:
    """One line per kind of collective the tuner leaves to NCCL (``CollectiveOp.tunable`` False)."""
    warnings = []
    other = Counter(kernel_short_name(c.name) for c in workload.collectives if not c.nccl_tunable)
    if other:
        warnings.append(f"{sum(other.values())} communication kernels are not NCCL's ({_counted(other)}): "
                        f"NCCL's knobs do not reach them; left out of tuning")
    unsized = Counter(c.collective.value for c in workload.collectives if c.nccl_tunable and c.message_bytes is None)
    if unsized:
        warnings.append(f"{sum(unsized.values())} collectives have no recorded message size ({_counted(unsized)}): "
                        f"left out of tuning; NCCL decides for them")
    return warnings


def _counted(counts: Counter) -> str:
    shown = [f"{name} x{n}" for name, n in counts.most_common(3)]
    return ", ".join(shown) + (", ..." if len(counts) > 3 else "")


def unmatched_config_warning(path: str, entries: int, signatures: Iterable[Signature], plan: Plan) -> str | None:
    """A sentence when a tuned-config file sets nothing for this workload's collectives."""
    signatures = list(signatures)
    if not signatures or plan.entries:
        return None
    if entries == 0:
        return (f"{path} has no collective entries: it keeps NCCL's defaults for all {len(signatures)} "
                "collective signatures")
    return (f"{path}: none of its {entries} collective entries matches any of this workload's "
            f"{len(signatures)} collective signatures (collective, group, bytes, ranks, nodes): "
            f"NCCL's defaults apply to all of them")
