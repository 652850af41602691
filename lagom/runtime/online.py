"""``lagom run --online`` inside each rank: step boundaries, the plugin's table, the audit.

The launcher writes the run's settings (:class:`OnlineSettingsFile`) and points
``LAGOM_ONLINE`` at them; the bootstrap installs the hook and then :func:`install`,
which registers a global optimizer step hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``): every ``optimizer.step()``
of the job is a step boundary, with no change to the script. A job without a torch
optimizer calls :func:`lagom.runtime.step` once per step instead (the first explicit
call turns the optimizer hook off, so a step is never counted twice). A job with two
optimizers sees two boundaries per step, on every rank alike.

At each boundary the rank's :class:`lagom.online.agent.RankAgent` publishes its
measurement, rank 0 decides, every rank applies the decision: the new table goes to
the tuner plugin in one ``lagom_tuner_set_table`` call (the plugin swaps it whole: a
call sees the old or the new table). Nothing happens while a CUDA graph is being
captured (the capture would bake in the plan). The store traffic goes through the
default group's store (a TCPStore under torchrun), never through a collective, so
the hook does not count it and the user's collectives are untouched.

A rank that cannot follow (a decision or a peer's measurement does not arrive within
the timeout, or anything fails inside the session) writes its audit part, prints one
line and ends its process with status 3: ranks must never run different plans.
At the end of tuning rank 0 writes the tuned file the launcher saves (``--save``): the
searched plan when the controller kept it, else the seed file's own plan unchanged (env,
process groups, collectives as the seed had them; NCCL's defaults when there was no
seed), and beside it the outcome (:data:`OUTCOME_SUFFIX`: kept or reverted, why, the
gain) from which the launcher writes its final line.

Each rank reports, with every step's timing, its calls of each tuned signature during
the step (:class:`HookCalls`: the hook's counts; the simulated workload's own under
``--simulate``), so that the controller keeps a result only when the job ran it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lagom.online import DEFAULT_BUDGET_STEPS, DEFAULT_TIMEOUT_S
from lagom.runtime.env import ENV_ONLINE
from lagom.runtime.step_hook import StepHook

if TYPE_CHECKING:  # the session imports these at its first step: installing runs while torch imports
    from costmodel.cluster import ClusterSpec
    from lagom.online.agent import RankAgent
    from lagom.online.controller import OnlineController
    from lagom.runtime.audit import SignatureCount
    from nccl_env.plan import Plan
    from nccl_env.plugin_abi import TunerLibrary
    from nccl_env.rules import NcclVersion
    from tuner import SearchSpace

FAILED_STATUS = 3
STORE_PREFIX = "lagom/online/"
OUTCOME_SUFFIX = ".outcome.json"  # beside the result file: {"result", "reason", "gain", "calls", ...}


def outcome_path(result_path: str | os.PathLike) -> Path:
    """Where rank 0 writes online tuning's outcome, beside the tuned file ``result_path``."""
    return Path(result_path).with_suffix(OUTCOME_SUFFIX)


class HookCalls:
    """A rank's calls of each signature (``signatures``' order) since the previous reading, from
    the hook's per-signature counts (every collective the job issued, at the wrappers and c10d's
    ops): all zero when no hook counts in this process."""

    def __init__(self, signatures: tuple, hook) -> None:
        self.signatures = signatures
        self.hook = hook
        self._seen: dict[tuple, int] = {}
        self._index: dict[tuple, int] = {}  # a call's signature -> index in ``signatures`` (-1: none)

    def __call__(self) -> list[int]:
        from lagom.online.work_timing import signature_of_call

        out = [0] * len(self.signatures)
        if self.hook is None:
            return out
        for count in self.hook.signature_counts():
            key = count.key()
            index = self._index.get(key)
            if index is None:
                sig = signature_of_call(self.signatures, key)
                index = self._index[key] = self.signatures.index(sig) if sig is not None else -1
            new, self._seen[key] = count.count - self._seen.get(key, 0), count.count
            if index >= 0:
                out[index] += new
        return out


@dataclass(frozen=True)
class OnlineSettingsFile:
    """What the launcher tells every rank (written as JSON into the run folder)."""

    nccl_version: NcclVersion
    plugin: str
    result_path: str  # rank 0 writes the tuned file here
    seed_config: str | None = None
    simulate: str | None = None  # workload spec
    cluster: str | None = None
    noise: float = 0.0
    budget_steps: int = DEFAULT_BUDGET_STEPS
    timeout_s: float = DEFAULT_TIMEOUT_S
    collective_timing: bool = False  # --collective-timing: also read the Work handles' durations

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({**asdict(self), "nccl_version": str(self.nccl_version)}, indent=1))
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> OnlineSettingsFile:
        from nccl_env.rules import NcclVersion

        data = json.loads(Path(path).read_text())
        return cls(**{**data, "nccl_version": NcclVersion.parse(data["nccl_version"])})  # the launcher wrote it


