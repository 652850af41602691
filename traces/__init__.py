"""The Workload data model, Kineto trace reading, overlap analysis and workload generators."""

from traces import workload
from traces.overlap import OverlapWindow, overlap_windows
from traces.workload import *  # noqa: F403 (the data model, as its __all__ names it)

__all__ = ["OverlapWindow", "overlap_windows"]
__all__ += workload.__all__
