"""What ``lagom tune`` and ``lagom bench`` share: pick an evaluator, run methods, write the file.

The tuner never chooses an evaluator; this layer does: ``analytic`` (the fitted cost
model, what Lagom is meant to tune with offline) or ``sim`` (the virtual cluster).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.calibration.backend import backend_from_spec
from costmodel.calibration.calibrate import calibrate
from costmodel.cluster import ClusterSpec, load_cluster, preset_names
from costmodel.evaluator import Evaluator, Timing
from costmodel.nccl_defaults import algo_estimates, nccl_default_config
from costmodel.replay.anchor import recorded_configs
from costmodel.sim.simulator import Simulator
from lagom.tuned_config import CollectiveEntry, Match, TunedConfig
from lagom.workload_arg import load_workload_arg
from nccl_env.cache import cache_dir
from nccl_env.delivery import deliver, group_paths
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature
from nccl_env.rules import Mechanism, NcclVersion, path_requirements
from traces.intervals import CoverIndex, union
from traces.workload import Workload
from tuner import METHODS, AutoCCL, TuningResult, build_space
from tuner.space import SearchSpace

EVALUATORS = ("analytic", "sim")
DEFAULT_EVALUATOR = "analytic"  # the fitted cost model: what Lagom tunes with offline
MIN_GAIN = 0.01  # below a 1% predicted gain, process-wide changes are not worth their risk

__all__ = ["load_workload_arg"]  # re-exported: the commands and the bench read WORKLOAD arguments through here


def make_evaluator(name: str, cluster: ClusterSpec, noise: float = 0.0, seed: int = 0) -> Evaluator:
    """``sim``: the simulator (noise-free unless asked); ``analytic``: the cost model."""
    if name == "sim":
        return Simulator(cluster, noise=noise, seed=seed)
    if name == "analytic":
        return AnalyticEvaluator(cluster)
    raise LagomError(f"unknown evaluator {name!r} (choose from {', '.join(EVALUATORS)})")


def with_nccl_version(cluster: ClusterSpec, version: str | None) -> ClusterSpec:
    """The cluster running another NCCL (the tuner's doors and MAXCHANNELS follow it)."""
    if version is None:
        return cluster
    return replace(cluster, nccl_version=str(NcclVersion.parse(version)))


def _enabled_pairs(cluster: ClusterSpec, signature: Signature):
    """The (algorithm, protocol) pairs NCCL's own tuning model enables for a collective."""
    return [(e.algorithm, e.protocol) for e in algo_estimates(cluster, signature)]


def space_for(workload: Workload, cluster: ClusterSpec, use_plugin: bool = True) -> SearchSpace:
    """The search space; for a trace, NCCL's defaults are the settings the trace recorded
    (over the cluster model's choice for what the trace does not show). ``use_plugin=False``:
    the doors without Lagom's tuner plugin (``tuner.space.build_space``)."""
    defaults: Callable[[ClusterSpec, Signature], CommConfig] = nccl_default_config
    if workload.exec_graph is not None:
        recorded = recorded_configs(workload, cluster.gpus_per_node)

        def recorded_over_model(cl: ClusterSpec, sig: Signature) -> CommConfig:
            base = nccl_default_config(cl, sig)
            rec = recorded.get(sig)
            return base if rec is None else rec.merged_over(base)

        defaults = recorded_over_model
    return build_space(workload, cluster, defaults=defaults, enabled_pairs=_enabled_pairs, use_plugin=use_plugin)


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
    if path.exists():
        try:
            return load_cluster(path)
        except LagomError:
            path.unlink()
    if log:
        log(f"calibrating the analytic model against sim:{preset} ({budget} measurements)")
    cluster = calibrate(backend_from_spec(f"sim:{preset}"), budget=budget).cluster
    tmp = path.with_suffix(".tmp")
    cluster.dump(tmp)
    tmp.replace(path)
    return load_cluster(path)


def tuning_cluster(cluster: ClusterSpec, cluster_arg: str, evaluator: str,
                   log: Callable[[str], None] | None = None) -> ClusterSpec:
    """The cluster the evaluator should model: for ``analytic`` on a preset without fitted
    ``model:`` parameters, the preset calibrated against ``sim:PRESET`` (cached)."""
    if evaluator != "analytic" or cluster.model or cluster_arg not in preset_names():
        return cluster
    return replace(calibrated_cluster(cluster_arg, log=log), nccl_version=cluster.nccl_version, nodes=cluster.nodes)


@dataclass
class TuneOutcome:
    space: SearchSpace
    result: TuningResult
    baseline: Timing
    autoccl: TuningResult | None


def tune(
    workload: Workload,
    cluster: ClusterSpec,
    evaluator: Evaluator,
    method: str = "lagom",
    budget: int | None = None,
    with_autoccl: bool = True,
    progress: Callable[[int], None] | None = None,
) -> TuneOutcome:
    """Run ``method``; also evaluate NCCL's default and (optionally) AutoCCL for comparison."""
    if method not in METHODS:
        raise LagomError(f"unknown method {method!r} (choose from {', '.join(METHODS)})")
    if budget is not None and budget < 1:
        raise LagomError(f"budget {budget}: must be at least 1 evaluation")
    space = space_for(workload, cluster)
    result = METHODS[method]().tune(workload, evaluator, space, budget=budget, progress=progress)
    baseline = result.baseline or evaluator.evaluate(workload, Plan())
    autoccl = None
    if with_autoccl:
        autoccl = result if method == "autoccl" else AutoCCL().tune(workload, evaluator, space)
    return TuneOutcome(space, result, baseline, autoccl)


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
                           NcclVersion.parse(space.nccl_version))
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
    version = NcclVersion.parse(space.nccl_version)
    lines = []
    for group, path in group_paths(plan).items():
        moved = sorted({s.collective for s in space.signatures
                        if s.group == group and space.mechanism(s, path) is not Mechanism.SM_KERNEL},
                       key=lambda c: c.value)
        if not moved:
            continue
        lines += [f"group {group} ({path.value}): {line}" for line in path_requirements(path, moved, version)]
    return lines


