"""``lagom simulate``'s work, without the command line: a :class:`SimulateRequest` in (the
flags as data), a :class:`SimulateResult` out (the figures, its ``--json`` object, the notes and
warnings), from :func:`simulate`.

The steps, in the order the command has always taken them: the request checked; WORKLOAD read
(a folder's ranks for a joint replay, lagom/orchestration/joint_run.py); the cluster and NCCL
version resolved (``--nccl-version``, else a ``--config`` file's ``nccl_version``, else the
trace's, else the cluster's: lagom/orchestration/trace_context.py); the plan built from
``--config`` and ``--set``; the evaluator made; the what-if (``--scale``, ``--unprofiled-cpu``)
and the plan replayed; the replay's fidelity under the trace's own settings; the prediction
exported (``--export-trace``). Bad input raises :class:`nccl_env.errors.LagomError` with the
line the command prints.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from costmodel.evaluator import DurationScale, StepTiming, check_config
from lagom.args.common_args import DEFAULT_NOISE, check_seed
from lagom.args.knob_args import check_noise, parse_nccl_version_arg
from lagom.args.rank_args import RankReading
from lagom.files.trace_export import check_export_path, export_trace
from lagom.reports.record_overhead import check_recorded_steps, unprofiled_cpu, unprofiled_line
from lagom.reports.simulate_report import SimulateFigures
from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan

if TYPE_CHECKING:
    from costmodel.cluster import ClusterSpec
    from lagom.orchestration.joint_run import WorkloadInput
    from traces.workload import Workload

SIMULATE_EVALUATOR = "sim"  # one run asked for: the simulator's answer, not the model fitted to it
NOTE, WARNING = "note: ", "warning: "  # the prefixes of the lines the command prints on stderr


@dataclass(frozen=True)
class SimulateRequest:
    """What to simulate: ``lagom simulate``'s flags as data (the command's help says what each does)."""

    workload: str  # a trace file or folder, a workload JSON file, or a spec (fsdp:llama3-8b:gpus=8)
    cluster: str | None = None  # a preset name or cluster YAML; for a trace, None: the preset for its GPU
    nccl_version: str | None = None  # X.Y.Z as given; None: the --config file's, else the trace's or cluster's
    evaluator: str = SIMULATE_EVALUATOR  # analytic | sim
    set_config: str | None = None  # --set: one CommConfig for every collective, e.g. "channels=16,chunk=2MiB"
    config: str | None = None  # --config: a tuned file from lagom tune
    scale: tuple[str, ...] = ()  # --scale items: "comm=0.5", "compute=0.8@0-1", ...
    rank: int | None = None  # a folder: replay rank N alone; None: every rank jointly
    unprofiled_cpu: bool = False
    noise: float | None = None  # a spec or workload file only; None: DEFAULT_NOISE
    seed: int = 0
    export_trace: str | None = None  # write the prediction as a Kineto trace there
    force: bool = False  # let export_trace replace a file that is not a trace Lagom exported
    reading: RankReading = RankReading()  # where a folder's ranks are read


@dataclass
class SimulateResult(SimulateFigures):
    """What :func:`simulate` found (the figures the table shows, :class:`SimulateFigures`, and more)."""

    workload: str  # the workload's source (a trace's file) or the request's WORKLOAD
    evaluations: int  # the evaluator's runs for the figures (the fidelity's own replay not counted)
    export_trace: Path | None  # where the prediction was written, or None
    lines: list[str] = field(default_factory=list)  # the stderr lines, in order: "note: ...", "warning: ", ...

    @property
    def notes(self) -> list[str]:
        return [line.removeprefix(NOTE) for line in self.lines if line.startswith(NOTE)]

    @property
    def warnings(self) -> list[str]:
        return [line.removeprefix(WARNING) for line in self.lines if line.startswith(WARNING)]

    def to_dict(self) -> dict[str, Any]:
        """``lagom simulate --json``'s object (its keys in this order)."""
        t = self.timing
        out: dict[str, Any] = {
            "iteration_us": round(t.iteration_us, 3), "compute_us": round(t.compute_us, 3),
            "comm_us": round(t.comm_us, 3), "exposed_comm_us": round(t.exposed_comm_us, 3),
            "compute_uncontended_us": round(t.compute_uncontended_us, 3),
            "compute_slowdown": round(t.compute_slowdown, 4), "evaluations": self.evaluations,
            "cluster": self.cluster, "workload": self.workload, "evaluator": self.evaluator,
            "ops": self.ops, "collectives": self.collectives,
        }
        if t.steps:
            out["steps"] = [st.to_dict() for st in t.steps]
            out["replay"] = self.fidelity.to_dict() if self.fidelity is not None else None
            if self.measured is not None:  # the figures above are the what-if's; the trace's beside them
                out["whatif"] = True
                out["measured"] = self.measured
        if self.joint is not None:
            from lagom.orchestration.joint_run import joint_json, ranks_json

            out["ranks"] = ranks_json(self.joint)
            out["joint"] = joint_json(self.joint)
        if self.export_trace is not None:
            out["export_trace"] = str(self.export_trace)
        out["figures_of"] = self.figures_of
        return out


