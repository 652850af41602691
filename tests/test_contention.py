"""Contention seen in a trace: a constructed trace with a known slowdown, and the shared traces."""

from __future__ import annotations

import statistics

import pytest
from conftest import trace_path
from kineto_builder import TraceBuilder

from traces.contention import contention_report
from traces.kineto import read_trace

AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
BC = "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


def _known_slowdown_trace(tmp_path):
    b = TraceBuilder()
    t = 0.0
    for dur in (96, 98, 99, 100, 100, 101, 102, 104, 100):  # alone: median 100 us
        b.kernel("gemm", 7, t, dur)
        t += 300
    b.kernel(AR, 20, t, 6 * 300)  # six gemms under an allreduce: 1.3x
    for dur in (126, 128, 130, 130, 132, 134):
        b.kernel("gemm", 7, t + 10, dur)
        t += 300
    t += 500
    b.kernel(BC, 20, t, 4 * 300)  # four under a broadcast: 1.5x
    for dur in (148, 150, 150, 152):
        b.kernel("gemm", 7, t + 10, dur)
        t += 300
    b.kernel("gemm", 7, t + 1000, 80, grid=(54, 1, 1))  # another launch shape, never overlapped
    b.kernel("relu", 7, 300 * 9 + 250, 20)  # overlapped, never alone: no reference
    b.kernel("Memcpy DtoD (Device -> Device)", 8, 300 * 9 + 50, 40, cat="gpu_memcpy")
    (w,) = read_trace(b.write(tmp_path / "contention.json"))
    return w


def test_known_slowdown_per_collective_type(tmp_path):
    w = _known_slowdown_trace(tmp_path)
    report = contention_report(w)
    assert report.figure("allreduce").median_slowdown == pytest.approx(1.30)
    assert report.figure("allreduce").pairs == 6
    assert report.figure("broadcast").median_slowdown == pytest.approx(1.50)
    assert report.figure("broadcast").pairs == 4
    assert report.figure("all").pairs == 10
    # pooled ratios 1.26 .. 1.34 and 1.48 .. 1.52: the middle two are 1.32 and 1.34
    assert report.figure("all").median_slowdown == pytest.approx(1.33)
    assert report.kernel_shapes == 1


def test_shared_trace_matches_a_brute_force_count():
    (w,) = read_trace(trace_path("a100_w2_allreduce_broadcast.json.gz"))
    colls = [c for c in w.collectives if c.on_gpu]
    alone: dict = {}
    under: list = []
    for op in w.compute_ops:
        if op.is_memory_op:
            continue
        hit = [c for c in colls if min(c.end_us, op.end_us) - max(c.start_us, op.start_us) > 0]
        key = (op.name, op.grid, op.block)
        if hit:
            under.append((op, key))
        else:
            alone.setdefault(key, []).append(op.duration_us)
    ratios = [op.duration_us / statistics.median(alone[key]) for op, key in under if key in alone]
    report = contention_report(w)
    overall = report.figure("all")
    assert overall.pairs == len(ratios) > 50
    assert overall.median_slowdown == pytest.approx(statistics.median(ratios))
    # Only allreduce kernels overlap compute in this trace (the broadcasts run alone).
    assert [f.collective for f in report.figures] == ["all", "allreduce"]
    assert overall.median_slowdown > 1.0


def test_interval_helpers():
    from traces.intervals import CoverIndex, intersection, union

    merged = union([(5, 7), (0, 2), (2, 3), (6, 9)])
    assert merged == [(0, 3), (5, 9)]
    assert intersection(merged, [(1, 6), (8, 20)]) == [(1, 3), (5, 6), (8, 9)]
    cover = CoverIndex(merged)
    assert cover.covered(-1, 100) == 7 and cover.covered(2.5, 5.5) == 1.0 and cover.covered(3, 5) == 0


def test_covered_many_is_covered_to_the_last_digit():
    """The array form of CoverIndex.covered (contention's classification of every kernel at once) gives
    each interval the very number covered gives it: intervals meeting no span, one, several, touching."""
    import numpy as np

    from traces.intervals import CoverIndex, union

    rng = np.random.default_rng(7)
    starts = rng.uniform(0, 1000, 300)
    spans = union(zip(starts.tolist(), (starts + rng.exponential(3.0, 300)).tolist()))
    cover = CoverIndex(spans)
    a = np.concatenate([rng.uniform(-10, 1010, 3000), [s for s, _ in spans[:20]], [e for _, e in spans[:20]]])
    b = a + np.concatenate([rng.exponential(2.0, 1500), rng.exponential(40.0, 1500), np.zeros(20), np.ones(20)])
    b[:50] = a[:50] - 1  # empty intervals
    many = cover.covered_many(a, b)
    one = [cover.covered(s, e) for s, e in zip(a.tolist(), b.tolist())]
    assert many.tolist() == one
    s_arr, e_arr = np.array(spans).T
    meets = ((s_arr[None, :] < b[:, None]) & (e_arr[None, :] > a[:, None])).sum(axis=1)
    assert (meets == 1).sum() > 500 and (meets > 1).sum() > 20  # both paths of covered_many ran
    assert CoverIndex([]).covered_many(a, b).tolist() == [0.0] * len(a)
