"""Baseline: NCCL decides everything (the empty plan). One evaluation."""

from __future__ import annotations

from nccl_env.plan import Plan
from tuner.method import SearchMethod
from tuner.objective import Objective
from tuner.result import TuningResult


class NcclDefault(SearchMethod):
    name = "nccl"

    def search(self, obj: Objective) -> TuningResult:
        timing = obj.evaluate_plan(Plan())
        return TuningResult(self.name, Plan(), timing, obj.evaluations, baseline=timing)
