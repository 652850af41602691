"""What ``lagom analyze`` reports for one rank: assembled once, printed as JSON or rich tables.

:func:`rank_report` runs the stateless trace analyses on a trimmed Workload and returns
the plain dict that ``--json`` prints; :func:`render` turns the same dicts into tables.
"""

from __future__ import annotations

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from lagom.reports.console import mib
from lagom.reports.replay_report import measured_steps_table
from traces.breakdown import comm_comp_overlap_pct, temporal_breakdown
from traces.collectives_table import collectives_table
from traces.comm_split import split_rows
from traces.contention import contention_report
from traces.overlap import overlap_windows
from traces.workload import Workload


def rank_report(workload: Workload, top_windows: int = 5, trimmed: bool = False) -> dict:
    """The ``--json`` object of one rank; ``workload`` is the analysed view (see
    :func:`traces.steps.trim_to_profiler_steps`), ``trimmed`` says whether its last step was dropped."""
    overlap = comm_comp_overlap_pct(workload)
    breakdown = temporal_breakdown(workload)
    collectives = [
        {
            "collective": row.collective.value,
            "group_size": row.group_size,
            "message_bytes": row.message_bytes,
            "count": row.count,
            "total_us": round(row.total_us, 3),
            "exposed_us": round(row.exposed_us, 3),
            "on_gpu": row.on_gpu,
            "nccl_tunable": row.nccl_tunable,
            **({"path": row.recorded_path.value} if row.recorded_path is not None else {}),
        }
        for row in collectives_table(workload)
    ]
    types = {c.op_id: c.collective.value for c in workload.collectives}
    windows = [w for w in overlap_windows(workload) if w.compute_ids]
    windows.sort(key=lambda w: (-w.duration_us, w.start_us))
    window_rows = [
        {
            "start_us": round(w.start_us, 3),
            "end_us": round(w.end_us, 3),
            "duration_us": round(w.duration_us, 3),
            "collectives": len(w.collective_ids),
            "compute_ops": len(w.compute_ids),
            "collective_types": sorted({types[i] for i in w.collective_ids}),
        }
        for w in windows[:top_windows]
    ]
    contention = contention_report(workload)
    graph = workload.exec_graph
    split = [] if graph is None else split_rows(workload, graph.comm_wait_us, graph.wait_basis)
    return {
        "rank": workload.rank,
        "world_size": workload.world_size,
        "source": workload.source,
        "device": workload.device_name,
        "profiler_steps": len(workload.profiler_steps),
        "last_step_dropped": trimmed,
        "comm_comp_overlap_pct": None if overlap is None else round(overlap, 2),
        "idle_pct": round(breakdown.idle_pct, 2) if breakdown else None,
        "compute_pct": round(breakdown.compute_pct, 2) if breakdown else None,
        "non_compute_pct": round(breakdown.non_compute_pct, 2) if breakdown else None,
        "breakdown_basis": breakdown.basis if breakdown else None,
        "span_us": round(breakdown.span_us, 3) if breakdown else 0.0,
        "collectives": collectives,
        "windows": window_rows,
        "contention": [
            {"collective": f.collective, "median_slowdown": round(f.median_slowdown, 4), "pairs": f.pairs}
            for f in contention.figures
        ],
        "wait_transfer": [{**row.to_dict(), "group_size": workload.group_size(row.group)} for row in split],
    }


