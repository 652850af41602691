"""Where a rank's step measurements come from: one small interface, three sources.

A :class:`StepClock` is told when a new plan takes effect (``switched``) and asked, at
each step boundary, for the Timing of the step that just ended (``step_ended``):
``iteration_us`` is the step time and ``ops[op_id]`` the collectives' times (and, from
the simulator, every op's). A later source (NCCL's profiler plugin) joins by
implementing the same two methods.

- :class:`SimulatedClock`: the simulator (``costmodel.sim``) runs the workload under
  the plan in force; noise per rank and epoch is independent (seeded from both).
- :class:`CudaClock`, the default on a GPU: CUDA events recorded on the current (compute)
  stream at each step boundary give the step time; the boundary waits for the step's
  end event (during tuning only). Nothing is recorded on NCCL's streams, and
  ``TORCH_NCCL_ENABLE_TIMING`` is left as the user set it. Only with
  ``lagom run --online --collective-timing`` does it also read the durations of the Work
  handles the job's async collectives returned, which the hook hands over
  (:mod:`lagom.online.work_timing`), as per-signature collective times; a collective
  issued synchronously has no Work to time, and the search judges it by step time.
  Not exercised here (no GPU in CI).
- :class:`HostClock`: without CUDA (a gloo job on CPUs), the host's monotonic clock
  at the boundaries.

What each source costs the job: docs/online.md, "Clocks".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import Evaluator, Timing
from costmodel.replay.trace_evaluator import ReplayEvaluator
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
        # a trace is replayed over the simulator's ratios (no noise: its measured times carry their own)
        self.evaluator: Evaluator = (ReplayEvaluator(self.simulator, cluster.gpus_per_node)
                                     if workload.exec_graph is not None else self.simulator)
        self.plan = Plan()
        self.switched(Plan(), -1)

    def switched(self, plan: Plan, epoch: int) -> None:
        self.plan = plan
        self.simulator.reseed((self.seed, self.rank, epoch + 1))

    def step_ended(self) -> Timing:
        plan = self.in_force(self.plan) if self.in_force is not None else self.plan
        return self.evaluator.evaluate(self.workload, plan)


class CudaClock:
    """Step time from CUDA events; collective times from the hook's Work handles only when
    ``durations`` is given (``--collective-timing``; see the module doc).

    ``durations`` is fed by the hook (:class:`lagom.online.work_timing.WorkDurations`);
    ``collective_ids`` maps the workload's signatures to their op ids.
    """

    def __init__(self, collective_ids: Mapping[Signature, tuple[int, ...]],
                 durations: WorkDurations | None = None) -> None:
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
        self._events = self._events[-1:]
        if self.durations is None:
            return step_timing(step_us)
        ops = op_timings(self.durations.collect(), self.collective_ids, self._op_ids)
        comm_us = sum(o.duration_us for o in ops.values())
        return Timing(step_us, step_us, comm_us, 0.0, step_us, ops)


class HostClock:
    """Step time from the host's monotonic clock at the boundaries (a job without CUDA)."""

    def __init__(self) -> None:
        self._last_ns = time.perf_counter_ns()

    def switched(self, plan: Plan, epoch: int) -> None:
        pass

    def step_ended(self) -> Timing:
        now_ns = time.perf_counter_ns()
        step_us, self._last_ns = (now_ns - self._last_ns) / 1e3, now_ns
        return step_timing(step_us)


def step_timing(step_us: float) -> Timing:
    """A step known only by its time: no op times (the search judges every signature by step time)."""
    return Timing(step_us, step_us, 0.0, 0.0, step_us, {})
