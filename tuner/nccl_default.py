"""Baseline: NCCL decides everything (the empty plan). One evaluation."""

from __future__ import annotations

from collections.abc import Callable

from costmodel.evaluator import Evaluator
from nccl_env.plan import Plan
from traces.workload import Workload
from tuner.method import SearchMethod
from tuner.objective import Objective
from tuner.result import TuningResult
from tuner.space import SearchSpace


class NcclDefault(SearchMethod):
    name = "nccl"

    def tune(
        self,
        workload: Workload,
        evaluator: Evaluator,
        space: SearchSpace,
        budget: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> TuningResult:
        obj = Objective(workload, evaluator, space, budget, progress)
        timing = obj.evaluate_plan(Plan())
        return TuningResult(self.name, Plan(), timing, obj.evaluations, baseline=timing)
