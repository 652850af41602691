"""A PNG timeline of one profiler step: one lane per GPU stream, overlap shaded.

Compute kernels are blue, memory copies grey, collectives orange (labelled with their
type when wide enough); the time where communication and computation both run is
shaded red across all lanes. The step shown is the one whose ops hold the most
communication time (ops belong to the step their CPU launch falls in).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from lagom.files.output_paths import save_figure  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402
from traces.breakdown import comm_comp_overlap_pct  # noqa: E402
from traces.intervals import intersection, union  # noqa: E402
from traces.workload import StreamKind, Workload  # noqa: E402

_COLORS = {StreamKind.COMPUTE: "#3b6fb6", StreamKind.MEMORY: "#8c8c8c", StreamKind.COMMUNICATION: "#e8812b"}
_OVERLAP = "#d62728"


def _step_ops(workload: Workload, start: float, end: float):
    def inside(op) -> bool:
        t = op.launch_us if op.launch_us is not None else op.start_us
        return start <= t < end

    return [o for o in workload.compute_ops if inside(o)], [c for c in workload.collectives if inside(c)]


def choose_step(workload: Workload) -> tuple[int | None, float, float]:
    """(step index or None, start, end) of the step with the most communication time."""
    best = None
    for i, (s, e) in enumerate(workload.profiler_steps):
        comp, colls = _step_ops(workload, s, e)
        if not comp and not colls:
            continue
        score = (sum(c.duration_us for c in colls), len(comp))
        if best is None or score > best[0]:
            best = (score, i, s, e)
    if best is None:
        return None, float("-inf"), float("inf")
    return best[1], best[2], best[3]


def plot_step(workload: Workload, path: str) -> None:
    """Write the timeline PNG to ``path``. LagomError if there is nothing to draw or it cannot be written."""
    index, s, e = choose_step(workload)
    comp, colls = _step_ops(workload, s, e)
    ops = [*comp, *colls]
    if not ops:
        raise LagomError(f"--plot {path}: no GPU ops or collectives in the analysed span to draw")
    t0 = min(o.start_us for o in ops)
    t1 = max(o.end_us for o in ops)
    kinds = {st.stream_id: st.kind for st in workload.streams}
    order = {StreamKind.COMPUTE: 0, StreamKind.MEMORY: 1, StreamKind.COMMUNICATION: 2}
    lanes = sorted({o.stream for o in ops}, key=lambda sid: (order[kinds.get(sid, StreamKind.COMPUTE)], sid))
    lane_of = {sid: i for i, sid in enumerate(lanes)}

    fig_h = 2.2 + 0.5 * (len(lanes) + 1)
    fig, ax = plt.subplots(figsize=(14, fig_h), dpi=110, layout="constrained")
    ms = lambda t: (t - t0) / 1000.0  # noqa: E731
    for sid in lanes:
        kind = kinds.get(sid, StreamKind.COMPUTE)
        spans = [(ms(o.start_us),
                  max(o.duration_us / 1000.0, (t1 - t0) / 1000.0 / 800)) for o in ops if o.stream == sid]
        # Collectives are long and can touch: a white edge keeps neighbours apart.
        edge = ("white", 0.8) if kind == StreamKind.COMMUNICATION else ("none", 0)
        ax.broken_barh(spans, (lane_of[sid] - 0.38, 0.76), facecolors=_COLORS[kind], edgecolor=edge[0],
                       linewidth=edge[1])
    span_ms = (t1 - t0) / 1000.0
    for c in colls:
        if c.duration_us / 1000.0 > span_ms / 25:
            ax.text(ms(c.start_us) + c.duration_us / 2000.0, lane_of[c.stream], c.collective.value,
                    ha="center", va="center", fontsize=8, color="white", fontweight="bold")
    comm_u = union((c.start_us, c.end_us) for c in colls if c.on_gpu)
    comp_u = union((o.start_us, o.end_us) for o in comp if not o.is_memory_op)
    both = intersection(comm_u, comp_u)
    overlap_lane = len(lanes)
    for lo, hi in both:
        ax.axvspan(ms(lo), ms(hi), color=_OVERLAP, alpha=0.15, lw=0)
    min_w = span_ms / 800
    ax.broken_barh([(ms(lo), max((hi - lo) / 1000.0, min_w)) for lo, hi in both], (overlap_lane - 0.38, 0.76),
                   facecolors=_OVERLAP, edgecolor="none")

    ax.set_yticks(range(len(lanes) + 1))
    names = {st.stream_id: st.name for st in workload.streams}
    labels = [f"{names.get(sid) or f'stream {sid}'} ({kinds.get(sid, StreamKind.COMPUTE).value})" for sid in lanes]
    ax.set_yticklabels(labels + ["comm + compute overlap"])
    ax.get_yticklabels()[-1].set_color(_OVERLAP)
    ax.set_ylim(-0.7, len(lanes) + 0.7)
    ax.invert_yaxis()
    ax.set_xlim(0, span_ms * 1.005)
    ax.set_xlabel("time in step (ms)")
    ax.grid(axis="x", color="#dddddd", lw=0.6)
    ax.set_axisbelow(True)
    step = f"profiler step {index + 1} of {len(workload.profiler_steps)}" if index is not None else "whole trace"
    overlap = comm_comp_overlap_pct(workload)
    overlap_txt = "n/a" if overlap is None else f"{overlap:.1f}%"
    ax.set_title(
        f"rank {workload.rank}: {step}, {span_ms:.2f} ms, {len(comp)} compute/memory ops, {len(colls)} collectives"
        f"  (trace comm/compute overlap {overlap_txt})",
        fontsize=10,
    )
    fig.legend(
        handles=[
            Patch(color=_COLORS[StreamKind.COMPUTE], label="compute kernel"),
            Patch(color=_COLORS[StreamKind.MEMORY], label="memcpy / memset"),
            Patch(color=_COLORS[StreamKind.COMMUNICATION], label="collective"),
            Patch(color=_OVERLAP, alpha=0.6, label="communication overlapped by compute"),
        ],
        loc="outside lower center",
        ncol=4,
        frameon=False,
        fontsize=9,
    )
    try:
        save_figure(fig, path, "--plot")
    finally:
        plt.close(fig)
