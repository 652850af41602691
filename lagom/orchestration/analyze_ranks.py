"""``lagom analyze`` on a rank pool (lagom.orchestration.rank_pool): what a worker computes for one rank, and
what the parent puts together.

A worker trims its rank to the analysed span and runs :func:`lagom.reports.analyze_report.rank_report`
on it, as the in-process path does, and returns the report with the op ids of the span's
collectives. Only the wait/transfer split needs the other ranks: the parent computes it
from every rank's compact collectives (:func:`traces.comm_split.split_rows_compact`) and
fills the report's ``"wait_transfer"``, so the reports equal the in-process ones.
"""

from __future__ import annotations

import sys
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.cluster import ClusterSpec
from costmodel.replay.transfer_floor import transfer_floor
from lagom.args.rank_args import RankReading
from lagom.orchestration.rank_pool import RankPool
from lagom.reports.analyze_report import rank_report
from lagom.reports.replay_report import measured_steps
from nccl_env.errors import LagomError
from traces.comm_split import join_waits, rank_comm, split_rows_compact
from traces.exec_graph import WAIT_BASIS_FASTEST, WAIT_BASIS_RANKS
from traces.rank_join import MIN_PATTERN_INSTANCES, RankJoin, join_ranks
from traces.steps import trim_to_profiler_steps
from traces.workload import RecordedSteps, Workload


@dataclass
class AnalyzedRank:
    """One rank's report, less the wait/transfer split the parent fills in."""

    rank: int
    source: str
    report: dict
    span_ops: array[int] | None  # op ids of the analysed span's collectives; None: no execution graph, no split
    group_sizes: dict[str, int]  # of the span's collectives' groups
    view: Workload | None  # the analysed span, when asked for (--plot)
    recorded_steps: RecordedSteps | None  # lagom record's step times (the profiler's overhead)
    input_warnings: list[str] = field(default_factory=list)  # events the reader dropped (traces.kineto)
    cluster: ClusterSpec | None = None  # the lowest rank's: what bounds a thinly seen collective's transfer


def analysis_cluster(workload: Workload, cluster_arg: str | None) -> ClusterSpec | None:
    """The cluster that bounds the transfer of collectives seen too few times in partly recorded
    groups (costmodel.replay.transfer_floor): ``--cluster``, else the one ``lagom simulate``
    chooses for the trace; None where the trace names no GPU a cluster models (no bound)."""
    from lagom.orchestration.trace_context import resolve_cluster

    try:
        return resolve_cluster(workload, True, cluster_arg).cluster
    except LagomError:
        if cluster_arg is not None:
            raise
        return None


def bound_note(joined: RankJoin, rank: int, cluster: ClusterSpec | None, keep: set[int]) -> dict | None:
    """``"transfer_bound"`` of one rank's report: how many of its collective instances in the
    analysed span (op ids ``keep``) had their transfer bounded by the cluster, and the wait that
    left; None when none had."""
    ops = [op for op in joined.bounded.get(rank, {}) if op in keep]
    if cluster is None or not ops:
        return None
    return {"cluster": cluster.name, "instances": len(ops),
            "wait_us": round(sum(joined.wait_us[rank][op] for op in ops), 3), "min_instances": MIN_PATTERN_INSTANCES}


def analyze_rank(workload: Workload, lowest: bool, include_last_step: bool, top: int,
                 want_view: bool, cluster_arg: str | None = None) -> AnalyzedRank:
    """The worker's part for one rank (``want_view``: return the lowest rank's span for --plot)."""
    view = trim_to_profiler_steps(workload, include_last_step=include_last_step)
    report = rank_report(view, top_windows=top, trimmed=len(view.profiler_steps) < len(workload.profiler_steps))
    report["steps"] = measured_steps(workload)
    span_ops = array("q", (c.op_id for c in view.collectives)) if view.exec_graph is not None else None
    sizes = {c.group: view.group_size(c.group) for c in view.collectives}
    return AnalyzedRank(workload.rank, str(workload.source), report, span_ops, sizes,
                        view if lowest and want_view else None, workload.recorded_steps, workload.input_warnings,
                        analysis_cluster(workload, cluster_arg) if lowest else None)