def measured_means(steps: list[StepTiming]) -> dict[str, float]:
    """What the trace measured, the mean over its complete steps (us): the figures a what-if's
    summary stands beside."""
    n = len(steps)
    return {"iteration_us": round(sum(s.measured_iteration_us for s in steps) / n, 3),
            "compute_us": round(sum(s.measured_compute_us for s in steps) / n, 3),
            "comm_us": round(sum(s.measured_comm_us for s in steps) / n, 3),
            "exposed_comm_us": round(sum(s.measured_exposed_comm_us for s in steps) / n, 3)}


def _file_nccl_version(path: str) -> str | None:
    """The ``nccl_version`` a tuned file records (None when it records none); the file itself is
    checked later, by NCCL's rules for the version in force."""
    from nccl_env.files import check_not_empty, read_yaml

    check_not_empty(path, "--config")
    data = read_yaml(Path(path))
    value = data.get("nccl_version") if isinstance(data, dict) else None
    return value if isinstance(value, str) and value.strip() else None


def _read(request: SimulateRequest) -> tuple[Path | None, WorkloadInput]:
    """The request checked and WORKLOAD read: (the export's path, the input), refusals before any replay."""
    from lagom.orchestration.joint_run import check_scale_ranks, parse_scale_items, read_workload_or_ranks

    if request.noise is not None:
        check_noise(request.noise)
    check_seed(request.seed)
    export = (check_export_path(request.export_trace, [("WORKLOAD", request.workload), ("--config", request.config)],
                                force=request.force) if request.export_trace else None)
    given = read_workload_or_ranks(request.workload, request.rank, request.reading, joint=not request.unprofiled_cpu)
    if request.scale and given.from_trace:  # a rank the input lacks: refused before any work, on a file as a folder
        check_scale_ranks(parse_scale_items(list(request.scale)), given.ranks, request.workload)
    if export is not None and not given.from_trace:
        raise LagomError("--export-trace: applies to a trace (WORKLOAD is not a trace)")
    if request.unprofiled_cpu:
        check_recorded_steps(given.workload, given.from_trace)
    if given.from_trace and request.noise:
        raise LagomError("--noise: a trace is replayed from its measured times, which no noise changes; drop --noise")
    return export, given


def _plan(request: SimulateRequest, cluster: ClusterSpec, every: list[Workload], warnings: list[str]) -> Plan:
    """The plan ``--config`` and ``--set`` give ``every`` rank's collectives (none: the trace's own
    settings, NCCL's modelled defaults otherwise); what the file leaves unmatched is added to ``warnings``."""
    from lagom.args.knob_args import parse_set
    from lagom.reports.workload_fit import unmatched_config_warning
    from nccl_env.knob_table import validate_config

    # the settings a file or --set gives reach NCCL's collectives of known size only (CollectiveOp.tunable)
    signatures = sorted({w.signature(c, cluster.gpus_per_node) for w in every for c in w.collectives if c.tunable})
    plan = Plan()
    if request.config:
        from lagom.files.tuned_config import absent_group_warning, load_tuned_config

        tuned = load_tuned_config(request.config, cluster.nccl_version)  # NCCL's rules for the cluster's version
        absent = absent_group_warning(request.config, tuned, {c.group for w in every for c in w.collectives}, "the job")
        if absent:
            warnings.append(absent)
        for i, entry in enumerate(tuned.collectives):  # and what the evaluators model
            check_config(entry.config, f"{request.config}: collectives[{i}]", cluster)
        plan = tuned.to_plan(signatures)
        unmatched = unmatched_config_warning(request.config, len(tuned.collectives), signatures, plan)
        if unmatched:
            warnings.append(unmatched)
    if request.set_config:
        forced = parse_set(request.set_config)
        try:  # values the cluster's NCCL would refuse, or the evaluators cannot model, are an error
            validate_config(forced, cluster.nccl_version)
        except LagomError as exc:
            raise LagomError(f"--set: {exc}") from None
        check_config(forced, "--set", cluster)
        plan = Plan(entries={sig: plan.config_for(sig).merged_over(forced) for sig in signatures}, default=forced)
    return plan


def _what(request: SimulateRequest) -> str:
    """What a prediction predicts, as an exported trace names it."""
    return ", ".join([*([f"--config {request.config}"] if request.config else []),
                      *([f"--set {request.set_config}"] if request.set_config else []),
                      *([f"--scale {','.join(request.scale)}"] if request.scale else [])]) or "the recorded settings"


