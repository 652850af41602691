"""What ``lagom tune`` reports: every figure computed once, here, and the words derived from them.

One definition per figure (docs/tuner.md, "The figures"), the same in the tables, the
reason lines and ``--json``:

- **step** (ms): a trace's profiler step as the GPU's period (docs/replay.md), the mean
  over its complete steps; a generated workload's iteration;
- **collectives**, **exposed**, **compute** (ms per step): merged collective time,
  the part of it no compute kernel overlaps, merged compute time;
- **GPU idle** (ms per step): the step minus compute minus exposed collectives;
- **compute slowdown**: compute time over the same compute with no collective beside
  it (``Timing.compute_slowdown``; for a trace, "alone" is the trace's own run of the
  same kernel shape where it has one);
- per signature: its collectives' summed time per step, over the steps the replay keeps
  (their union over every signature is the step's collectives; the rows' sum,
  ``rows_total``, counts time where collectives overlap each other as often as they do).
  A folder's ranks replayed jointly: the job's step is per step its slowest rank's, so a
  signature's time per step is that rank's, step by step, and the rows' sum is the job's
  step's collective time; a signature the slowest ranks never ran shows the lowest rank
  that ran it, named (``SignatureRow.rank``), outside that sum. The headers name the rank
  whose figures they show. With each row, the compute slowdown of the
  kernels they overlap, by the same definition (time-weighted: ``lagom analyze``'s
  contention figure is a median of per-kernel ratios, a different figure), with the share
  of that compute's time whose slowdown the trace measured (the rest is the model's: a
  kernel shape that never ran alone).

The bound of a step says what its time goes to under NCCL's settings: *idle* when the
GPU is idle half of it or more, else *communication* when a quarter or more is exposed
collectives, else *compute*.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, replace

from costmodel.evaluator import Timing
from costmodel.replay.joint import JointTiming
from nccl_env.knob_table import PATH
from nccl_env.knobs import CommConfig
from nccl_env.plan import Signature
from nccl_env.rules import Mechanism
from traces.contention import measured_slowdowns
from traces.intervals import CoverIndex, union
from traces.workload import Workload
from tuner.result import TuneOutcome
from tuner.space import workload_signatures

IDLE_BOUND_FRACTION = 0.5  # the GPU idle half the step or more: the CPU or launches pace it
COMM_BOUND_FRACTION = 0.25  # a quarter of the step exposed collectives: only faster collectives help
NOTHING_TO_GAIN_FRACTION = 0.01  # critical-path collectives under 1% of the step: below --min-gain's default
# Kineto times kernels in whole microseconds in many traces (HTA rounds to them): a kernel
# alone for less than that has no measurable time to be slowed from
MIN_ALONE_US = 1.0


class Bound(enum.Enum):
    IDLE = "idle-bound"
    COMMUNICATION = "communication-bound"
    COMPUTE = "compute-bound"


@dataclass(frozen=True)
class PlanFigures:
    """One plan's figures, ms per step (per iteration for a generated workload)."""

    step_ms: float
    collectives_ms: float
    exposed_ms: float
    compute_ms: float
    compute_slowdown: float
    critical_ms: float | None  # the trace's collective time on the critical path (None: not a trace)

    @property
    def idle_ms(self) -> float:
        return max(0.0, self.step_ms - self.compute_ms - self.exposed_ms)

    @property
    def bound(self) -> Bound:
        if self.step_ms > 0 and self.idle_ms >= IDLE_BOUND_FRACTION * self.step_ms:
            return Bound.IDLE
        if self.step_ms > 0 and self.exposed_ms >= COMM_BOUND_FRACTION * self.step_ms:
            return Bound.COMMUNICATION
        return Bound.COMPUTE

    def to_dict(self) -> dict:
        return {"step_ms": round(self.step_ms, 4), "collectives_ms": round(self.collectives_ms, 4),
                "exposed_ms": round(self.exposed_ms, 4), "compute_ms": round(self.compute_ms, 4),
                "gpu_idle_ms": round(self.idle_ms, 4), "compute_slowdown": round(self.compute_slowdown, 4),
                **({"critical_collectives_ms": round(self.critical_ms, 4)} if self.critical_ms is not None else {}),
                "bound": self.bound.value}


