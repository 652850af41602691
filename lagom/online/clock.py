"""Where a rank's step measurements come from: one small interface, two sources.

A :class:`StepClock` is told when a new plan takes effect (``switched``) and asked, at
each step boundary, for the Timing of the step that just ended (``step_ended``):
``iteration_us`` is the step time and ``ops[op_id]`` the collectives' times (and, from
the simulator, every op's). A later source (NCCL's profiler plugin) joins by
implementing the same two methods.

- :class:`SimulatedClock`: the simulator (``costmodel.sim``) runs the workload under
  the plan in force; noise per rank and epoch is independent (seeded from both).
- :class:`CudaClock`: on a GPU, CUDA events recorded at step boundaries give the step
  time (the boundary waits for the step's end event: a bubble per tuning step), and
  with ``TORCH_NCCL_ENABLE_TIMING=1`` the durations of the Work handles the job's
  async collectives returned, which the hook hands over
  (:mod:`lagom.online.work_timing`), give per-signature collective times. A
  collective the job issued synchronously has no Work to time: its signature has no
  op times, and the search judges it by step time. Not exercised here (no GPU in CI).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import Timing
from costmodel.sim.simulator import Simulator
from lagom.online.work_timing import WorkDurations, op_timings
from nccl_env.plan import Plan, Signature
from traces.workload import Workload


class StepClock(Protocol):
    def switched(self, plan: Plan, epoch: int) -> None:
        """``plan`` is in force from the next step on (epoch ``epoch``)."""

    def step_ended(self) -> Timing:
        """The step that just ended."""


class SimulatedClock:
    """Each step's Timing is the simulator's for the plan in force (see the module doc).

    ``in_force(plan)``, when given, turns the decided plan into the one NCCL would run
    (under ``lagom run --simulate``: the tuner plugin's answers, asked once per
    collective of the step, :class:`lagom.online.plugin_view.PluginView`).
    """

    def __init__(self, workload: Workload, cluster: ClusterSpec, rank: int, noise: float, seed: int = 0,
                 in_force: Callable[[Plan], Plan] | None = None) -> None:
        self.workload = workload
        self.rank = rank
        self.seed = seed
        self.in_force = in_force
        self.simulator = Simulator(cluster, noise=noise, seed=seed)
        self.plan = Plan()
        self.switched(Plan(), -1)

    def switched(self, plan: Plan, epoch: int) -> None:
        self.plan = plan
        self.simulator.reseed((self.seed, self.rank, epoch + 1))

    def step_ended(self) -> Timing:
        plan = self.in_force(self.plan) if self.in_force is not None else self.plan
        return self.simulator.evaluate(self.workload, plan)


class CudaClock:
    """Step time from CUDA events, collective times from the hook's Work handles (see the module doc).

    ``durations`` is fed by the hook (:class:`lagom.online.work_timing.WorkDurations`);
    ``collective_ids`` maps the workload's signatures to their op ids.
    """

    def __init__(self, collective_ids: Mapping[Signature, tuple[int, ...]], durations: WorkDurations) -> None:
        import torch

        self.torch = torch
        self.collective_ids = collective_ids
        self.durations = durations
        self._op_ids: dict[tuple, tuple[int, ...]] = {}  # call signature -> op ids, resolved once
        self._events: list = []
        self.mark()

    def mark(self) -> None:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        self._events.append(event)

    def switched(self, plan: Plan, epoch: int) -> None:
        pass  # NCCL reads the plan from the plugin's table: nothing to do here

    def step_ended(self) -> Timing:
        """The step that just ended: waits for the GPU to reach its end (during tuning only;
        reading one step late instead would give each plan its predecessor's time)."""
        self.mark()
        start, end = self._events[-2], self._events[-1]
        end.synchronize()
        step_us = start.elapsed_time(end) * 1000.0
        ops = op_timings(self.durations.collect(), self.collective_ids, self._op_ids)
        self._events = self._events[-1:]
        comm_us = sum(o.duration_us for o in ops.values())
        return Timing(step_us, step_us, comm_us, 0.0, step_us, ops)
