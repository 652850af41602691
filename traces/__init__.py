"""The Workload data model, Kineto trace reading, overlap analysis and workload generators."""

from traces.overlap import OverlapWindow, overlap_windows
from traces.workload import (
    CollectiveOp,
    ComputeOp,
    Dependency,
    DependencyKind,
    ProcessGroup,
    Stream,
    StreamKind,
    Workload,
)

__all__ = [
    "CollectiveOp",
    "ComputeOp",
    "Dependency",
    "DependencyKind",
    "OverlapWindow",
    "ProcessGroup",
    "Stream",
    "StreamKind",
    "Workload",
    "overlap_windows",
]