def plan_figures(timing: Timing) -> PlanFigures:
    critical = (sum(s.measured_critical_comm_us for s in timing.steps) / len(timing.steps) / 1e3
                if timing.steps else None)
    return PlanFigures(timing.iteration_us / 1e3, timing.comm_us / 1e3, timing.exposed_comm_us / 1e3,
                       timing.compute_us / 1e3, timing.compute_slowdown, critical)


@dataclass(frozen=True)
class SignatureRow:
    signature: Signature
    old: CommConfig  # NCCL's own choice (the trace's recorded settings over the cluster model's)
    new: CommConfig  # what the search found, over NCCL's choice
    kept: bool  # the file keeps NCCL's settings (the predicted gain is below --min-gain)
    old_ms: float  # its collectives' time per step under NCCL's settings
    new_ms: float  # ... under the tuned plan
    old_slowdown: float  # compute slowdown of the kernels its collectives overlap
    new_slowdown: float
    order: int | None  # position in which Lagom finished the unit holding its channels
    priority: float | None  # that unit's last H
    mechanism: Mechanism = Mechanism.SM_KERNEL  # what moves its data under the tuned plan
    # of the compute its collectives overlap (under NCCL's settings), the share of time whose
    # slowdown the trace measured (its kernel shape also ran alone); the rest is the model's.
    # None: no compute beside them, or not a trace
    measured_share: float | None = None
    # a folder replayed jointly: None when the figures are the job's step's (its slowest rank's, step
    # by step), else the rank they are from (the slowest ranks never ran it: outside the rows' total)
    rank: int | None = None
    # it ran only outside the steps the replay keeps (the unfinished last step): its time there,
    # once, outside the rows' total, not 0 ms
    outside_steps: bool = False

    @property
    def in_total(self) -> bool:
        return self.rank is None and not self.outside_steps

    def where(self) -> str:
        """What the signature's label adds: whose figures, where they are not the step's."""
        parts = ([f"rank {self.rank}"] if self.rank is not None else []) + (
            ["outside the kept steps"] if self.outside_steps else [])
        return f" ({', '.join(parts)})" if parts else ""

    @property
    def slowdown_mostly_modelled(self) -> bool:
        return self.measured_share is not None and self.measured_share < 0.5

    def to_dict(self) -> dict:
        return {"signature": self.signature.label(), "nccl": self.old.to_dict(), "tuned": self.new.to_dict(),
                "mechanism": self.mechanism.value, "kept": self.kept, "nccl_ms": round(self.old_ms, 4),
                "tuned_ms": round(self.new_ms, 4), "nccl_compute_slowdown": round(self.old_slowdown, 4),
                "tuned_compute_slowdown": round(self.new_slowdown, 4),
                "compute_slowdown_measured_share": (None if self.measured_share is None
                                                    else round(self.measured_share, 4)),
                "order": self.order,
                "priority": self.priority, "rank": self.rank, "outside_steps": self.outside_steps}


