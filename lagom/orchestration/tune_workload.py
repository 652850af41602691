"""One ``lagom tune``, without the command line: a :class:`TuneRequest` in, a :class:`TuneResult` out.

:func:`tune` does the work the command's flags ask for: it checks the request (the command's
messages, before any work), reads the workload (a folder's ranks jointly), resolves the cluster
and the NCCL version (a trace's own, :mod:`lagom.orchestration.trace_context`), wires the
evaluator (calibrated, scaled for ``unprofiled_cpu``, joint over a folder), runs the search
(:func:`lagom.orchestration.tuning.tune`), builds the tuned-config file and the report's figures.
It writes no file: the result holds the file (``config``) and what an exported trace needs, and
the caller writes them (``lagom tune``: ``-o`` then ``--export-trace``).

What the work meets on its way (notes, warnings, the calibration, the CPU's scale found) is told
to ``progress`` as it happens, in the order ``lagom tune`` prints it on stderr, and kept in the
result (``notes``, ``warnings``); the search's evaluations are counted on the bar
``progress.search`` gives.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from costmodel.cluster import ClusterSpec
from costmodel.evaluator import DurationScale, Evaluator
from costmodel.replay.fidelity import ReplayFidelity, fidelity
from lagom.args.common_args import check_seed
from lagom.args.rank_args import RankReading
from lagom.files.output_paths import OutputFormat, check_output
from lagom.files.trace_export import check_export_path
from lagom.files.tuned_config import TunedConfig, stored_path
from lagom.orchestration import tuning
from lagom.orchestration.trace_context import refuse_to_tune, resolve_cluster
from lagom.reports.record_overhead import (
    ProfilerOverhead,
    UnprofiledCpu,
    check_recorded_steps,
    profiler_overhead,
    unprofiled_cpu,
    unprofiled_line,
)
from lagom.reports.tune_report import JobView, SignatureRow, TuneReport, tune_report
from lagom.reports.workload_fit import fit_warnings, untunable_warnings
from nccl_env.errors import LagomError
from nccl_env.plan import Plan
from nccl_env.rules import NcclVersion
from traces.workload import Workload
from tuner import METHODS
from tuner.result import TuneOutcome

if TYPE_CHECKING:
    from costmodel.replay.joint import JointTiming


@dataclass(frozen=True)
class TuneRequest:
    """What ``lagom tune``'s flags give (docs: ``lagom tune --help``)."""

    workload: str  # a trace, a folder of ranks, a workload JSON file or a generator spec
    cluster: str | None = None  # a preset or a cluster file; None: a trace's GPU's preset
    nccl_version: NcclVersion | None = None  # None: the trace's, else the cluster's
    evaluator: str = tuning.DEFAULT_EVALUATOR
    method: str = "lagom"
    budget: int | None = None  # at most this many evaluations by the method; None: its own rule
    seed: int = 0
    output: str = "lagom.yaml"  # the tuned-config file the result is for (its paths are relative to it)
    force: bool = False  # the output (and export) may replace a file Lagom did not write
    with_autoccl: bool = True
    min_gain: float = tuning.MIN_GAIN  # a fraction: below it the file keeps NCCL's defaults
    unprofiled_cpu: bool = False  # a trace from lagom record: the CPU's time scaled to the unprofiled step
    export_trace: str | None = None  # a trace: where the tuned plan's predicted steps are to be exported
    rank: int | None = None  # a folder of ranks: tune on this rank alone (None: every rank jointly)
    reading: RankReading = field(default_factory=RankReading)  # where a folder's ranks are read


class Told(enum.Enum):
    """How a line :func:`tune` meets is printed (``lagom tune``: on stderr)."""

    NOTE = "note: "
    WARNING = "warning: "
    LINE = ""  # as it is: the calibration started, the CPU's scale found


class TuneProgress(Protocol):
    """Who hears what :func:`tune` meets as it goes."""

    def tell(self, kind: Told, text: str) -> None:
        """A note, a warning or a line, in the order the work meets them."""

    def search(self, label: str, total: int | None) -> AbstractContextManager[Callable[[int], None]]:
        """Around the search: a callable the search calls with its evaluations so far."""


class Quiet:
    """A :class:`TuneProgress` that hears nothing (the result keeps the notes and warnings)."""

    def tell(self, kind: Told, text: str) -> None:
        pass

    @contextmanager
    def search(self, label: str, total: int | None) -> Iterator[Callable[[int], None]]:
        yield lambda done: None


