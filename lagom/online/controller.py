"""The online decider: Lagom's own search, told its timings by the running job's steps.

:class:`OnlineController` is a state machine driven one step at a time: ``plan()`` is
the plan to run at the next step, ``tell_step(per_rank)`` gives it what every rank
measured during the step that just ended. It runs on the deciding rank only; the
protocol (:mod:`lagom.online.protocol`) carries its plans to every rank. It never
reads a clock itself, so the same controller runs inside a torchrun job and in
process over simulated ranks (the bench).

One evaluation of a plan: the first ``discard_steps`` steps after the switch are
dropped (NCCL connects a new algorithm or channel set on first use), then up to
``samples`` steps are kept; a candidate whose first kept step is ``abandon_ratio``
times slower than the best plan so far is abandoned after that one step. The
evaluation's Timing: each rank's lower median over its kept steps, then MAX/MIN over
ranks (:mod:`lagom.online.measure`).

Phases: the seed (the offline plan, else NCCL's defaults on the nearest rungs),
measured once, also gives the noise bound (relative spread of its per-step times);
the search (:class:`tuner.LagomSearch` over :func:`tuner.space.online_space`, the
tolerance max(noise bound, min_gain); seeded from a tuned file it starts at the file's
plan and only polishes it, repeating a kept move at once while it keeps helping (a
seed from another cluster can be several rungs off); seeded with NCCL's defaults it
runs Lagom's whole search from the lowest rungs, where a far slower probe costs one
step); the final A/B: seed and result again, ``ab_rounds`` times each, interleaved;
the result is kept only if the median of its evaluations beats the seed's by more
than the noise bound (the larger of the seed's per-step spread, the spread of the
seed's own evaluations and ``min_gain``). ``budget_steps`` caps all of it: when too
few steps are left for another evaluation and the A/B, the search is stopped where
it stands.

What the job ran: when the ranks report their calls of each signature per step
(``tell_step(per_rank, calls)``: the hook's counts, summed over ranks), only the
measured (kept) steps count. A seed whose measured steps ran none of the space's
signatures ends tuning at once, and a result whose changed signatures ran no call in
the measured steps is not kept: a step time that moved without them moved by chance.
``reason`` says, in words, why the seed was kept.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from costmodel.evaluator import Timing
from lagom.online import DEFAULT_BUDGET_STEPS
from lagom.online.measure import across_ranks, lower_median, robust_timing
from nccl_env.errors import LagomError
from nccl_env.knob_table import CHOICE_KNOBS
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature
from traces.workload import Workload
from tuner import AutoCCL, LagomSearch, SearchSpace, TuningResult
from tuner.objective import Objective
from tuner.space import online_space


@dataclass(frozen=True)
class OnlineSettings:
    budget_steps: int = DEFAULT_BUDGET_STEPS
    discard_steps: int = 1  # NCCL_RUNTIME_CONNECT (default from 2.22.3): first use pays connection setup
    samples: int = 3  # kept steps per evaluation (lower median of 3 survives one outlier)
    abandon_ratio: float = 1.3
    min_gain: float = 0.005  # a change must win by 0.5% at least
    ab_rounds: int = 2  # extra seed/result evaluations in the final A/B
    method: str = "lagom"  # or "autoccl", for the comparison

    def __post_init__(self) -> None:
        if self.budget_steps < 0 or self.samples < 1 or self.discard_steps < 0 or self.ab_rounds < 0:
            raise LagomError("online settings: budget_steps, discard_steps, ab_rounds >= 0 and samples >= 1")
        if self.method not in ("lagom", "autoccl"):
            raise LagomError(f"online method {self.method!r}: choose lagom or autoccl")

    @property
    def steps_per_evaluation(self) -> int:
        return self.discard_steps + self.samples


class Phase(enum.Enum):
    SEED = "seed"
    SEARCH = "search"
    AB = "ab"
    DONE = "done"


@dataclass
class _Trial:
    """One evaluation in progress."""

    plan: Plan
    discard_left: int
    kept: list[list[Timing]]  # per kept step, per rank


class OnlineController:
    """Decides, step by step, which plan the job runs (see the module doc)."""

    def __init__(self, workload: Workload, space: SearchSpace, seed: Plan | None, settings: OnlineSettings) -> None:
        self.settings = settings
        self.workload = workload
        self.seeded_from_file = seed is not None
        if seed is None:  # NCCL's defaults, on the nearest rungs of the ladders
            self.space = online_space(space, lambda s: space.defaults[s])
            self.start = self.space.point_near(lambda s: space.defaults[s])
            seed = self.space.plan(self.start)
        else:
            # NCCL's defaults fill the resources the file leaves open (the rungs need a value);
            # the algorithm and protocol stay the file's, NCCL's choice where it has none
            given = seed

            def wanted(sig: Signature) -> CommConfig:
                return given.config_for(sig).merged_over(_resources(space.defaults[sig]))

            self.space = online_space(space, wanted)
            self.start = self.space.point_near(wanted, with_pairs=True)
        self.seed = seed
        self._seed_timing: Timing | None = None
        self.phase = Phase.SEED
        self.steps_spent = 0
        self.evaluations = 0
        self.noise_bound = 0.0
        self.best_us = float("inf")
        self.final: Plan = seed
        self.result: str = "reverted"  # "kept" once the A/B keeps the searched plan
        self.reason = ""  # why the seed was kept (a revert), in words; "" while running or when kept
        self.gain = 0.0  # the result's A/B gain over the seed (a fraction), once the A/B ended
        # calls of each signature (space order) in the measured steps, summed over ranks; None: never reported
        self.calls_measured: list[int] | None = None
        self.search_result: TuningResult | None = None
        self._objective: Objective | None = None
        self._search: Generator[Plan, Timing, TuningResult] | None = None
        self._ab_queue: list[tuple[str, Plan]] = []
        self._ab: dict[str, list[float]] = {"seed": [], "result": []}
        self._ab_label = "seed"
        self._trial = self._new_trial(seed)
        if settings.budget_steps < settings.steps_per_evaluation:
            self._finish(seed, "reverted", "the budget is shorter than one evaluation")

    # ------------------------------------------------------------------ driving
    @property
    def done(self) -> bool:
        return self.phase is Phase.DONE

    def plan(self) -> Plan:
        """The plan to run at the next step."""
        return self.final if self.done else self._trial.plan

    def tell_step(self, per_rank: list[Timing], calls: Sequence[int] | None = None) -> None:
        """What every rank measured during the step that just ended (under :meth:`plan`); ``calls``: the
        job's calls of each signature (the space's order) during that step, summed over ranks, when counted."""
        if self.done:
            return
        self.steps_spent += 1
        trial = self._trial
        if trial.discard_left > 0:
            trial.discard_left -= 1
            return
        trial.kept.append(list(per_rank))
        if calls is not None:
            measured = self.calls_measured or [0] * len(self.space.signatures)
            self.calls_measured = [a + int(b) for a, b in zip(measured, calls, strict=True)]
        first = len(trial.kept) == 1
        slow = first and across_ranks(per_rank).iteration_us > self.settings.abandon_ratio * self.best_us
        if slow or len(trial.kept) >= self.settings.samples:
            ranks = len(per_rank)
            timing = across_ranks([robust_timing([step[r] for step in trial.kept]) for r in range(ranks)])
            self.evaluations += 1
            self.best_us = min(self.best_us, timing.iteration_us)
            self._measured(timing)

    # ------------------------------------------------------------------ phases
    def _new_trial(self, plan: Plan) -> _Trial:
        return _Trial(plan, self.settings.discard_steps, [])

    def _steps_left(self) -> int:
        return self.settings.budget_steps - self.steps_spent

    def _ab_steps(self) -> int:
        return 2 * self.settings.ab_rounds * self.settings.steps_per_evaluation

    def _measured(self, timing: Timing) -> None:
        if self.phase is Phase.SEED:
            steps = [across_ranks(step).iteration_us for step in self._trial.kept]
            spread = (max(steps) - min(steps)) / lower_median(steps) if len(steps) > 1 else 0.0
            self.noise_bound = spread
            self._ab["seed"].append(timing.iteration_us)
            self._seed_timing = timing
            if self.calls_measured is not None and not any(self.calls_measured):
                self._finish(self.seed, "reverted", "the job ran none of the tuned signatures")
                return
            self._start_search()
            return
        if self.phase is Phase.SEARCH:
            assert self._search is not None and self._objective is not None
            if self._steps_left() < self.settings.steps_per_evaluation + self._ab_steps():
                self._objective.budget = self._objective.evaluations + 1  # this answer is the last
            try:
                plan = self._search.send(timing)
            except StopIteration as stop:
                self._start_ab(stop.value)
                return
            self._trial = self._new_trial(plan)
            return
        # A/B
        self._ab[self._ab_label].append(timing.iteration_us)
        self._next_ab()

    def _start_search(self) -> None:
        s = self.settings
        nothing_to_tune = not self.space.resource_units and not self.space.subspace_units
        if nothing_to_tune or self._steps_left() < s.steps_per_evaluation + self._ab_steps():
            self._finish(self.seed, "reverted", "nothing to tune" if nothing_to_tune
                         else "the budget left no room for a search")
            return
        tolerance = max(self.noise_bound, s.min_gain)
        obj = Objective(self.workload, None, self.space)
        if s.method == "autoccl":
            search = AutoCCL().ask_tell(obj)
        else:
            method = LagomSearch(tolerance=tolerance, guard=False, climb=not self.seeded_from_file,
                                 repeat_kept_moves=self.seeded_from_file)
            search = method.ask_tell(obj, start=self.start if self.seeded_from_file else None)
        self._objective, self._search = obj, search
        self.phase = Phase.SEARCH
        try:
            plan = next(search)
            if (
                _same(plan, self.seed, self.space) and self._seed_timing is not None
            ):  # the start is the seed, just measured
                plan = search.send(self._seed_timing)
        except StopIteration as stop:
            self._start_ab(stop.value)
            return
        self._trial = self._new_trial(plan)

    def _start_ab(self, result: TuningResult) -> None:
        self.search_result = result
        if _same(result.plan, self.seed, self.space):
            self._finish(self.seed, "reverted", "no plan beat the seed")
            return
        self._ab["result"].append(result.timing.iteration_us)
        self.phase = Phase.AB
        rounds = min(self.settings.ab_rounds, self._steps_left() // (2 * self.settings.steps_per_evaluation))
        self._ab_queue = [item for _ in range(rounds) for item in (("seed", self.seed), ("result", result.plan))]
        self._next_ab()

    def _next_ab(self) -> None:
        assert self.search_result is not None
        if self._ab_queue:
            self._ab_label, plan = self._ab_queue.pop(0)
            self._trial = self._new_trial(plan)
            return
        seed_us = lower_median(self._ab["seed"])
        result_us = lower_median(self._ab["result"])
        self.gain = 1.0 - result_us / seed_us if seed_us > 0 else 0.0
        seeds = self._ab["seed"]
        self.noise_bound = max(self.noise_bound, (max(seeds) - min(seeds)) / seed_us if seed_us > 0 else 0.0)
        bound = max(self.noise_bound, self.settings.min_gain)
        changed = self.changed_signatures(self.search_result.plan)
        ran = None if self.calls_measured is None else sum(self.calls_measured[i] for i in changed)
        if ran == 0:
            self._finish(self.seed, "reverted", "the job ran none of the tuned signatures")
        elif self.gain <= bound:
            self._finish(self.seed, "reverted", f"its gain {self.gain:.1%} is within the noise bound {bound:.1%}")
        else:
            self._finish(self.search_result.plan, "kept")

    def changed_signatures(self, plan: Plan) -> list[int]:
        """The indices (space order) of the signatures whose settings ``plan`` changes from the seed's."""
        return [i for i, sig in enumerate(self.space.signatures) if plan.config_for(sig) != self.seed.config_for(sig)]

    def _finish(self, plan: Plan, result: str, reason: str = "") -> None:
        self.final = plan
        self.result = result
        self.reason = reason
        self.phase = Phase.DONE
        if self._search is not None:
            self._search.close()

    @property
    def seed_timing(self) -> Timing | None:
        """The seed's first evaluation (None before it is measured)."""
        return self._seed_timing


def _resources(config: CommConfig) -> CommConfig:
    for knob in CHOICE_KNOBS:  # algorithm and protocol back to NCCL's choice
        config = knob.set(config, None)
    return config


def _same(a: Plan, b: Plan, space: SearchSpace) -> bool:
    return all(a.config_for(s) == b.config_for(s) for s in space.signatures)