@dataclass(frozen=True)
class TuneReport:
    nccl: PlanFigures
    tuned: PlanFigures
    autoccl: PlanFigures | None
    kept: bool
    gain: float  # nccl step / tuned step - 1
    min_gain: float
    rows: list[SignatureRow]
    cpu_only: bool = False  # a gloo job's trace: no GPU, its collectives CPU calls
    figures_of: str = ""  # whose figures the rows are: "rank 0", or "the job's step (slowest rank: 1)"

    @property
    def written(self) -> PlanFigures:
        """What the file the command writes runs: the tuned plan, or NCCL's settings when kept."""
        return self.nccl if self.kept else self.tuned

    def why(self) -> list[str]:
        """The reason lines, from the figures above and nothing else."""
        n, t = self.nccl, self.tuned
        idle = "the CPU's own work" if self.cpu_only else "GPU idle"  # the same figure: step - compute - exposed
        lines = [f"{n.bound.value}: under NCCL's settings a step is {n.step_ms:,.2f} ms: compute "
                 f"{n.compute_ms:,.2f} ms, exposed collectives {n.exposed_ms:,.2f} ms, {idle} {n.idle_ms:,.2f} ms"
                 + (" (no GPU: a gloo job's time outside its collectives, which NCCL's settings do not change)"
                    if n.bound is Bound.IDLE and self.cpu_only else
                    " (the GPU waits on the CPU or on launches, which NCCL's settings do not change)"
                    if n.bound is Bound.IDLE else "")]
        if n.critical_ms is not None:
            lines.append(f"faster collectives can shorten a step by {n.critical_ms:,.2f} ms at most "
                         f"(collective time on its critical path; exposed is collective time no compute "
                         f"overlaps, on that path or not)"
                         + (": nothing for NCCL's settings to gain here"
                            if n.critical_ms < NOTHING_TO_GAIN_FRACTION * n.step_ms else ""))
        change = (f"{t.step_ms:,.2f} ms (x{n.step_ms / t.step_ms:.3f}): exposed collectives {n.exposed_ms:,.2f} -> "
                  f"{t.exposed_ms:,.2f} ms, compute {n.compute_ms:,.2f} -> {t.compute_ms:,.2f} ms "
                  f"(slowdown x{n.compute_slowdown:.3f} -> x{t.compute_slowdown:.3f})") if t.step_ms > 0 else ""
        if self.kept:
            lines.append(f"kept NCCL's settings: the search's plan would run {change}, a gain of {self.gain:.2%}, "
                         f"below --min-gain {self.min_gain:.2%}")
        elif not any(r.new != r.old for r in self.rows):
            lines.append("kept NCCL's settings: no plan the search tried ran faster")
        else:
            lines.append(f"tuned: {change}")
        a = self.autoccl
        if a is not None and a.step_ms > t.step_ms * 1.005:
            lines.append(f"AutoCCL's plan (each collective at its fastest): {a.step_ms:,.2f} ms, compute slowdown "
                         f"x{a.compute_slowdown:.3f}")
        return lines

    @property
    def rows_total_ms(self) -> tuple[float, float]:
        """The rows' collective times summed (NCCL's settings, tuned), those of the step's rank(s)
        only: the step's collectives (``collectives_ms``) count time where collectives overlap
        each other once, this sum as often as they overlap, and leaves out collectives no setting
        reaches (unknown size)."""
        own = [r for r in self.rows if r.in_total]
        return sum(r.old_ms for r in own), sum(r.new_ms for r in own)

    def to_dict(self) -> dict:
        old, new = self.rows_total_ms
        return {"nccl": self.nccl.to_dict(), "tuned": self.tuned.to_dict(),
                "autoccl": self.autoccl.to_dict() if self.autoccl else None, "kept": self.kept,
                "gain": round(self.gain, 5), "min_gain": self.min_gain, "why": self.why(),
                "rows": [r.to_dict() for r in self.rows], "rows_figures_of": self.figures_of,
                "rows_total": {"nccl_ms": round(old, 4), "tuned_ms": round(new, 4)}}


@dataclass(frozen=True)
class JobView:
    """A folder's ranks replayed jointly, as the table reads them: each rank's workload and the
    job's replay under NCCL's settings and under the tuned plan."""

    workloads: dict[int, Workload]
    baseline: JointTiming
    tuned: JointTiming
    gpus_per_node: int


def tune_report(outcome: TuneOutcome, workload: Workload, min_gain: float, job: JobView | None = None) -> TuneReport:
    nccl, tuned = plan_figures(outcome.baseline), plan_figures(outcome.result.timing)
    gain = nccl.step_ms / tuned.step_ms - 1.0 if tuned.step_ms > 0 else 0.0
    kept = bool(outcome.result.plan.entries) and gain < min_gain
    autoccl = plan_figures(outcome.autoccl.timing) if outcome.autoccl is not None else None
    cpu_only = bool(workload.collectives) and not workload.compute_ops and not any(c.on_gpu
                                                                                    for c in workload.collectives)
    rows = _rows(outcome, workload, kept)
    figures_of = f"rank {workload.rank}" if outcome.baseline.steps else ""
    if job is not None:
        rows = _job_rows(rows, job)
        slow = sorted(set(job.baseline.slowest))
        figures_of = (f"the job's step (its slowest rank{'s' if len(slow) > 1 else ''}: "
                      f"{', '.join(map(str, slow))})")
    return TuneReport(nccl, tuned, autoccl, kept, gain, min_gain, rows, cpu_only, figures_of)