def simulate(request: SimulateRequest, say: Callable[[str], None] | None = None) -> SimulateResult:
    """One iteration of ``request.workload`` on a virtual cluster. Each line for the user (notes,
    warnings, what was found or written) is kept in the result's ``lines`` and, when ``say`` is
    given, passed to it as it is found: a command prints them in order with the work, before a
    refusal that comes after them."""
    from costmodel.replay.fidelity import fidelity
    from lagom.orchestration.joint_run import (
        JointEvaluator,
        bound_transfers,
        bounded_line,
        joint_identity,
        joint_line,
        parse_scale_items,
        rank_scales,
        scale_for_rank,
    )
    from lagom.orchestration.trace_context import resolve_cluster
    from lagom.orchestration.tuning import make_evaluator
    from lagom.reports.workload_fit import fit_warnings

    lines: list[str] = []

    def tell(line: str) -> None:
        lines.append(line)
        if say is not None:
            say(line)

    export, given = _read(request)
    workload, from_trace, workloads = given.workload, given.from_trace, given.workloads  # workloads: replayed jointly
    nccl_version = parse_nccl_version_arg(request.nccl_version)
    version_from = "--nccl-version"
    if nccl_version is None and request.config:  # the NCCL the file was tuned for, unless the flag says otherwise
        nccl_version = parse_nccl_version_arg(_file_nccl_version(request.config), f"{request.config}: nccl_version")
        version_from = f"{request.config}'s nccl_version"
    choice = resolve_cluster(workload, from_trace, request.cluster, nccl_version, version_from, "modelling")
    cluster = choice.cluster
    joined = bound_transfers(given.read, cluster) if from_trace else None  # waits where the cluster bounds them
    for note in choice.notes_for(workload, from_trace):
        tell(NOTE + note)
    warnings = choice.warnings + fit_warnings(workload, cluster)
    plan = _plan(request, cluster, workloads or [workload], warnings)
    for warning in warnings:
        tell(WARNING + warning)
    bounded = bounded_line(joined, cluster.name)
    if bounded:
        tell(NOTE + bounded)
    items = parse_scale_items(list(request.scale)) if request.scale else []
    scale = scale_for_rank(items, workload.rank) if items else None
    if items and not from_trace:
        raise LagomError("--scale: applies to a trace's measured times (WORKLOAD is not a trace)")
    noise = 0.0 if from_trace else DEFAULT_NOISE if request.noise is None else request.noise
    evaluator = make_evaluator(request.evaluator, cluster, noise, request.seed, workload)
    if request.unprofiled_cpu:
        if scale is not None and scale.cpu != 1.0:
            raise LagomError("--unprofiled-cpu chooses the CPU's scale itself: drop cpu= from --scale")
        found = unprofiled_cpu(evaluator, workload)
        tell(unprofiled_line(found))
        scale = replace(scale or DurationScale(), cpu=found.cpu)
    joint, jev = None, None
    if workloads is not None:
        jev = JointEvaluator(evaluator, workloads, rank_scales(items, [w.rank for w in workloads]), joined)
        joint = jev.joint(plan)
        timing = jev.timing_of(joint, workload.rank)
    else:
        timing = evaluator.evaluate(workload, plan, scale)
    evaluations = evaluator.evaluations
    fid, measured = None, None
    if timing.steps:
        own = not plan.entries and plan.default == CommConfig() and not items
        fid = fidelity(timing if own else joint_identity(jev) if jev is not None
                       else evaluator.evaluate(workload, Plan()))
        measured = None if own else measured_means(timing.steps)
    if joint is not None:
        tell(joint_line(joint))
    if export is not None:
        what = _what(request)
        export_trace(workload, joint.ranks[workload.rank] if joint is not None else timing, export, what,
                     scale.cpu if scale is not None else 1.0)
        tell(f"prediction written to {export} ({what})")
    label = workload.source or request.workload
    if joint is not None:  # the figures are the job's: per step its slowest rank's
        slow = sorted(set(joint.slowest))
        whose = (f"{Path(request.workload).name}: {len(joint.ranks)} ranks, the job's step (its slowest "
                 f"rank{'s' if len(slow) > 1 else ''}: {', '.join(map(str, slow))})")
    else:
        whose = Path(str(label)).name + (f" (rank {workload.rank})" if from_trace else "")
    return SimulateResult(
        figures_of=whose, cluster=cluster.name, evaluator=request.evaluator, rank=workload.rank, timing=timing,
        ops=len(workload.compute_ops) + len(workload.collectives), collectives=len(workload.collectives),
        fidelity=fid, measured=measured,
        whatif=bool(plan.entries) or plan.default != CommConfig() or scale is not None, joint=joint,
        workload=label, evaluations=evaluations, export_trace=export, lines=lines)
