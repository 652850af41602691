"""What a search returns: the plan, its predicted timing, the cost, and how it got there."""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.evaluator import Timing
from nccl_env.plan import Plan
from tuner.space import Point, SearchSpace


@dataclass(frozen=True)
class Step:
    """One measured move of a search (kept for the tune table and the docs).

    ``unit`` is the unit's key (a signature label, ``group X``, a collective type or
    ``process``); ``change`` says what moved (``channels 4->8, chunk_bytes ...``).
    ``priority`` is Lagom's H after the step (None for other methods or when the
    step was rejected). ``outcome`` is ``accepted``, ``rejected`` or ``finished: why``.
    """

    unit: str
    change: str
    comm_us: float  # the unit's collective time after the move
    compute_us: float  # Y after the move
    iteration_us: float  # Z after the move
    priority: float | None
    outcome: str


@dataclass
class TuningResult:
    method: str
    plan: Plan
    timing: Timing  # predicted by the evaluator the search used
    evaluations: int  # evaluator calls this search spent (cache hits are free)
    point: Point | None = None
    baseline: Timing | None = None  # NCCL's default on the same evaluator, when evaluated
    steps: list[Step] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # units in the order they were finished
    notes: list[str] = field(default_factory=list)

    @property
    def iteration_us(self) -> float:
        return self.timing.iteration_us


@dataclass
class TuneOutcome:
    """What ``lagom tune`` found: the search space, the method's result, NCCL's default (the
    baseline) and AutoCCL's result when it was run."""

    space: SearchSpace
    result: TuningResult
    baseline: Timing
    autoccl: TuningResult | None
    evaluations_run: int = 0  # every evaluation tune ran: the method's, the baseline's, AutoCCL's not reused
