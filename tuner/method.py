"""The one small interface every search method implements (Lagom and the baselines).

A method is a class with a ``name`` and :meth:`SearchMethod.tune`; options go to its
constructor, with sensible defaults. There is no registry: :data:`METHODS` in
``tuner/__init__`` lists the classes the CLI offers. The same conformance suite
(``tests/test_tuner_methods.py``) runs against every method.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

from costmodel.evaluator import Evaluator
from traces.workload import Workload
from tuner.result import TuningResult
from tuner.space import SearchSpace


class SearchMethod(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def tune(
        self,
        workload: Workload,
        evaluator: Evaluator,
        space: SearchSpace,
        budget: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> TuningResult:
        """Search ``space`` for the plan with the shortest iteration on ``evaluator``.

        ``budget`` caps the evaluator calls (None = the method's own stopping rule);
        ``progress(evaluations_so_far)`` is called after each evaluator call. The
        returned plan only sets what the space allows (scopes respected).
        """
