"""One figure, one value: lagom tune's why lines say only what its tables and --json say.

Over the bench's workloads (every cell of ``lagom bench --quick``'s matrix) and over
traces (the bundled A100 trace, a paired-trace generator's 2-channel FSDP step): the
bound named matches its definition on the printed figures, every number a why line
quotes is the figure of that name, the signature rows add up to at least the step's
collectives, the step table's means are the summary's figures, and lagom simulate
prints the same compute slowdown for the same plan.
"""

from __future__ import annotations

import json
import re

import kineto_world as kw
import pytest
from conftest import EXAMPLES, run_cli

from lagom.files.tuned_config import TunedConfig, load_tuned_config
from lagom.orchestration.bench_matrix import CLUSTERS, matrix_specs
from lagom.reports.tune_report import COMM_BOUND_FRACTION, IDLE_BOUND_FRACTION

CASES = [(spec, cluster) for cluster in CLUSTERS for spec in matrix_specs(quick=True)]


def _tune(capsys, tmp_path, workload: str, *extra: str) -> tuple[dict, list[str]]:
    out_file = tmp_path / "lagom.yaml"
    args = ["tune", workload, "--evaluator", "sim", "-o", str(out_file), "--force", *extra]
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    summary = json.loads(out)
    code, text, err = run_cli(capsys, *args)
    assert code == 0, err
    flat = " ".join(text.split())  # the console wraps long lines
    for line in summary["why"]:
        assert "why: " + " ".join(line.split()) in flat  # the text says what --json says
    return summary, summary["why"]


def _ms(x: float) -> str:
    return f"{x:,.2f}"


def check_consistent(summary: dict, why: list[str], written: TunedConfig) -> None:
    n, t = summary["nccl"], summary["tuned"]
    idle = n["step_ms"] - n["compute_ms"] - n["exposed_ms"]
    assert n["gpu_idle_ms"] == pytest.approx(max(0.0, idle), abs=1e-3)
    bound = ("idle-bound" if idle >= IDLE_BOUND_FRACTION * n["step_ms"] else
             "communication-bound" if n["exposed_ms"] >= COMM_BOUND_FRACTION * n["step_ms"] else "compute-bound")
    assert n["bound"] == bound
    text = " ".join(why)
    assert why[0].startswith(f"{bound}: under NCCL's settings a step is {_ms(n['step_ms'])} ms")
    for name in ("compute_ms", "exposed_ms", "gpu_idle_ms"):
        assert _ms(n[name]) in why[0]
    for other in ({"idle-bound", "communication-bound", "compute-bound"} - {bound}):
        assert other not in text  # no line names another bound than the table's
    changed = any(r["nccl"] != r["tuned"] for r in summary["rows"])
    if summary["kept"] or not changed:
        assert "kept NCCL's settings" in text and all(r["kept"] for r in summary["rows"] if changed)
        assert written.collectives == [] and not written.env  # the file carries nothing
    else:
        line = next(w for w in why if w.startswith("tuned: "))
        assert line.startswith(f"tuned: {_ms(t['step_ms'])} ms (x{n['step_ms'] / t['step_ms']:.3f})")
        assert f"slowdown x{n['compute_slowdown']:.3f} -> x{t['compute_slowdown']:.3f}" in line
        assert not any(r["kept"] for r in summary["rows"])
    assert summary["kept"] is (changed and summary["gain"] < summary["min_gain"])
    # the signatures add up to at least the step's collectives (their union)
    rows_ms = sum(r["nccl_ms"] for r in summary["rows"])
    assert rows_ms >= n["collectives_ms"] * 0.999 - 1e-3 or not summary["rows"]
    critical = n.get("critical_collectives_ms")
    if critical is not None:
        assert f"by {_ms(critical)} ms at most" in text
    if summary.get("steps"):
        steps = summary["steps"]
        assert n["step_ms"] == pytest.approx(sum(s["iteration_us"] for s in steps) / len(steps) / 1e3, rel=1e-4)
        assert t["step_ms"] == pytest.approx(sum(s["tuned_iteration_us"] for s in steps) / len(steps) / 1e3, rel=1e-4)
        assert critical == pytest.approx(sum(s["measured_critical_comm_us"] for s in steps) / len(steps) / 1e3,
                                         rel=1e-4)
    numbers = re.findall(r"\d[\d,]*\.\d+ ms", text)
    quoted = {_ms(v) + " ms" for fig in (n, t, summary.get("autoccl") or {}) for v in fig.values()
              if isinstance(v, float)}
    assert set(numbers) <= quoted  # every time a why line quotes is one of the figures


@pytest.mark.slow
@pytest.mark.parametrize("spec, cluster", CASES, ids=[f"{c}-{s}" for s, c in CASES])
def test_why_agrees_with_the_tables_on_the_bench_workloads(capsys, tmp_path, spec, cluster):
    summary, why = _tune(capsys, tmp_path, spec, "--cluster", cluster)
    check_consistent(summary, why, load_tuned_config(tmp_path / "lagom.yaml"))


@pytest.mark.parametrize("min_gain", ["0.01", "5"])
def test_why_agrees_with_the_tables_on_a_two_channel_trace(capsys, tmp_path, min_gain):
    first, _, _ = kw.paired(kw.SCENARIOS["mixed"], tmp_path, comm=1.0)
    summary, why = _tune(capsys, tmp_path, str(first), "--min-gain", min_gain)
    check_consistent(summary, why, load_tuned_config(tmp_path / "lagom.yaml"))
    assert summary["kept"] is (min_gain == "5")
    code, out, _ = run_cli(capsys, "simulate", str(first), "--json")
    assert code == 0
    assert json.loads(out)["compute_slowdown"] == pytest.approx(summary["nccl"]["compute_slowdown"], abs=1e-4)


def test_why_on_an_idle_bound_trace_says_idle_bound(capsys, tmp_path):
    summary, why = _tune(capsys, tmp_path, str(EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"))
    check_consistent(summary, why, load_tuned_config(tmp_path / "lagom.yaml"))
    assert summary["nccl"]["bound"] == "idle-bound"  # 78% of the GPU's time idle (HTA: 77.8%)
