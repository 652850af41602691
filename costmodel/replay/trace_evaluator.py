"""The evaluator of a trace: its execution graph replayed, durations from a mechanism.

``ReplayEvaluator(mechanism, gpus_per_node).evaluate(workload, plan, scale=None) -> Timing``
for a workload read from a trace (it carries an :class:`~traces.exec_graph.ExecGraph`;
docs/replay.md). It is the one place a trace is evaluated; the mechanisms
(:class:`~costmodel.sim.simulator.Simulator`, :class:`~costmodel.analytic.evaluator.AnalyticEvaluator`)
time generated workloads and refuse traces, and only answer the replay's two questions
(:class:`~costmodel.replay.mechanism.ReplayMechanism`). Per evaluation:

1. the trace's :class:`~costmodel.replay.data.ReplayData` (built once per workload; the
   evaluator keeps the last :data:`HELD_TRACES`, or takes one the caller built);
2. every op's duration under the plan, anchored at its measured time
   (:func:`costmodel.replay.anchor.durations_under`), the mechanism's answers kept in a bounded
   memo (:class:`~costmodel.replay.anchor.ReplayMemo`, one per evaluator: its mechanism's);
3. the graph scheduled with them (:func:`costmodel.replay.schedule.replay`).

A :class:`~costmodel.evaluator.DurationScale` asks a what-if on the measured times first.
"""

from __future__ import annotations

from costmodel.evaluator import DurationScale, Timing, check_plan
from costmodel.replay.anchor import ReplayMemo, check_scale, durations_under, scaled_anchor
from costmodel.replay.data import ReplayData
from costmodel.replay.mechanism import ReplayMechanism
from costmodel.replay.schedule import replay
from nccl_env.errors import LagomError
from nccl_env.plan import Plan
from traces.workload import Workload

HELD_TRACES = 4  # a command replays one trace; a test or bench a few, alternating


class ReplayEvaluator:
    """An Evaluator (and a what-if ``TraceEvaluator``, costmodel.evaluator) for trace workloads."""

    def __init__(self, mechanism: ReplayMechanism, gpus_per_node: int | None) -> None:
        self.mechanism = mechanism
        self.gpus_per_node = gpus_per_node
        self.evaluations = 0
        self.memo = ReplayMemo()
        self._held: list[ReplayData] = []  # most recent last

    def data(self, workload: Workload) -> ReplayData:
        """The workload's replay data: held, else built (LagomError: not a trace, or a bad workload)."""
        for d in self._held:
            if d.serves(workload):
                return d
        if workload.exec_graph is None:
            raise LagomError(f"{workload.source or 'workload'}: not read from a trace (no execution graph to "
                             f"replay); a generated workload is timed by an evaluator itself (sim, analytic)")
        return self.hold(ReplayData(workload))

    def hold(self, data: ReplayData) -> ReplayData:
        """Keep ``data`` (built by the caller) for its workload's replays."""
        self._held = [d for d in self._held if d.workload is not data.workload][-(HELD_TRACES - 1):] + [data]
        return data

    def evaluate(self, workload: Workload, plan: Plan, scale: DurationScale | None = None) -> Timing:
        check_plan(plan, getattr(self.mechanism, "cluster", None))  # the algorithms its mechanism runs there
        check_scale(workload, scale)
        data = self.data(workload)
        anchor = data.anchor(self.gpus_per_node)
        if scale is not None and not scale.is_identity:
            anchor = scaled_anchor(anchor, data.static, scale)
        durations, uncontended = durations_under(self.mechanism, anchor, plan, self.memo)
        timing = replay(data.static, durations, uncontended, scale.cpu if scale is not None else 1.0)
        timing.replay = data
        self.evaluations += 1
        return timing
