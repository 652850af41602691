"""What a replay asks of a mechanism: the only two questions, as a Protocol.

A replay never takes a time from its mechanism, only ratios (:mod:`costmodel.replay.anchor`):
a collective's time under new settings over its time under the recorded ones, and a compute
kernel's slowdown beside a collective under either. Both of Lagom's evaluators answer them
(:class:`costmodel.sim.simulator.Simulator`, the fluid simulation;
:class:`costmodel.analytic.evaluator.AnalyticEvaluator`, the closed-form model); anything else
that does can be replayed with (:class:`costmodel.replay.trace_evaluator.ReplayEvaluator`).
"""

from __future__ import annotations

from typing import Protocol

from nccl_env.knobs import CommConfig
from nccl_env.plan import Signature
from traces.workload import ComputeOp


class ReplayMechanism(Protocol):
    def collective_time_us(self, signature: Signature, config: CommConfig) -> float:
        """One collective of ``signature`` alone under ``config`` (its unset fields: NCCL's choice)."""
        ...

    def slowdown_beside(self, op: ComputeOp, signature: Signature, config: CommConfig) -> float:
        """``op``'s time beside that collective under ``config`` over its time alone (>= 1 expected)."""
        ...
