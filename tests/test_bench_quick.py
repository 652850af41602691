"""`lagom bench --quick` as CI regression.

Runs the real thing: the quick matrix (one FSDP, TP and EP workload on 8 GPUs of
low-bw and high-bw; one FSDP and one TP workload on h100-nvswitch at NCCL 2.30.7, where
paths are on offer), tuned with the default evaluator and judged on the simulator
with noise off. Per cell Lagom delivers what it owes (not behind NCCL, within 0.5% of
exhaustive, not behind Optuna at equal budget, bounded by the lower bound); per cluster
the geomeans stay above the regression floors in ``lagom.commands.bench``, and --check
agrees. A regression in the search, the space or the evaluators fails here.
"""

from __future__ import annotations

import json

import pytest

from lagom.cli import main
from lagom.commands import bench


@pytest.mark.slow  # eight cells, every method
def test_quick_bench_meets_the_targets(capsys):
    code = main(["bench", "--quick", "--json", "--check"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    cells, summary = report["cells"], report["summary"]
    assert {c["cluster"] for c in cells} == {"low-bw", "high-bw", "h100-nvswitch"}
    assert {c["strategy"] for c in cells} == {"fsdp", "tp", "ep"}
    assert {c["nccl_version"] for c in cells if c["cluster"] == "h100-nvswitch"} == {"2.30.7"}
    assert all(c["lagom_paths"] == {} for c in cells if c["cluster"] != "h100-nvswitch")  # 2.18.3: no paths
    for cell in cells:
        where = f"{cell['cluster']} {cell['workload']}"
        assert cell["speedup_vs_nccl"] >= bench.MIN_SPEEDUP_VS_NCCL_ANY_CELL, where
        assert cell["lagom_us"] >= cell["lower_bound_us"] * 0.999, where  # a bound is a bound
        assert cell["speedup_vs_optuna"] >= bench.MIN_SPEEDUP_VS_OPTUNA_ANY_CELL, where
        if cell["gap_to_exhaustive"] is not None:
            assert cell["gap_to_exhaustive"] <= bench.MAX_GAP_TO_EXHAUSTIVE, where
            share = cell["optimum_headroom_captured"]
            assert share is None or 0.0 <= share <= 1.0 + 1e-9, where  # the optimum bounds what Lagom gains
        assert cell["lagom_evaluations"] <= 40 * max(1, cell["units"]), where
    for name, c in summary["clusters"].items():
        assert c["geomean_speedup_vs_nccl"] >= bench.QUICK_FLOOR_GEOMEAN_VS_NCCL[name], name
        assert c["geomean_speedup_vs_autoccl"] >= bench.QUICK_FLOOR_GEOMEAN_VS_AUTOCCL[name], name
    assert summary["missed_targets"] == []


def test_bad_plot_path_is_refused_before_the_matrix_runs(tmp_path, capsys):
    for bad in (tmp_path / "missing" / "p.png", tmp_path, tmp_path / "p.foo"):
        assert main(["bench", "--quick", "--cluster", "low-bw", "--plot", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("lagom bench: error: --plot") and err.count("\n") == 1, err
