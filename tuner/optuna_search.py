"""Baseline: Optuna's TPE sampler over the whole space, given an evaluation budget.

Each (resource unit, axis) is an integer rung parameter; each subspace unit is a
categorical over its pairs and "nccl" (NCCL decides); each path unit a categorical over its
paths and "sm" (NCCL's kernels). The objective is the iteration
time Z. The first trial is the point nearest NCCL's default, so TPE starts where a
user would. Default budget: 100 evaluations (the bench gives it Lagom's count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nccl_env.errors import LagomError
from tuner.method import SearchMethod
from tuner.objective import BudgetExhausted, Objective
from tuner.result import TuningResult
from tuner.space import Point

if TYPE_CHECKING:
    import optuna


class OptunaTPE(SearchMethod):
    name = "optuna"
    default_budget: int = 100

    def __init__(self, seed: int = 0, default_budget: int = 100) -> None:
        self.seed = seed
        self.default_budget = default_budget

    def search(self, obj: Objective) -> TuningResult:
        space = obj.space
        budget = self.default_budget if obj.budget is None else obj.budget
        import optuna  # a second to import: only when this method runs

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=self.seed))
        keys = [(u.index, a) for u in space.resource_units for a in u.axes]
        sub = [(u.index, space.unit_pairs(u)) for u in space.subspace_units]
        routes = [(u.index, space.path_options[u.index]) for u in space.path_units]
        start = space.point_near(lambda s: space.defaults[s])
        study.enqueue_trial({f"u{u}.{a}": start.level(u, a) for u, a in keys} | {f"s{u}": "nccl" for u, _ in sub}
                            | {f"p{u}": "sm" for u, _ in routes})

        def point_of(trial: optuna.Trial) -> Point:
            levels = tuple(
                sorted((u, a, trial.suggest_int(f"u{u}.{a}", 0, len(space.axes[a].values) - 1)) for u, a in keys)
            )
            pairs = []
            for u, options in sub:
                names = ["nccl", *(f"{x.nccl_name}/{y.nccl_name}" for x, y in options)]
                choice = trial.suggest_categorical(f"s{u}", names)
                pairs.append((u, None if choice == "nccl" else options[names.index(choice) - 1]))
            paths = []
            for u, paths_of in routes:
                choice = trial.suggest_categorical(f"p{u}", ["sm", *(p.value for p in paths_of)])
                paths.append((u, next((p for p in paths_of if p.value == choice), None)))
            return Point(levels, tuple(pairs), tuple(paths))

        best = None
        seen = 0
        while obj.evaluations < budget and seen < 20 * budget:
            trial = study.ask()
            seen += 1
            try:
                measured = obj.measure(point_of(trial))
            except BudgetExhausted:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                break
            study.tell(trial, measured.iteration_us)
            if best is None or measured.iteration_us < best.iteration_us:
                best = measured
        if best is None:
            raise LagomError("optuna search: the budget allowed no evaluation")
        return TuningResult(self.name, space.plan(best.point), best.timing, obj.evaluations, point=best.point)