@dataclass
class TuneResult:
    """What :func:`tune` found: the plan and its file, the figures and the lines to say."""

    request: TuneRequest
    workload: Workload  # the workload (a folder's: the rank whose figures the report shows)
    from_trace: bool
    cluster: ClusterSpec
    outcome: TuneOutcome  # the method's plan and timing, NCCL's default (the baseline), AutoCCL's
    config: TunedConfig  # the tuned-config file, to be written at request.output
    report: TuneReport  # the figures, the rows of the per-collective table, the why lines
    elapsed_s: float  # the search's wall time
    fidelity: ReplayFidelity | None  # a trace's replay under its own settings against its measured steps
    overhead: ProfilerOverhead | None  # the profiler's, for a trace from lagom record
    unprofiled: UnprofiledCpu | None  # the CPU's scale found (request.unprofiled_cpu)
    joint: JointTiming | None  # a folder's ranks replayed jointly: the tuned plan's last joint replay
    export_path: Path | None  # request.export_trace, checked
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def plan(self) -> Plan:
        return self.outcome.result.plan

    @property
    def baseline_us(self) -> float:
        return self.outcome.baseline.iteration_us

    @property
    def tuned_us(self) -> float:
        return self.outcome.result.iteration_us

    @property
    def autoccl_us(self) -> float | None:
        return self.outcome.autoccl.iteration_us if self.outcome.autoccl is not None else None

    @property
    def rows(self) -> list[SignatureRow]:
        return self.report.rows

    @property
    def cpu_scale(self) -> float:
        """The CPU's scale every plan was replayed at (1: as traced)."""
        return self.unprofiled.cpu if self.unprofiled is not None else 1.0

    @property
    def evaluations_by_method(self) -> dict[str, int]:
        method, autoccl = self.request.method, self.outcome.autoccl
        return {method: self.outcome.result.evaluations,
                **({"autoccl": autoccl.evaluations} if autoccl is not None and method != "autoccl" else {})}

    def to_dict(self) -> dict:
        """``lagom tune --json``."""
        r, base, tuned, auto = self.request, self.baseline_us, self.tuned_us, self.autoccl_us
        out = {
            "workload": r.workload,
            "cluster": self.cluster.name,
            "evaluator": r.evaluator,
            "method": r.method,
            "baseline_us": round(base, 3),
            "tuned_us": round(tuned, 3),
            "autoccl_us": None if auto is None else round(auto, 3),
            "speedup_vs_nccl": round(base / tuned, 4),
            "speedup_vs_autoccl": None if auto is None else round(auto / tuned, 4),
            "evaluations": self.outcome.evaluations_run,
            "evaluations_by_method": self.evaluations_by_method,
            "signatures": len(self.report.rows),
            "elapsed_s": round(self.elapsed_s, 2),
            "output": r.output,
            **self.report.to_dict(),
            "notes": self.config.notes,
            "requirements": self.config.requirements,
        }
        if self.export_path is not None:
            out["export_trace"] = str(self.export_path)
        if self.overhead is not None:
            out["profiler_overhead"] = self.overhead.to_dict()
        if self.fidelity is not None:
            out["replay"] = self.fidelity.to_dict()
            out["steps"] = [
                {**b.to_dict(), "tuned_iteration_us": round(t.iteration_us, 3), "tuned_comm_us": round(t.comm_us, 3),
                 "tuned_exposed_comm_us": round(t.exposed_comm_us, 3)}
                for b, t in zip(self.outcome.baseline.steps, self.outcome.result.timing.steps)
            ]
        return out


def check_request(request: TuneRequest) -> Path | None:
    """The request's flags checked before any work (the command's messages); the export path, checked."""
    r = request
    check_seed(r.seed)
    if not (r.min_gain >= 0 and r.min_gain < 10):
        raise LagomError(f"--min-gain {r.min_gain}: must be a fraction >= 0 (0.01 = 1%)")
    if r.budget is not None and not 1 <= r.budget <= tuning.MAX_BUDGET:
        raise LagomError(f"--budget {r.budget}: must be between 1 and {tuning.MAX_BUDGET} evaluations")
    if r.evaluator not in tuning.EVALUATORS:  # the command's flags choose among them
        raise LagomError(f"unknown evaluator {r.evaluator!r} (choose from {', '.join(tuning.EVALUATORS)})")
    if r.method not in METHODS:
        raise LagomError(f"unknown method {r.method!r} (choose from {', '.join(METHODS)})")
    check_output("-o", r.output, OutputFormat.TUNED_CONFIG, force=r.force,
                 inputs=[("WORKLOAD", r.workload), ("--cluster", r.cluster)])
    export = (check_export_path(r.export_trace, [("WORKLOAD", r.workload), ("-o", r.output)], force=r.force)
              if r.export_trace else None)
    if export is not None and export.resolve() == Path(r.output).resolve():
        raise LagomError(f"--export-trace {r.export_trace}: is also -o's file; give them two names")
    return export


