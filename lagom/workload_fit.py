"""Warnings for a workload that does not fit the cluster it is simulated or tuned on.

Each check returns sentences, never raises: the numbers can still be computed, but a
user reading them should know what they stand on. ``lagom simulate`` and ``lagom tune``
print them to stderr, once each.
"""

from __future__ import annotations

from collections.abc import Iterable

from costmodel.cluster import ClusterSpec
from nccl_env.plan import Plan, Signature
from traces.workload import Workload


def fit_warnings(workload: Workload, cluster: ClusterSpec) -> list[str]:
    """What about ``workload`` the cluster ``cluster`` cannot model faithfully."""
    signatures = [workload.signature(c, cluster.gpus_per_node) for c in workload.collectives]
    warnings = []
    lone = [s for s in signatures if s.ranks <= 1]
    if lone:
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


def unmatched_config_warning(path: str, entries: int, signatures: Iterable[Signature], plan: Plan) -> str | None:
    """A sentence when a tuned-config file sets nothing for this workload's collectives."""
    signatures = list(signatures)
    if not signatures or plan.entries:
        return None
    if entries == 0:
        return f"{path} has no collective entries: it keeps NCCL's defaults for all {len(signatures)} collective signatures"
    return (f"{path}: none of its {entries} collective entries matches any of this workload's "
            f"{len(signatures)} collective signatures (collective, group, bytes, ranks, nodes): "
            f"NCCL's defaults apply to all of them")