def _job_rows(rows: list[SignatureRow], job: JobView) -> list[SignatureRow]:
    """The rows' figures from every rank (the module docstring): per job step kept, the
    signature's time on that step's slowest rank; a signature those ranks never ran, on the
    lowest rank that ran it. Settings, order and priority are the search's, as they were."""
    ids = {r: workload_signatures(w, job.gpus_per_node) for r, w in job.workloads.items()}
    base = _per_step(job.baseline, ids)
    tuned = _per_step(job.tuned, ids)
    out = []
    for row in rows:
        sig = row.signature
        old = base.get(sig)
        rank: int | None = None
        if old is None:  # not on the slowest rank of any step: the lowest rank that ran it
            rank = min((r for r, by in ids.items() if sig in by), default=None)
            if rank is None:
                out.append(row)
                continue
            old = _on_rank(job.baseline, ids, sig, rank)
            new = _on_rank(job.tuned, ids, sig, rank)
            if not old[2]:  # in no kept step: its time where it ran, once
                every = ids[rank][sig]
                old = (_time(job.baseline.ranks[rank], every), rank, every)
                new = (_time(job.tuned.ranks[rank], every), rank, every)
                row = replace(row, outside_steps=True)
        else:
            new = tuned.get(sig, (0.0, old[1], ()))
        r_old, r_new = old[1], new[1]
        w = job.workloads[r_old]
        b_t, t_t = job.baseline.ranks[r_old], job.tuned.ranks[r_new]
        measured = measured_slowdowns(w) if w.exec_graph is not None else None
        out.append(SignatureRow(
            signature=sig, old=row.old, new=row.new, kept=row.kept, old_ms=old[0] / 1e3, new_ms=new[0] / 1e3,
            old_slowdown=_slowdown(w, b_t, old[2]), new_slowdown=_slowdown(job.workloads[r_new], t_t, new[2]),
            measured_share=None if measured is None else _measured_share(w, b_t, old[2], measured),
            order=row.order, priority=row.priority, mechanism=row.mechanism, rank=rank,
            outside_steps=row.outside_steps))
    return out


def _step_ops(joint: JointTiming, rank: int, name: str) -> set[int]:
    """Op ids launched inside step ``name`` on ``rank`` (its joint replay's steps)."""
    t = joint.ranks[rank]
    if t.replay is None:
        return set()
    st = t.replay.static
    return {st.op_ids[k] for step in st.steps if step.name == name for k in step.op_index}


def _per_step(joint: JointTiming, ids: dict[int, dict[Signature, tuple[int, ...]]]
              ) -> dict[Signature, tuple[float, int, tuple[int, ...]]]:
    """signature -> (its time per job step on each step's slowest rank, us; the rank most of those
    steps were; that rank's op ids of it in the steps), for the signatures those ranks ran."""
    total: dict[Signature, float] = {}
    whose: dict[Signature, Counter] = {}
    ops: dict[tuple[Signature, int], list[int]] = {}
    n = max(1, len(joint.steps))
    for step, rank in zip(joint.steps, joint.slowest):
        launched = _step_ops(joint, rank, step.name)
        timing = joint.ranks[rank]
        for sig, op_ids in ids[rank].items():
            mine = [i for i in op_ids if i in launched]
            if not mine:
                continue
            total[sig] = total.get(sig, 0.0) + _time(timing, tuple(mine))
            whose.setdefault(sig, Counter())[rank] += 1
            ops.setdefault((sig, rank), []).extend(mine)
    out = {}
    for sig, t in total.items():
        rank = whose[sig].most_common(1)[0][0]
        out[sig] = (t / n, rank, tuple(ops[(sig, rank)]))
    return out


def _on_rank(joint: JointTiming, ids: dict[int, dict[Signature, tuple[int, ...]]], sig: Signature,
             rank: int) -> tuple[float, int, tuple[int, ...]]:
    """(its time per job step on ``rank``, us; ``rank``; the op ids): a signature no slowest rank ran."""
    n = max(1, len(joint.steps))
    mine: list[int] = []
    for step in joint.steps:
        launched = _step_ops(joint, rank, step.name)
        mine.extend(i for i in ids[rank].get(sig, ()) if i in launched)
    return _time(joint.ranks[rank], tuple(mine)) / n, rank, tuple(mine)