class Session:
    """One rank's online tuning (see the module doc)."""

    def __init__(self, settings: OnlineSettingsFile, emit) -> None:
        self.settings = settings
        self.emit = emit
        self.agent: RankAgent | None = None
        self.explicit = False
        self.finished = False
        self.table_counts: list[dict] = []  # per epoch (recorded when it ends): its table's per-entry call counts
        self._library: TunerLibrary | None = None
        self._controller: OnlineController | None = None
        self._space: SearchSpace | None = None
        self._cluster: ClusterSpec | None = None
        self._cluster_arg = ""
        self._workload_label = ""
        self._epoch_entries = 0

    # ------------------------------------------------------------------ set-up
    def _start(self) -> RankAgent:
        import torch.distributed as dist

        from costmodel.cluster import load_cluster
        from lagom.files.tuned_config import load_tuned_config
        from lagom.online.agent import RankAgent
        from lagom.online.clock import CudaClock, HostClock, SimulatedClock, StepClock
        from lagom.online.controller import OnlineController, OnlineSettings
        from lagom.online.plugin_view import PluginView
        from lagom.online.protocol import MemoryStore, Store
        from lagom.orchestration import tuning
        from nccl_env.errors import LagomError
        from nccl_env.plugin_abi import TunerLibrary

        s = self.settings
        version = s.nccl_version
        seed_config = load_tuned_config(s.seed_config) if s.seed_config else None
        cluster_arg = s.cluster or (seed_config.cluster if seed_config else "")
        if not cluster_arg:
            raise LagomError("online tuning needs a cluster (--cluster, or the seed file's cluster)")
        cluster = tuning.with_nccl_version(load_cluster(cluster_arg), s.nccl_version)
        spec = s.simulate or (seed_config.workload if seed_config else "")
        workload = tuning.load_workload_arg(spec)
        self._cluster, self._cluster_arg, self._workload_label = cluster, cluster_arg, spec
        space = tuning.space_for(workload, cluster)
        self._space = space
        if dist.is_available() and dist.is_initialized():
            import torch.distributed.distributed_c10d as c10d

            rank, world = dist.get_rank(), dist.get_world_size()
            store: Store = dist.PrefixStore(STORE_PREFIX, c10d._get_default_store())
        else:
            rank, world, store = 0, 1, MemoryStore()
        self._library = TunerLibrary(s.plugin)
        clock: StepClock
        step_calls: Callable[[], list[int]]
        if s.simulate:
            view = PluginView(self._library, version)
            calls = {sig: len(ids) for sig, ids in space.collective_ids.items()}
            clock = SimulatedClock(workload, cluster, rank, s.noise, seed=0,
                                   in_force=lambda plan: view.plan_in_force(plan, calls))
            simulated = [calls.get(sig, 0) for sig in space.signatures]  # the simulator runs every op of the workload
            step_calls = simulated.copy
        else:
            import torch

            from lagom.online.work_timing import WorkDurations
            from lagom.runtime import current

            step_calls = HookCalls(space.signatures, current())
            durations = None
            if s.collective_timing:  # opt-in: the Work handles' durations, with TORCH_NCCL_ENABLE_TIMING's cost
                durations = WorkDurations(self.emit if rank == 0 else _silent)  # the fallback note: once, by rank 0
                hook = current()
                if hook is not None:
                    hook.work_sink = durations.record
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                clock = CudaClock(space.collective_ids, durations)
            else:
                clock = HostClock()  # a job without CUDA (gloo on CPUs): no Work duration to read either
        if rank == 0:
            seed = seed_config.to_plan(space.signatures) if seed_config else None
            self._controller = OnlineController(workload, space, seed, OnlineSettings(budget_steps=s.budget_steps))
        return RankAgent(rank, world, store, clock, space.signatures, self._apply, self._controller, s.timeout_s,
                         calls=step_calls)

    def _apply(self, plan: Plan) -> None:
        from nccl_env.delivery import deliver
        from nccl_env.plugin_table import format_table

        assert self._library is not None
        self._record_counts()
        entries = deliver(plan, self.settings.nccl_version).plugin_entries
        self._epoch_entries = self._library.set_table(format_table(entries))

    def _record_counts(self) -> None:
        if self._library is None or self.agent is None or not self.agent.epochs:
            return
        calls = self._library.entry_calls()  # what the plugin itself counted, per line of this epoch's table
        self.table_counts.append(
            {
                "epoch": self.agent.epoch,
                "entries": self._epoch_entries,
                "generation": calls.generation,
                "coll_info": calls.coll_info,
                "chunk_size": calls.chunk_size,
            }
        )

    # ------------------------------------------------------------------ boundaries
    def boundary(self) -> None:
        if self.finished:
            return
        try:
            if _capturing():
                return  # a CUDA graph being captured would bake the plan in: switch only outside
            if self.agent is None:
                if _before_init():
                    return  # a step before the job's process group exists: no store to agree through yet
                self.agent = self._start()
            self.agent.boundary()
            if not self.agent.active:
                self._finish()
        except Exception as exc:  # noqa: BLE001 - any failure here must end this rank: ranks may not disagree
            self.fail(exc)

    def _finish(self) -> None:
        self.finished = True
        self._record_counts()
        agent = self.agent
        if agent is None:
            return
        if agent.rank == 0:
            controller = self._controller
            why = f": {controller.reason}" if controller is not None and controller.reason else ""
            self.emit(f"lagom: online tuning done after {agent.step} steps: {agent.result}{why} "
                      f"({len(agent.epochs)} epochs)")
            if controller is not None and controller.done:
                self._write_result(controller)

    def _write_result(self, controller: OnlineController) -> None:
        """The tuned file (the kept plan, or the seed's own plan after a revert) and its outcome beside it."""
        import dataclasses

        from lagom.files.tuned_config import TunedConfig, load_tuned_config
        from lagom.orchestration import tuning
        from tuner.result import TuneOutcome, TuningResult

        space = self._space
        assert space is not None
        seed_timing = controller.seed_timing
        result = controller.search_result
        kept = result is not None and controller.result == "kept"
        timing = result.timing if result is not None and kept else seed_timing
        if seed_timing is None or timing is None:
            return
        note = (f"online: {controller.result} after {controller.steps_spent} steps, "
                f"{controller.evaluations} measured plans"
                + (f" ({controller.reason}: this is the seed's plan unchanged)" if controller.reason else "")
                + "; baseline_us is the seed's")
        assert self._cluster is not None
        config: TunedConfig
        if kept:
            outcome = TuneOutcome(space, TuningResult("lagom-online", controller.final, timing, controller.evaluations,
                                                      notes=[note]), seed_timing, None)
            # the controller decided against the measured seed: no second gain rule may empty the plan
            config = tuning.tuned_config(outcome, self._cluster, self._cluster_arg, self._workload_label,
                                         min_gain=0.0)
        else:
            seed_us = round(seed_timing.iteration_us, 3)
            seed = (load_tuned_config(self.settings.seed_config) if self.settings.seed_config
                    else TunedConfig(cluster=self._cluster_arg, nccl_version=self.settings.nccl_version,
                                     workload=self._workload_label))
            config = dataclasses.replace(seed, method="lagom-online", notes=[*seed.notes, note], predictions={
                "evaluator_iteration_us": seed_us, "baseline_us": seed_us, "tuned_us": seed_us})
        config.dump(self.settings.result_path)
        changed = controller.changed_signatures(controller.final) if kept else []
        measured = controller.calls_measured
        decided = json.dumps({
            "result": controller.result,
            "reason": controller.reason,
            "seeded": self.settings.seed_config is not None,
            "gain": round(controller.gain, 6),
            "noise_bound": round(controller.noise_bound, 6),
            "changed": len(changed),
            "changed_calls": None if measured is None else sum(measured[i] for i in changed),
            "tuned_calls": None if measured is None else sum(measured),
        })
        try:
            outcome_path(self.settings.result_path).write_text(decided)
        except OSError as exc:  # the plan is written: the launcher's line then says less, the rank goes on
            self.emit(f"lagom: warning: online tuning's outcome not written ({exc.strerror or exc})")

    def fail(self, exc: BaseException) -> None:
        self.finished = True
        rank = self.agent.rank if self.agent is not None else os.environ.get("RANK", "?")
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.emit(
            f"lagom: error (rank {rank}): online tuning failed: {first}; ending this rank (status {FAILED_STATUS})"
        )
        from lagom.runtime import current

        hook = current()
        if hook is not None:
            hook.finish()
        sys.stderr.flush()
        os._exit(FAILED_STATUS)

    def summary(self, counts: list[SignatureCount]) -> dict | None:
        """This rank's ``online`` part of the audit; ``counts``: the hook's, matched here against the
        plan in force (every plan of the online space sets the same signatures, the seed's too)."""
        if self.agent is None:
            return None
        from lagom.online.work_timing import op_ids_of_call
        from lagom.runtime.audit import Summary

        ids = self._space.collective_ids if self._space is not None else {}
        out = self.agent.summary()
        out["tables"] = self.table_counts
        out["summary"] = Summary.of(counts, lambda c: bool(op_ids_of_call(ids, c.key()))).to_dict()
        return out


def _silent(line: str) -> None:
    pass


def _before_init() -> bool:
    """A multi-process job whose default process group is not created yet."""
    import torch.distributed as dist

    several = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1")
    return several and not (dist.is_available() and dist.is_initialized())


def _capturing() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


# The job's session (step_hook.listener) and the optimizer hook that drives it; step_hook.step() is
# lagom.runtime.step()'s boundary by hand, step_hook.uninstall() forgets both (tests; a job keeps them).
step_hook: StepHook[Session] = StepHook()


def install(emit) -> Session | None:
    """Register the optimizer step hook when ``LAGOM_ONLINE`` names the run's settings."""
    path = os.environ.get(ENV_ONLINE)
    if not path:
        return None
    return step_hook.install(Session(OnlineSettingsFile.read(path), emit))


def collective_timing_requested() -> bool:
    """Under ``lagom run --online --collective-timing``: the hook hands the Work handles over."""
    path = os.environ.get(ENV_ONLINE)
    if not path:
        return False
    try:
        return OnlineSettingsFile.read(path).collective_timing
    except (OSError, ValueError, TypeError):
        return False  # the session reports an unreadable settings file itself