def _known(config: CommConfig | None) -> CommConfig:
    return config if config is not None else CommConfig()


# ---- per-signature report (the tune table and --json) ----------------------------------


@dataclass
class SignatureRow:
    signature: Signature
    old: CommConfig  # NCCL's own choice (as far as the cluster model says)
    new: CommConfig  # what the plan sets, over NCCL's choice
    old_comm_us: float  # this signature's collectives, summed, under NCCL's default
    new_comm_us: float
    old_compute_slowdown: float  # overlapped compute ops: contended / uncontended time
    new_compute_slowdown: float
    order: int | None  # position in which Lagom finished the unit holding its channels
    priority: float | None  # that unit's last H
    mechanism: Mechanism = Mechanism.SM_KERNEL  # what moves its data under the tuned plan

    def to_dict(self) -> dict:
        return {
            "signature": self.signature.label(),
            "old": self.old.to_dict(),
            "new": self.new.to_dict(),
            "mechanism": self.mechanism.value,
            "old_comm_us": round(self.old_comm_us, 3),
            "new_comm_us": round(self.new_comm_us, 3),
            "old_compute_slowdown": round(self.old_compute_slowdown, 4),
            "new_compute_slowdown": round(self.new_compute_slowdown, 4),
            "order": self.order,
            "priority": self.priority,
        }


