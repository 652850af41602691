"""The analytic model: Lagom's unified contention model, what the tuner believes (docs/costmodel.md).

A collective as a chunk pipeline over its channels (:mod:`.collective_model`), compute
under contention for SMs, DRAM bandwidth and L2 (the paper's Eq. 4-6,
:mod:`.contention_model`), their fitted parameters (:mod:`.params`), and the Evaluator
that schedules a workload with them (:mod:`.evaluator`, with the jump timeline of
:mod:`.jump`).
"""

from costmodel.analytic.evaluator import AnalyticEvaluator

__all__ = ["AnalyticEvaluator"]