def tune(request: TuneRequest, progress: TuneProgress | None = None) -> TuneResult:
    """Tune ``request``'s workload (module docstring); bad input raises LagomError before any work."""
    r, heard = request, progress or Quiet()
    export = check_request(r)
    from lagom.orchestration.joint_run import JointEvaluator, bound_transfers, bounded_line, read_workload_or_ranks

    given = read_workload_or_ranks(r.workload, r.rank, r.reading, joint=not r.unprofiled_cpu)
    workload, from_trace, workloads = given.workload, given.from_trace, given.workloads  # workloads: replayed jointly
    if export is not None and not from_trace:
        raise LagomError("--export-trace: applies to a trace (WORKLOAD is not a trace)")
    if r.unprofiled_cpu:
        check_recorded_steps(workload, from_trace)
    refusal = refuse_to_tune(workload, cluster_given=r.cluster is not None) if from_trace else None
    if refusal:
        raise LagomError(refusal)
    choice = resolve_cluster(workload, from_trace, r.cluster, r.nccl_version)
    cluster = choice.cluster
    notes: list[str] = []
    warnings: list[str] = []

    def say(kind: Told, text: str) -> None:  # kept in the result (notes, warnings) and told now
        if kind is Told.NOTE:
            notes.append(text)
        elif kind is Told.WARNING:
            warnings.append(text)
        heard.tell(kind, text)

    for note in choice.notes_for(workload, from_trace):
        say(Told.NOTE, note)
    if from_trace and workload.collectives and not any(c.on_gpu for c in workload.collectives):
        choice.warnings.append(f"{workload.source}: its collectives ran on the CPU (no NCCL kernels: a gloo job): "
                               f"the replay keeps their measured times, and the tuned figures are the model's for "
                               f"them as NCCL would run them on {cluster.name}, not a prediction for this job")
    for warning in choice.warnings + fit_warnings(workload, cluster) + untunable_warnings(workload):
        say(Told.WARNING, warning)
    joined = bound_transfers(given.read, cluster) if from_trace else None  # waits where the cluster bounds them
    bounded = bounded_line(joined, cluster.name)
    if bounded:
        say(Told.NOTE, bounded)
    model_cluster = tuning.tuning_cluster(cluster, choice.cluster_arg, r.evaluator, log=lambda m: say(Told.LINE, m))
    model = tuning.make_evaluator(r.evaluator, model_cluster, seed=r.seed, workload=workload)
    evaluator: Evaluator = model
    unprofiled = None
    if r.unprofiled_cpu:  # the bisection's evaluator serves the search too (its replay data are built)
        unprofiled = unprofiled_cpu(model, workload)
        say(Told.LINE, unprofiled_line(unprofiled))
        evaluator = tuning.ScaledEvaluator(model, DurationScale(cpu=unprofiled.cpu))
    joint = JointEvaluator(model, workloads, joined=joined) if workloads is not None else None
    if joint is not None:
        evaluator = joint
    started = time.perf_counter()
    with heard.search(f"tuning ({r.method}, evaluations)", r.budget) as update:
        outcome = tuning.tune(
            workload, cluster, evaluator, method=r.method, budget=r.budget, with_autoccl=r.with_autoccl,
            progress=update, seed=r.seed,
            other_ranks=[w for w in workloads if w is not workload] if workloads is not None else (),
        )
    elapsed_s = time.perf_counter() - started
    config = tuning.tuned_config(outcome, cluster, stored_path(choice.cluster_arg, "cluster", r.output),
                                 stored_path(r.workload, "workload", r.output), min_gain=r.min_gain)
    job_view, tuned_joint = None, None
    if joint is not None and workloads is not None:  # the rows from every rank: the job's step, step by step
        nccl_joint = joint.joint(Plan())
        tuned_joint = joint.joint(outcome.result.plan)
        job_view = JobView({w.rank: w for w in workloads}, nccl_joint, tuned_joint, cluster.gpus_per_node)
    return TuneResult(
        request=r, workload=workload, from_trace=from_trace, cluster=cluster, outcome=outcome, config=config,
        report=tune_report(outcome, workload, r.min_gain, job_view), elapsed_s=elapsed_s,
        fidelity=fidelity(outcome.baseline),
        overhead=profiler_overhead([workload.recorded_steps]) if from_trace else None,
        unprofiled=unprofiled, joint=tuned_joint, export_path=export,
        notes=notes, warnings=warnings,
    )
