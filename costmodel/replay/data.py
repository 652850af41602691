"""What every replay of one trace shares, built once: :class:`ReplayData`.

Its lifetime is its holder's: a :class:`~costmodel.replay.trace_evaluator.ReplayEvaluator`
builds one for each trace workload it replays and keeps the last few; a caller that replays
one trace many times (a search, a bisection) can build it once and hold it; a replay's
:class:`~costmodel.evaluator.Timing` points at it (``Timing.replay``) for the reports that
read its steps or move the trace's events. Nothing is kept anywhere else (no module state).

It holds the workload it was built from (so it is never confused with another, and a
workload grown in place is rebuilt: :meth:`ReplayData.serves`); do not mutate a workload
between replays otherwise.
"""

from __future__ import annotations

from costmodel.replay.anchor import Anchor, build_anchor
from costmodel.replay.schedule import ReplayStatic, replay_static
from traces.exec_graph import ExecGraph
from traces.gc_pause import no_cyclic_gc
from traces.workload import Workload


def _size(workload: Workload) -> int:
    return len(workload.compute_ops) + len(workload.collectives) + len(workload.dependencies)


class ReplayData:
    """One trace workload's graph as the replay schedules it (:attr:`static`, built here and
    the workload checked) and, per cluster node size, its measured times anchored for the
    mechanism's ratios (:meth:`anchor`, built on first use)."""

    def __init__(self, workload: Workload) -> None:
        self.static: ReplayStatic = replay_static(workload)  # LagomError: not a trace, or a bad workload
        assert workload.exec_graph is not None  # replay_static refused a workload without one
        self.workload = workload
        self.graph: ExecGraph = workload.exec_graph
        self._size = _size(workload)
        self._anchors: dict[int | None, Anchor] = {}

    def serves(self, workload: Workload) -> bool:
        """Built from this very workload object, not grown since."""
        return workload is self.workload and _size(workload) == self._size

    def anchor(self, gpus_per_node: int | None) -> Anchor:
        """The measured times in replay order, each collective's signature on a cluster of
        ``gpus_per_node``, the overlaps and slowdowns the trace measured (built once per size)."""
        anchor = self._anchors.get(gpus_per_node)
        if anchor is None:
            with no_cyclic_gc():
                anchor = self._anchors[gpus_per_node] = build_anchor(self.workload, self.static, gpus_per_node)
        return anchor