_GROUP_HEADER = "group ranks"  # both tables: how many ranks the process group has (not its name)


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render(reports: list[dict], console: Console) -> None:
    """Rich tables, one block per rank."""
    for r in reports:
        steps = "last (unfinished) step dropped, as HTA does" if r["last_step_dropped"] else "all of the trace"
        title = f"rank {r['rank']} of {r['world_size']}  ·  {r['source']}"
        if len(title) + 6 <= console.width:  # a rule cuts a long title with "…": such a one is a line of its own
            console.rule(f"[bold]rank {r['rank']}[/] of {r['world_size']}  ·  {escape(r['source'])}")
        else:
            console.print(f"[bold]rank {r['rank']}[/] of {r['world_size']}  ·  {escape(r['source'])}",
                          highlight=False)
        summary = Table(show_header=False, box=None, pad_edge=False)
        summary.add_column(style="bold")
        summary.add_column()
        summary.add_row("device", escape(r["device"] or "unknown"))
        periods = (f"; the steps' periods below, first op to the next step's, add to "
                   f"{sum(st['iteration_us'] for st in r['steps']) / 1e3:,.2f} ms" if r.get("steps") else "")
        summary.add_row("analysed", f"{_ms(r['span_us'])} ms (first op kept to last, as HTA spans it), "
                                    f"{r['profiler_steps']} profiler step(s), {steps}{periods}")
        overlap = r["comm_comp_overlap_pct"]
        summary.add_row(
            "comm/compute overlap",
            f"{_pct(overlap)} %" if overlap is not None else "n/a (no communication kernels)",
        )
        basis = "" if r["breakdown_basis"] != "cpu-collectives" else "  (no GPU kernels: over CPU-side collectives)"
        summary.add_row(
            "time breakdown",
            f"idle {_pct(r['idle_pct'])} %  ·  compute {_pct(r['compute_pct'])} %  ·  "
            f"non-compute {_pct(r['non_compute_pct'])} %{basis}",
        )
        console.print(summary)

        if r.get("steps"):
            console.print(measured_steps_table(r["steps"]))

        if r["collectives"]:
            t = Table(title="collectives", title_justify="left")
            columns: tuple[tuple[str, JustifyMethod], ...] = (
                ("type", "left"), (_GROUP_HEADER, "right"), ("message", "right"), ("count", "right"),
                ("total ms", "right"), ("exposed ms", "right"), ("exposed %", "right"))
            for col, justify in columns:
                t.add_column(col, justify=justify, no_wrap=True)
            for c in r["collectives"]:
                exposed_pct = 100.0 * c["exposed_us"] / c["total_us"] if c["total_us"] > 0 else 0.0
                kind = (c["collective"] + ("" if c["on_gpu"] else " (cpu)")
                        + ("" if c["nccl_tunable"] else " (not NCCL)")
                        + {"copy_engine": " (copy engines)", "symmetric": " (symmetric)"}.get(c.get("path", ""), ""))
                t.add_row(kind, str(c["group_size"]), mib(c["message_bytes"]), str(c["count"]),
                          _ms(c["total_us"]), _ms(c["exposed_us"]), f"{exposed_pct:.1f}")
            if len(r["collectives"]) > 1:  # summed: collectives that overlap each other count as often
                total = sum(c["total_us"] for c in r["collectives"])
                exposed = sum(c["exposed_us"] for c in r["collectives"])
                t.add_section()
                t.add_row("total", "", "", str(sum(c["count"] for c in r["collectives"])), _ms(total),
                          _ms(exposed), f"{100.0 * exposed / total if total > 0 else 0.0:.1f}")
            console.print(t)
        else:
            console.print("no collectives in the analysed span")

        if r.get("wait_transfer"):
            bases = sorted({c["basis"] for c in r["wait_transfer"]})  # one per rank: the graph's wait basis
            t = Table(title=f"NCCL kernel time: wait for the slowest peer ({', '.join(bases)}) + transfer "
                            "(the part that tunes)", title_justify="left")
            whom = any(c.get("waited_for", "-") != "-" for c in r["wait_transfer"])  # several ranks read
            for col in ("type", _GROUP_HEADER, "message", "count", "total ms", "wait ms", "transfer ms", "per call ms",
                        *(("waited for",) if whom else ())):
                t.add_column(col, justify="left" if col in ("type", "waited for") else "right", no_wrap=True)
            for c in r["wait_transfer"]:
                t.add_row(c["collective"], str(c["group_size"]), mib(c["message_bytes"]), str(c["count"]),
                          _ms(c["total_us"]), _ms(c["wait_us"]), _ms(c["transfer_us"]), _ms(c["transfer_per_call_us"]),
                          *((c["waited_for"],) if whom else ()))
            if len(r["wait_transfer"]) > 1:
                rows = r["wait_transfer"]
                t.add_section()
                t.add_row("total", "", "", str(sum(c["count"] for c in rows)),
                          *(_ms(sum(c[k] for c in rows)) for k in ("total_us", "wait_us", "transfer_us")), "",
                          *(("",) if whom else ()))
            console.print(t)
            clock = r.get("clock")
            if clock:
                console.print(f"clock: {clock['offset_us']:+.1f} us to the lowest rank's (aligned on "
                              f"{clock['matched_collectives']} matched collectives; residual skew median "
                              f"{clock['residual_skew_us']:.1f} us, max {clock['residual_skew_max_us']:.1f} us; "
                              f"{clock['modelled_members']} members of partly recorded groups modelled)")
            bound = r.get("transfer_bound")
            if bound:
                console.print(f"transfer bound: {bound['instances']} collective instances in groups with ranks not "
                              f"recorded were seen fewer than {bound['min_instances']} times (too few to read the "
                              f"unrecorded ranks' arrivals from): their transfer is the least time {bound['cluster']} "
                              f"allows under any NCCL setting, the rest ({bound['wait_us'] / 1e3:,.2f} ms) wait "
                              f"for ranks not recorded")

        if r["contention"]:
            t = Table(title="kernels beside a collective: duration over the same kernel's (name, launch shape) "
                            "median alone", title_justify="left")
            t.add_column("overlapping collective")
            t.add_column("median ratio", justify="right")
            t.add_column("kernel pairs", justify="right")
            for f in r["contention"]:
                t.add_row(f["collective"], f"{f['median_slowdown']:.3f}x", str(f["pairs"]))
            console.print(t)

        if r["windows"]:
            t = Table(title="largest overlap windows", title_justify="left")
            for col in ("start ms", "duration ms", "collectives", "compute ops", "types"):
                t.add_column(col, justify="left" if col == "types" else "right")
            for w in r["windows"]:
                t.add_row(_ms(w["start_us"]), _ms(w["duration_us"]), str(w["collectives"]), str(w["compute_ops"]),
                          ", ".join(w["collective_types"]))
            console.print(t)
