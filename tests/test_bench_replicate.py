"""The large trace bench/analyze_vs_hta.py builds is a real trace's steps, replicated."""

from __future__ import annotations

import importlib.util

from conftest import REPO_ROOT, trace_path

from traces.kineto import read_trace


def test_replicated_trace_holds_the_steps_n_times(tmp_path):
    spec = importlib.util.spec_from_file_location("analyze_vs_hta", REPO_ROOT / "bench" / "analyze_vs_hta.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    source = trace_path("w128_sendrecv_rank0.json.gz")
    copies, size = bench.build_large_trace(source, tmp_path / "big.json", 3_000_000)
    assert copies == 2 and size >= 3_000_000
    (one,) = read_trace(source)
    (big,) = read_trace(tmp_path / "big.json")
    assert len(big.profiler_steps) == copies * len(one.profiler_steps)
    assert len(big.collectives) == copies * len(one.collectives)
    assert len(big.compute_ops) == copies * len(one.compute_ops)
    # The copies follow each other: the second starts after the first ends.
    half = len(big.collectives) // 2
    assert big.collectives[half].start_us > big.collectives[half - 1].end_us
