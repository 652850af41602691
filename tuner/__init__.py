"""Search for per-collective NCCL settings that minimise the iteration time.

Public surface: :func:`build_space` / :class:`SearchSpace` (what may be set),
:class:`SearchMethod` (the interface) and its implementations, :class:`TuningResult`.
The tuner sees only the Evaluator protocol; the ``lagom`` layer picks the evaluator.
"""

from tuner.autoccl import AutoCCL
from tuner.exhaustive import Exhaustive
from tuner.lagom_search import LagomSearch
from tuner.method import SearchMethod
from tuner.nccl_default import NcclDefault
from tuner.optuna_search import OptunaTPE
from tuner.result import Step, TuningResult
from tuner.space import Point, Scope, SearchSpace, Unit, build_space

METHODS: dict[str, type[SearchMethod]] = {
    "lagom": LagomSearch,
    "autoccl": AutoCCL,
    "exhaustive": Exhaustive,
    "optuna": OptunaTPE,
    "nccl": NcclDefault,
}

__all__ = [
    "AutoCCL", "Exhaustive", "LagomSearch", "METHODS", "NcclDefault", "OptunaTPE", "Point", "Scope",
    "SearchMethod", "SearchSpace", "Step", "TuningResult", "Unit", "build_space",
]