def _rows(outcome: TuneOutcome, workload: Workload, kept: bool) -> list[SignatureRow]:
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
    counted, per = _counted_ops(workload, outcome.baseline)
    measured = measured_slowdowns(workload) if workload.exec_graph is not None else None
    rows = []
    for sig in space.signatures:
        ids = tuple(i for i in space.collective_ids[sig] if counted is None or i in counted)
        outside = not ids and bool(space.collective_ids[sig])
        if outside:  # it ran only outside the kept steps: its time there, once (not 0 ms)
            ids, per_sig = space.collective_ids[sig], 1
        else:
            per_sig = per
        default = space.defaults.get(sig) or CommConfig()
        key = unit_of.get(sig)
        rows.append(SignatureRow(
            signature=sig, old=default, new=result.plan.config_for(sig).merged_over(default), kept=kept,
            old_ms=_time(outcome.baseline, ids) / per_sig / 1e3, new_ms=_time(result.timing, ids) / per_sig / 1e3,
            old_slowdown=_slowdown(workload, outcome.baseline, ids),
            new_slowdown=_slowdown(workload, result.timing, ids),
            measured_share=None if measured is None else _measured_share(workload, outcome.baseline, ids, measured),
            order=(result.order.index(key) + 1) if key in result.order else None,
            priority=last_h.get(key) if key else None,
            mechanism=space.mechanism(sig, PATH.get(result.plan.config_for(sig))), outside_steps=outside))
    return rows


def _counted_ops(workload: Workload, timing: Timing) -> tuple[set[int] | None, int]:
    """A trace's ops launched in its complete steps and how many steps; a generated workload: all, once."""
    if not timing.steps or timing.replay is None:
        return None, 1
    st = timing.replay.static
    counted = {st.op_ids[k] for step in st.steps for k in step.op_index}
    return counted, len(st.steps)


def _time(timing: Timing, ids: tuple[int, ...]) -> float:
    return sum(timing.ops[i].duration_us for i in ids if i in timing.ops)


def _overlapped(workload: Workload, timing: Timing, ids: tuple[int, ...]) -> list[tuple[int, float, float]]:
    """(op id, time, time alone) of each compute kernel these collectives overlap, at least
    :data:`MIN_ALONE_US` alone."""
    spans = CoverIndex(union((timing.ops[i].start_us, timing.ops[i].end_us) for i in ids if i in timing.ops))
    out = []
    for op in workload.compute_ops:
        t = timing.ops.get(op.op_id)
        if t is None or op.is_memory_op or spans.covered(t.start_us, t.end_us) <= 0:
            continue
        alone = timing.uncontended_us.get(op.op_id, op.duration_us)
        if alone >= MIN_ALONE_US:
            out.append((op.op_id, t.duration_us, alone))
    return out


def _measured_share(workload: Workload, timing: Timing, ids: tuple[int, ...],
                    measured: dict[int, float]) -> float | None:
    """Of the overlapped compute's time, the share whose slowdown the trace measured."""
    kernels = _overlapped(workload, timing, ids)
    total = sum(t for _, t, _ in kernels)
    return sum(t for i, t, _ in kernels if i in measured) / total if total > 0 else None


def _slowdown(workload: Workload, timing: Timing, ids: tuple[int, ...]) -> float:
    """The compute slowdown of the kernels these collectives overlap: their summed time over the
    same kernels' summed time alone (time-weighted, so long kernels weigh most; ``lagom analyze``'s
    contention table is the median of per-run ratios, which a few long, much slowed kernels do not
    move: the two differ by definition). A kernel whose time alone is under
    :data:`MIN_ALONE_US` is left out: the trace cannot time it, and a ratio over it is noise."""
    kernels = _overlapped(workload, timing, ids)
    contended, uncontended = sum(t for _, t, _ in kernels), sum(a for _, _, a in kernels)
    return contended / uncontended if uncontended > 0 else 1.0
