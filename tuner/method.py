"""The one small interface every search method implements (Lagom and the baselines).

A method is a class with a ``name`` and :meth:`SearchMethod.search`, which gets an
:class:`~tuner.objective.Objective` (the workload, evaluator, space, budget and progress
callback of one :meth:`SearchMethod.tune` call); options go to its constructor, with
sensible defaults. There is no registry: :data:`METHODS` in
``tuner/__init__`` lists the classes the CLI offers. The same conformance suite
(``tests/test_tuner_methods.py``) runs against every method.
"""

from __future__ import annotations

from collections.abc import Callable

from costmodel.evaluator import Evaluator
from traces.workload import Workload
from tuner.objective import Objective
from tuner.result import TuningResult
from tuner.space import SearchSpace


class SearchMethod:
    name: str = ""
    default_budget: int | None = None  # evaluations when tune() is given none (None: the method stops itself)

    def tune(
        self,
        workload: Workload,
        evaluator: Evaluator,
        space: SearchSpace,
        budget: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> TuningResult:
        """Search ``space`` for the plan with the shortest iteration on ``evaluator``.

        ``budget`` caps the evaluator calls (None = the method's ``default_budget``, or
        its own stopping rule); ``progress(evaluations_so_far)`` is called after each
        evaluator call. The returned plan only sets what the space allows (scopes respected).
        """
        budget = self.default_budget if budget is None else budget
        return self.search(Objective(workload, evaluator, space, budget, progress))

    def search(self, objective: Objective) -> TuningResult:
        """The method itself, over ``objective`` (its ``space``, ``budget`` and cache)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither search() nor tune()")