def signature_rows(outcome: TuneOutcome, workload: Workload) -> list[SignatureRow]:
    space, result = outcome.space, outcome.result
    unit_of: dict[Signature, str] = {}
    scope_rank = {"collective": 0, "group": 1, "function": 2, "process": 3}
    for unit in sorted(space.resource_units, key=lambda u: scope_rank[u.scope.value], reverse=True):
        for sig in unit.signatures:
            unit_of[sig] = unit.key  # narrowest scope wins (written last)
    last_h: dict[str, float | None] = {}
    for step in result.steps:
        if step.priority is not None:
            last_h[step.unit] = step.priority
    rows = []
    for sig in space.signatures:
        ids = space.collective_ids[sig]
        default = _known(space.defaults.get(sig))
        key = unit_of.get(sig)
        tuned = result.plan.config_for(sig)
        rows.append(
            SignatureRow(
                signature=sig,
                old=default,
                new=tuned.merged_over(default),
                old_comm_us=_comm(outcome.baseline, ids),
                new_comm_us=_comm(result.timing, ids),
                old_compute_slowdown=_slowdown(workload, outcome.baseline, ids),
                new_compute_slowdown=_slowdown(workload, result.timing, ids),
                order=(result.order.index(key) + 1) if key in result.order else None,
                priority=last_h.get(key) if key else None,
                mechanism=space.mechanism(sig, tuned.path),
            )
        )
    return rows


def _comm(timing: Timing, ids: tuple[int, ...]) -> float:
    return sum(timing.ops[i].duration_us for i in ids if i in timing.ops)


def _slowdown(workload: Workload, timing: Timing, ids: tuple[int, ...]) -> float:
    """Contended / uncontended time of the compute ops that overlap these collectives."""
    spans = CoverIndex(union((timing.ops[i].start_us, timing.ops[i].end_us) for i in ids if i in timing.ops))
    contended = uncontended = 0.0
    for op in workload.compute_ops:
        t = timing.ops.get(op.op_id)
        if t is None or op.is_memory_op:
            continue
        if spans.covered(t.start_us, t.end_us) > 0:
            contended += t.duration_us
            uncontended += op.duration_us
    return contended / uncontended if uncontended > 0 else 1.0


# ---- why: the gain in words --------------------------------------------------------------

COMM_BOUND_EXPOSED_FRACTION = 0.25  # a quarter of the iteration with no compute to hide it


def explain(outcome: TuneOutcome) -> list[str]:
    """Sentences on where the predicted gain comes from, from the two timings alone.

    A job is called communication-bound when, even tuned, at least a quarter of the
    iteration is communication that no compute overlaps: there, only faster collectives
    help, and contention barely matters. Otherwise the gain (or the lack of one) is about
    how much the collectives slow the compute they overlap.
    """
    base, tuned = outcome.baseline, outcome.result.timing
    gain = base.iteration_us / tuned.iteration_us if tuned.iteration_us > 0 else 1.0
    exposed = tuned.exposed_comm_us / tuned.iteration_us if tuned.iteration_us > 0 else 0.0
    exposed_base = base.exposed_comm_us / base.iteration_us if base.iteration_us > 0 else 0.0
    lines = []
    if exposed >= COMM_BOUND_EXPOSED_FRACTION:
        lines.append(
            f"communication-bound: {exposed:.0%} of the tuned iteration is communication no compute overlaps "
            f"({exposed_base:.0%} under NCCL's default); only faster collectives help here, and x{gain:.3f} is what "
            f"they give (communication busy {base.comm_us / 1e3:,.1f} -> {tuned.comm_us / 1e3:,.1f} ms)")
    else:
        lines.append(
            f"compute-bound: contention slows compute x{base.compute_slowdown:.3f} under NCCL's "
            f"default and x{tuned.compute_slowdown:.3f} tuned (compute busy {base.compute_us / 1e3:,.1f} -> "
            f"{tuned.compute_us / 1e3:,.1f} ms); exposed communication {base.exposed_comm_us / 1e3:,.1f} -> "
            f"{tuned.exposed_comm_us / 1e3:,.1f} ms")
    if outcome.autoccl is not None:
        auto = outcome.autoccl.timing
        if auto.compute_slowdown > tuned.compute_slowdown * 1.01 and auto.iteration_us > tuned.iteration_us:
            lines.append(
                f"AutoCCL's fastest collectives slow the compute x{auto.compute_slowdown:.3f}: "
                f"its iteration is {auto.iteration_us / 1e3:,.1f} ms against {tuned.iteration_us / 1e3:,.1f} ms")
    return lines
