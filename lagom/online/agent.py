"""One rank's side of online tuning, called at every step boundary.

:meth:`RankAgent.boundary` does, in order: publish what this rank measured during the
step that ended (:meth:`publish`); on the deciding rank, read every rank's sample,
tell the controller and write the decision (:meth:`decide`); read the decision back,
check it and apply it (:meth:`receive`). Under torchrun each rank calls ``boundary``
from its optimizer-step hook; in process (the bench, the property tests) a driver
calls the three phases for N simulated ranks in turn (:func:`run_in_process`).

A sample carries, beside the step's Timing, the rank's calls of each signature during
the step (``calls``: the hook's counts under torchrun, the workload's own under a
simulated clock; None where nobody counts them); the decider sums them over ranks
(integers: every rank would get the same sum) and tells the controller, which keeps a
result only when the job ran its changed signatures.

The audit's view of a rank: ``epochs`` lists (epoch, plan hash, first step) for every
plan this rank ran, in order, so equal lists on every rank mean the ranks agreed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from costmodel.cluster import ClusterSpec
from lagom.online import DEFAULT_TIMEOUT_S
from lagom.online.clock import SimulatedClock, StepClock
from lagom.online.controller import OnlineController
from lagom.online.measure import timing_from_wire, timing_to_wire
from lagom.online.protocol import (
    Decision,
    MemoryStore,
    Store,
    configs_of,
    decision_key,
    decode_decision,
    encode_decision,
    plan_hash,
    read,
    sample_key,
)
from nccl_env.plan import Plan, Signature


@dataclass
class EpochRecord:
    epoch: int
    plan_hash: str
    step: int  # the first step run under this plan

    def to_list(self) -> list:
        return [self.epoch, self.plan_hash, self.step]


@dataclass
class RankAgent:
    rank: int
    world: int
    store: Store
    clock: StepClock
    signatures: tuple[Signature, ...]
    apply: Callable[[Plan], None]  # install a plan (the plugin's table swap)
    controller: OnlineController | None = None  # on the deciding rank only
    timeout_s: float = DEFAULT_TIMEOUT_S
    calls: Callable[[], Sequence[int]] | None = None  # this rank's calls per signature during the step that ended
    step: int = 0  # step boundaries seen
    epoch: int = -1  # -1: before the first decision (the launcher's table is in force)
    active: bool = True
    result: str = ""
    epochs: list[EpochRecord] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    plan: Plan = field(default_factory=Plan)

    def boundary(self) -> None:
        """A step ended: publish, decide (deciding rank), receive."""
        if not self.active:
            return
        self.publish()
        self.decide()
        self.receive()

    def publish(self) -> None:
        self.step += 1
        sample = self.clock.step_ended()
        calls = [int(n) for n in self.calls()] if self.calls is not None else None
        self.store.set(f"{sample_key(self.step, self.rank)}", json.dumps([timing_to_wire(sample), calls]))

    def decide(self) -> None:
        controller = self.controller
        if controller is None:
            return
        keys = [sample_key(self.step, r) for r in range(self.world)]
        samples = [json.loads(read(self.store, k, self.timeout_s)) for k in keys]
        per_rank = [timing_from_wire(timing) for timing, _ in samples]
        counted = [calls for _, calls in samples if calls is not None]
        calls = [sum(column) for column in zip(*counted, strict=True)] if len(counted) == len(samples) else None
        for key in keys:
            self.store.delete_key(key)
        if self.step > 1:  # the first step ran before any decision: nothing to tell
            controller.tell_step(per_rank, calls)
        plan = controller.plan()
        configs = configs_of(plan, self.signatures)
        epoch = self.epoch if self.epoch >= 0 and plan_hash(configs) == self._hash() else self.epoch + 1
        self.store.set(decision_key(self.step), encode_decision(
            Decision(self.step, epoch, configs, controller.done, controller.result if controller.done else "")))

    def receive(self) -> None:
        raw = read(self.store, decision_key(self.step), self.timeout_s)
        decision = decode_decision(raw, self.step, self.epoch, len(self.signatures))
        if decision is None:
            self.active = False
            self.result = "stopped"
            self.warnings.append(f"online tuning: the decision for step {self.step} is stale or corrupt; "
                                 f"epoch {self.epoch} stays in force and tuning ends")
            return
        if decision.epoch != self.epoch:
            self.plan = decision.plan(self.signatures)
            self.apply(self.plan)
            self.clock.switched(self.plan, decision.epoch)
            self.epoch = decision.epoch
            self.epochs.append(EpochRecord(decision.epoch, plan_hash(decision.configs), self.step + 1))
        if decision.done:
            self.active = False
            self.result = decision.result

    def _hash(self) -> str:
        return self.epochs[-1].plan_hash if self.epochs else ""

    def summary(self) -> dict:
        """This rank's part of the audit's ``online`` section."""
        out: dict = {"epochs": [e.to_list() for e in self.epochs], "result": self.result, "warnings": self.warnings}
        if self.controller is not None:
            out["steps_spent"] = self.controller.steps_spent
            out["evaluations"] = self.controller.evaluations
            if self.controller.reason:
                out["reason"] = self.controller.reason
        return out


def run_in_process(agents: list[RankAgent], max_steps: int) -> int:
    """Drive simulated ranks (one store, ranks in turn) until tuning ends; steps run."""
    steps = 0
    while steps < max_steps and any(a.active for a in agents):
        live = [a for a in agents if a.active]
        for agent in live:
            agent.publish()
        for agent in live:
            agent.decide()
        for agent in live:
            agent.receive()
        steps += 1
    return steps


def simulated_ranks(controller: OnlineController, clocks: list[StepClock], store: Store | None = None,
                    apply: Callable[[int, Plan], None] | None = None) -> list[RankAgent]:
    """One agent per clock, rank 0 deciding, sharing ``store`` (a MemoryStore by default)."""
    shared = store if store is not None else MemoryStore()
    signatures = controller.space.signatures

    def applier(rank: int) -> Callable[[Plan], None]:
        return (lambda plan: apply(rank, plan)) if apply is not None else (lambda plan: None)

    return [RankAgent(rank, len(clocks), shared, clock, signatures, applier(rank), controller if rank == 0 else None)
            for rank, clock in enumerate(clocks)]


def simulate_online(controller: OnlineController, cluster: ClusterSpec, ranks: int, noise: float, seed: int = 0,
                    max_steps: int = 100_000) -> list[RankAgent]:
    """Online tuning of ``controller``'s workload on ``ranks`` simulated ranks in process (no torchrun):
    every rank's clock is the simulator on ``cluster`` with its own noise; returns the agents."""
    clocks: list[StepClock] = [SimulatedClock(controller.workload, cluster, r, noise, seed) for r in range(ranks)]
    agents = simulated_ranks(controller, clocks)
    run_in_process(agents, max_steps)
    return agents