def analyze_paths(paths: list[str], reading: RankReading, include_last_step: bool, top: int,
                  want_plot: bool, cluster_arg: str | None = None
                  ) -> tuple[list[dict], Workload | None, list[RecordedSteps | None]]:
    """The reports of every rank of ``paths`` (files given twice analysed once, with a warning),
    with ``want_plot`` the first rank's analysed span, and each rank's recorded step times."""
    reports: list[dict] = []
    recorded: list[RecordedSteps | None] = []
    seen: set[Path] = set()
    plot_view: Workload | None = None
    with RankPool(reading, preload=["lagom.orchestration.analyze_ranks"]) as pool:
        for i, path in enumerate(paths):
            job = pool.read_job(Path(path), analyze_rank, (include_last_step, top, want_plot and i == 0,
                                                           cluster_arg))
            cluster = next((v.cluster for v in job.values if v.cluster is not None), None)
            joined = job.join(transfer_floor(cluster) if cluster is not None else None)
            waits = job.waits()
            basis = WAIT_BASIS_RANKS if len(job.values) > 1 else WAIT_BASIS_FASTEST
            for k in sorted(range(len(job.values)), key=lambda k: job.layout.ranks[k]):
                ranked = job.values[k]
                source = Path(ranked.source).resolve()
                if source in seen:
                    print(f"warning: {ranked.source}: given more than once, analysed once", file=sys.stderr)
                    continue
                seen.add(source)
                for line in ranked.input_warnings:
                    print(f"warning: {line}", file=sys.stderr)
                if ranked.span_ops is not None:
                    whom = joined.waited_for.get(ranked.rank, {}) if len(job.values) > 1 else None  # peers read
                    span = set(ranked.span_ops)
                    rows = split_rows_compact(job.comms[k], waits[ranked.rank], span, basis, whom,
                                              joined.bounded.get(ranked.rank))
                    ranked.report["wait_transfer"] = [{**row.to_dict(), "group_size": ranked.group_sizes[row.group]}
                                                      for row in rows]
                    if len(job.values) > 1:
                        ranked.report["clock"] = {**clock_of(joined, ranked.rank)}
                    bound = bound_note(joined, ranked.rank, cluster, span)
                    if bound is not None:
                        ranked.report["transfer_bound"] = bound
                reports.append(ranked.report)
                recorded.append(ranked.recorded_steps)
                if plot_view is None and ranked.view is not None:
                    plot_view = ranked.view
    return reports, plot_view, recorded


def clock_of(joined: RankJoin, rank: int) -> dict:
    """One rank's clock as aligned to the lowest rank's (traces.rank_join) and the evidence."""
    a = joined.alignment
    return {"offset_us": round(a.offsets_us.get(rank, 0.0), 3), "residual_skew_us": round(a.residual_us, 3),
            "residual_skew_max_us": round(a.residual_max_us, 3), "matched_collectives": a.matched,
            "modelled_members": joined.modelled_members}


def add_joined_waits(reports: list[dict], workloads: list[Workload], views: list[Workload],
                     cluster: ClusterSpec | None = None) -> None:
    """The in-process path's reports (one per rank of one folder, in ``workloads``' order) given
    what :func:`analyze_paths` gives them: whom each key waited for, each rank's clock, and with
    a ``cluster`` the transfers it bounds."""
    if len(workloads) < 2 and cluster is None:
        return
    comms = [rank_comm(w) for w in workloads]
    joined = join_ranks(comms, max(w.world_size for w in workloads),
                        transfer_floor(cluster) if cluster is not None else None)
    waits = join_waits(comms, joined.wait_us)
    several = len(workloads) > 1
    for report, comm, view in zip(reports, comms, views):
        if view.exec_graph is None:
            continue
        span = {c.op_id for c in view.collectives}
        rows = split_rows_compact(comm, waits[comm.rank], span, WAIT_BASIS_RANKS if several else WAIT_BASIS_FASTEST,
                                  joined.waited_for.get(comm.rank, {}) if several else None,
                                  joined.bounded.get(comm.rank))
        report["wait_transfer"] = [{**row.to_dict(), "group_size": view.group_size(row.group)} for row in rows]
        if several:
            report["clock"] = clock_of(joined, comm.rank)
        bound = bound_note(joined, comm.rank, cluster, span)
        if bound is not None:
            report["transfer_bound"] = bound
