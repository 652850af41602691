"""What ``lagom tune`` and ``lagom bench`` share: pick an evaluator, run methods, write the file.

The tuner never chooses an evaluator; this layer does: ``analytic`` (the fitted cost
model, what Lagom is meant to tune with offline) or ``sim`` (the virtual cluster); for a
trace, the replay of it over that one's mechanism (costmodel.replay.trace_evaluator).
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from importlib import resources
from pathlib import Path

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from costmodel.evaluator import DurationScale, Evaluator, Timing, TraceEvaluator
from costmodel.nccl_defaults import algo_estimates, nccl_default_config
from costmodel.replay.anchor import recorded_configs
from costmodel.replay.trace_evaluator import ReplayEvaluator
from costmodel.sim.simulator import Simulator
from lagom.files.tuned_config import CollectiveEntry, Match, TunedConfig
from lagom.orchestration.workload_arg import load_workload_arg
from nccl_env.cache import cache_dir, write_cached
from nccl_env.delivery import deliver, group_paths
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import Mechanism, NcclVersion, path_requirements
from traces.workload import Workload
from tuner import METHODS, AutoCCL, build_space
from tuner.objective import FULL_TIMINGS_BYTES, timing_bytes
from tuner.result import TuneOutcome
from tuner.space import SearchSpace

EVALUATORS = ("analytic", "sim")
DEFAULT_EVALUATOR = "analytic"  # the fitted cost model: what Lagom tunes with offline
MIN_GAIN = 0.01  # below a 1% predicted gain, process-wide changes are not worth their risk
# Evaluations a --budget may ask for (tune, calibrate): Lagom's search needs tens to hundreds; every
# method keeps each evaluation it made, so a budget is also memory.
MAX_BUDGET = 100_000

__all__ = ["load_workload_arg"]  # re-exported: the commands and the bench read WORKLOAD arguments through here


def make_evaluator(name: str, cluster: ClusterSpec, noise: float = 0.0, seed: int = 0,
                   workload: Workload | None = None) -> TraceEvaluator:
    """``sim``: the simulator (noise-free unless asked); ``analytic``: the cost model. For
    ``workload`` read from a trace: its replay, with that one as the mechanism."""
    mechanism: Simulator | AnalyticEvaluator
    if name == "sim":
        mechanism = Simulator(cluster, noise=noise, seed=seed)
    elif name == "analytic":
        mechanism = AnalyticEvaluator(cluster)
    else:
        raise LagomError(f"unknown evaluator {name!r} (choose from {', '.join(EVALUATORS)})")
    if workload is not None and workload.exec_graph is not None:
        return ReplayEvaluator(mechanism, cluster.gpus_per_node)
    return mechanism


class ScaledEvaluator:
    """An evaluator whose every replay takes one what-if scale (``lagom tune --unprofiled-cpu``):
    the tuner sees a plain Evaluator."""

    def __init__(self, inner: TraceEvaluator, scale: DurationScale) -> None:
        self.inner, self.scale = inner, scale

    @property
    def evaluations(self) -> int:
        return self.inner.evaluations

    @evaluations.setter
    def evaluations(self, value: int) -> None:
        self.inner.evaluations = value

    def evaluate(self, workload: Workload, plan: Plan) -> Timing:
        return self.inner.evaluate(workload, plan, self.scale)


def with_nccl_version(cluster: ClusterSpec, version: NcclVersion | None) -> ClusterSpec:
    """The cluster running another NCCL (the tuner's doors and MAXCHANNELS follow it)."""
    if version is None:
        return cluster
    return replace(cluster, nccl_version=version)


def _enabled_pairs(cluster: ClusterSpec, signature: Signature):
    """The (algorithm, protocol) pairs NCCL's own tuning model enables for a collective."""
    return [e.pair for e in algo_estimates(cluster, signature)]


def space_for(workload: Workload, cluster: ClusterSpec, use_plugin: bool = True,
              other_ranks: Sequence[Workload] = ()) -> SearchSpace:
    """The search space; for a trace, NCCL's defaults are the settings the trace recorded
    (over the cluster model's choice for what the trace does not show). ``use_plugin=False``:
    the doors without Lagom's tuner plugin (``tuner.space.build_space``). ``other_ranks``:
    the job's other ranks (a folder replayed jointly): their signatures join the space, each
    one's recorded settings from the lowest rank that ran it."""
    defaults: Callable[[ClusterSpec, Signature], CommConfig] = nccl_default_config
    if workload.exec_graph is not None:
        recorded = recorded_configs(workload, cluster.gpus_per_node)
        for other in sorted(other_ranks, key=lambda w: w.rank):
            for sig, cfg in recorded_configs(other, cluster.gpus_per_node).items():
                recorded.setdefault(sig, cfg)

        def recorded_over_model(cl: ClusterSpec, sig: Signature) -> CommConfig:
            base = nccl_default_config(cl, sig)
            rec = recorded.get(sig)
            return base if rec is None else rec.merged_over(base)

        defaults = recorded_over_model
    return build_space(workload, cluster, defaults=defaults, enabled_pairs=_enabled_pairs, use_plugin=use_plugin,
                       other_ranks=other_ranks)


# ---- calibration cache ------------------------------------------------------------------


def calibrated_cluster(preset: str, budget: int = 300, log: Callable[[str], None] | None = None) -> ClusterSpec:
    """The preset with its analytic-model parameters fitted against ``sim:PRESET``.

    Cached (in :func:`nccl_env.cache.cache_dir`) by the preset's content, the budget
    and the cost model's and simulator's source, so a bench run calibrates each cluster
    once and later runs reuse the fit until one of those changes.
    """
    text = (resources.files("costmodel") / "presets" / f"{preset}.yaml").read_text()
    digest = hashlib.sha256(f"{text}\nbudget={budget}".encode())
    root = Path(str(resources.files("costmodel")))
    for source in sorted(root.rglob("*.py")):  # a changed model or simulator invalidates the fit
        digest.update(source.relative_to(root).as_posix().encode())
        digest.update(source.read_bytes())
    key = digest.hexdigest()[:16]
    path = cache_dir() / f"calibrated-{preset}-{key}.yaml"
    kept = _kept_calibration(path)
    if kept is not None:
        return kept
    # Two commands (or test workers) that need the same fit at once: the second waits for the
    # first's and reads it, instead of fitting it again (a lock the kernel drops if the first dies)
    with _held(path.with_name(f".{path.name}.lock")):
        kept = _kept_calibration(path)
        if kept is not None:
            return kept
        if log:
            log(f"calibrating the analytic model against sim:{preset} ({budget} measurements)")
        from costmodel.calibration.backend import backend_from_spec  # scipy: only when a calibration runs
        from costmodel.calibration.calibrate import calibrate

        cluster = calibrate(backend_from_spec(f"sim:{preset}"), budget=budget).cluster
        write_cached(path, cluster.to_yaml())
    return load_cluster(path)


def _kept_calibration(path: Path) -> ClusterSpec | None:
    """The fit kept at ``path``; a damaged one is removed (and made again)."""
    if not path.exists():
        return None
    try:
        return load_cluster(path)
    except LagomError:
        path.unlink(missing_ok=True)
        return None


@contextmanager
def _held(lock: Path) -> Iterator[None]:
    """An exclusive lock on ``lock`` while the block runs; where the file cannot be opened (a
    read-only cache), no lock: the block runs all the same."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def tuning_cluster(cluster: ClusterSpec, cluster_arg: str, evaluator: str,
                   log: Callable[[str], None] | None = None) -> ClusterSpec:
    """The cluster the evaluator should model: for ``analytic`` on a preset without fitted
    ``model:`` parameters, the preset calibrated against ``sim:PRESET`` (cached), with the
    cluster's NCCL, nodes and GPU (a trace's own GPU numbers: lagom.orchestration.trace_context)."""
    if evaluator != "analytic" or cluster.model or cluster_arg not in preset_names():
        return cluster
    return replace(calibrated_cluster(cluster_arg, log=log), nccl_version=cluster.nccl_version, nodes=cluster.nodes,
                   gpu=cluster.gpu)


class SharedEvaluations:
    """One evaluator for every method of a ``lagom tune``: a plan already evaluated for the
    workload is answered from a cache (AutoCCL's comparison reuses what Lagom's search
    measured), and ``runs`` counts the evaluations actually run."""

    def __init__(self, inner: Evaluator) -> None:
        self.inner = inner
        self.evaluations = 0  # asked for, by every method
        self.runs = 0  # run by the inner evaluator
        # the most recently used Timings, at most FULL_TIMINGS_BYTES of them (each holds per-op arrays)
        self._cache: OrderedDict[tuple, Timing] = OrderedDict()

    def evaluate(self, workload: Workload, plan: Plan) -> Timing:
        self.evaluations += 1
        key = (id(workload), tuple(sorted(plan.entries.items(), key=lambda kv: kv[0].label())), plan.default)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        hit = self._cache[key] = self.inner.evaluate(workload, plan)
        self.runs += 1
        while len(self._cache) > max(2, FULL_TIMINGS_BYTES // timing_bytes(workload)):
            self._cache.popitem(last=False)
        return hit


def tune(
    workload: Workload,
    cluster: ClusterSpec,
    evaluator: Evaluator,
    method: str = "lagom",
    budget: int | None = None,
    with_autoccl: bool = True,
    progress: Callable[[int], None] | None = None,
    seed: int = 0,
    other_ranks: Sequence[Workload] = (),
) -> TuneOutcome:
    """Run ``method`` (seeded with ``seed`` where it draws at random); also evaluate NCCL's default
    and (optionally) AutoCCL for comparison. ``other_ranks``: the job's other ranks, whose
    signatures join the search space (``evaluator`` judges the job: a joint replay)."""
    if method not in METHODS:
        raise LagomError(f"unknown method {method!r} (choose from {', '.join(METHODS)})")
    if budget is not None and budget < 1:
        raise LagomError(f"budget {budget}: must be at least 1 evaluation")
    space = space_for(workload, cluster, other_ranks=other_ranks)
    shared = SharedEvaluations(evaluator)
    method_cls = METHODS[method]
    seeded = "seed" in inspect.signature(method_cls).parameters  # the methods that draw at random
    search = method_cls(seed=seed) if seeded else method_cls()  # type: ignore[call-arg]  # seeded: it takes one
    result = search.tune(workload, shared, space, budget=budget, progress=progress)
    baseline = result.baseline or shared.evaluate(workload, Plan())
    autoccl = None
    if with_autoccl:
        autoccl = result if method == "autoccl" else AutoCCL().tune(workload, shared, space)
    return TuneOutcome(space, result, baseline, autoccl, shared.runs)


def tuned_config(outcome: TuneOutcome, cluster: ClusterSpec, cluster_arg: str, workload_label: str,
                 min_gain: float = MIN_GAIN) -> TunedConfig:
    """The tuned-config file for a result: delivery rules split the plan over the doors.
    Below ``min_gain`` (a fraction) of predicted gain over NCCL's default the file
    changes nothing and its notes say why."""
    space, result = outcome.space, outcome.result
    notes = list(result.notes)
    tuned_us = result.iteration_us
    gain = outcome.baseline.iteration_us / tuned_us - 1.0 if tuned_us > 0 else 0.0
    if result.plan.entries and gain < min_gain:
        notes.append(f"predicted gain {gain:.2%} is below --min-gain {min_gain:.2%}: "
                     f"the file keeps NCCL's defaults (no env, process-group or per-collective changes)")
        result = replace(result, plan=Plan(), timing=outcome.baseline)
    env: dict[str, str] = {}
    groups: dict[str, dict] = {}
    if result.plan.entries:
        delivery = deliver(Plan(entries={s: result.plan.config_for(s) for s in space.signatures}),
                           space.nccl_version)
        env = dict(delivery.env)
        groups = {name: {k: v for k, v in values.items() if v is not None}
                  for name, values in delivery.group_configs.items()}
        notes += delivery.compromises
    requirements = path_requirement_lines(space, result.plan)
    entries: list[CollectiveEntry] = []
    if result.plan.entries:
        # One entry per byte range: the signatures of a range share their settings (tuner.space).
        for sig in space.signatures:
            low, high = space.byte_range(sig)
            entry = CollectiveEntry(Match(sig.collective, sig.group, low, high, sig.ranks, sig.nodes),
                                    result.plan.config_for(sig))
            if entry not in entries:
                entries.append(entry)
    predictions = {
        "evaluator_iteration_us": round(result.iteration_us, 3),
        "baseline_us": round(outcome.baseline.iteration_us, 3),
        "tuned_us": round(result.iteration_us, 3),
    }
    if outcome.autoccl is not None:
        predictions["autoccl_us"] = round(outcome.autoccl.iteration_us, 3)
    return TunedConfig(
        cluster=cluster_arg,
        nccl_version=space.nccl_version,
        workload=workload_label,
        method=result.method,
        env=env,
        process_groups=groups,
        collectives=entries,
        predictions=predictions,
        notes=notes,
        requirements=requirements,
    )


def path_requirement_lines(space: SearchSpace, plan: Plan) -> list[str]:
    """What each process group's path needs the user to turn on, one line each: which of its
    collectives the path moves (registered buffers) and the versions it needs."""
    version = space.nccl_version
    lines = []
    for group, path in group_paths(plan).items():
        moved = sorted({s.collective for s in space.signatures
                        if s.group == group and space.mechanism(s, path) is not Mechanism.SM_KERNEL},
                       key=lambda c: c.value)
        if not moved:
            continue
        lines += [f"group {group} ({path.value}): {line}" for line in path_requirements(path, moved, version)]
    return lines
