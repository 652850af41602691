"""Calibration against the simulator, and the calibrated model's accuracy on what it never saw.

Calibrated once per test session per cluster (module-scoped fixture): the simulator
with its default 1% noise, at most 300 measurements of tiny workloads. Judged at
zero simulator noise on generated workloads (paper models and a custom shape) with
NCCL's defaults and random settings, and on the ranking of candidate settings in
random overlap windows.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.analytic.params import default_params, param_spec
from costmodel.calibration.accuracy import (
    candidate_configs,
    compare_timings,
    compute_bound_windows,
    random_plan,
    ranking_gap,
    signatures_of,
    window_workload,
)
from costmodel.calibration.backend import SimBackend
from costmodel.calibration.calibrate import calibrate
from costmodel.cluster import load_cluster
from costmodel.sim.simulator import Simulator
from lagom.cli import main as lagom_main
from nccl_env.plan import Plan
from traces.generate import generate_workload

HELD_OUT = {
    "low-bw": ["fsdp:phi2:gpus=8", "ep:olmoe:ep=8", "fsdp:hidden=3072,layers=6,ffn=8192,heads=24,vocab=32000:gpus=16"],
    "high-bw": ["fsdp:phi2:gpus=8", "tp:phi2:tp=8,dp=1",
                "fsdp:hidden=3072,layers=6,ffn=8192,heads=24,vocab=32000:gpus=16"],
}


def _held_out(preset) -> list:
    """The workloads of ``preset``'s cluster that calibration never saw."""
    return [generate_workload(spec) for spec in HELD_OUT[preset.name]]


@pytest.fixture(scope="module", params=["low-bw", "high-bw"])
def calibrated(request):
    """Calibrated on the simulator (1% noise, <= 300 measurements), starting from every
    parameter off by up to -30%/+40%, so the fit has real work to do."""
    preset = load_cluster(request.param)
    rng = random.Random(3)
    start = {name: min(param_spec(name).upper, max(param_spec(name).lower, value * rng.uniform(0.7, 1.4)))
             for name, value in default_params(preset).items()}
    backend = SimBackend(preset)  # default noise ~1%
    result = calibrate(backend, budget=300, start=start)
    assert backend.measurements <= 300
    return preset, result


def test_calibrated_file_is_a_cluster_everywhere(calibrated, tmp_path, capsys):
    preset, result = calibrated
    path = tmp_path / "cluster.yaml"
    result.cluster.dump(path)
    loaded = load_cluster(path)
    assert loaded.model["fitted_from"] == f"sim:{preset.name}"
    assert loaded.sim == preset.sim  # the simulator still runs on the calibrated file
    ev = AnalyticEvaluator(loaded)
    for name, value in result.params.items():
        assert ev.params[name] == pytest.approx(value, rel=1e-5)
    # the fit explains the measurements to about their noise, far better than where it started
    assert result.report.mape_pct < 2.0
    assert result.report.default_mape_pct > 3 * result.report.mape_pct
    assert {r.term for r in result.report.residuals} >= {"overlap: compute", "overlap: collective", "channel sweep"}
    # the file drives `lagom simulate --evaluator analytic`, next to the simulator on the same file
    spec = "fsdp:hidden=1024,layers=4,ffn=4096,heads=16,vocab=8000:gpus=8"
    results = {}
    for evaluator in ("analytic", "sim"):
        assert lagom_main(["simulate", spec, "--cluster", str(path), "--evaluator", evaluator, "--noise", "0",
                           "--json"]) == 0
        results[evaluator] = json.loads(capsys.readouterr().out)
    assert results["analytic"]["evaluator"] == "analytic"
    for key in ("iteration_us", "compute_us", "comm_us"):
        assert results["analytic"][key] == pytest.approx(results["sim"][key], rel=0.05), key


def test_mape_against_the_simulator_on_held_out_workloads(calibrated):
    preset, result = calibrated
    rng = random.Random(7)
    cases = []
    for w in _held_out(preset):
        cases.append((w, Plan()))
        cases += [(w, random_plan(rng, w, preset)) for _ in range(2)]
    stats = compare_timings(AnalyticEvaluator(result.cluster), Simulator(preset, noise=0.0), cases)
    report = {k: round(s.mape_pct, 2) for k, s in stats.items()}
    print(f"{preset.name} MAPE %: {report}")
    for key in ("iteration", "compute", "collective"):
        assert stats[key].mape_pct <= 5.0, (preset.name, report)


def test_ranking_of_settings_in_random_overlap_windows(calibrated):
    preset, result = calibrated
    rng = random.Random(11)
    windows = [(w, win) for w in _held_out(preset) for win in compute_bound_windows(w)]
    rng.shuffle(windows)
    model = AnalyticEvaluator(result.cluster)
    truth = Simulator(preset, noise=0.0)
    gaps = []
    for w, win in windows[:20]:
        sub = window_workload(w, win)
        sig = signatures_of(sub, preset)[0]
        gaps.append(ranking_gap(model, truth, sub, preset, candidate_configs(rng, sig, 10)).gap_pct)
    print(f"{preset.name} ranking gaps %: {[round(g, 2) for g in gaps]}")
    assert len(gaps) == 20
    assert max(gaps) <= 2.0


def test_analytic_is_ten_times_faster_than_the_simulator():
    cluster = load_cluster("low-bw")
    w = generate_workload("fsdp:llama3-8b:gpus=16")
    rng = random.Random(0)
    sigs = signatures_of(w, cluster)
    plans = [Plan()] + [random_plan(rng, w, cluster) for _ in range(3)]
    analytic, sim = AnalyticEvaluator(cluster), Simulator(cluster, noise=0.0)
    analytic.evaluate(w, plans[0])  # builds the static data once, as the tuner's first call does
    sim.evaluate(w, plans[0])

    def best_of(ev, n):
        best = float("inf")
        for _ in range(n):
            t0 = time.perf_counter()
            for p in plans:
                ev.evaluate(w, p)
            best = min(best, time.perf_counter() - t0)
        return best

    assert len(sigs) >= 2
    ratio = best_of(sim, 3) / best_of(analytic, 5)  # best of several: the suite runs on two workers
    print(f"simulator / analytic time per evaluation: {ratio:.1f}x")
    assert ratio >= 10.0


def test_calibrate_cli_writes_a_cluster_and_reports_terms(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert lagom_main(["calibrate", "--backend", "sim:high-bw", "-o", str(out), "--measurements", "40"]) == 0
    text = capsys.readouterr().out
    assert "overlap: compute" in text and "fitted parameters" in text
    assert load_cluster(out).model["fitted_from"] == "sim:high-bw"
    assert lagom_main(["calibrate", "--backend", "nope", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown calibration backend" in err
    assert lagom_main(["calibrate", "--backend", "sim:low-bw", "-o", str(out), "--measurements", "5"]) == 2
    assert lagom_main(["calibrate", "--backend", "sim:no-such-preset", "-o", str(out)]) == 2


def test_calibrate_takes_nccl_version_as_every_command_does(tmp_path, capsys):
    """Issue 31: calibrate took --cluster but not --nccl-version. The written cluster runs the
    version given; a version NCCL never released is one line, before measuring."""
    out = tmp_path / "c.yaml"
    argv = ["calibrate", "--backend", "sim:low-bw", "--measurements", "20", "-o", str(out)]
    assert lagom_main([*argv, "--nccl-version", "2.21.5", "--json"]) == 0
    assert str(load_cluster(out).nccl_version) == "2.21.5" != str(load_cluster("low-bw").nccl_version)
    capsys.readouterr()
    out.unlink()
    assert lagom_main([*argv, "--nccl-version", "2.18"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lagom calibrate: error: --nccl-version '2.18': NCCL never released") and \
        err.count("\n") == 1, err
    assert not out.exists()


def test_calibrate_refuses_unwritable_outputs_before_measuring(tmp_path, capsys):
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    bad = [
        ["-o", str(tmp_path / "missing" / "c.yaml")],
        ["-o", str(tmp_path)],  # a folder
        ["-o", str(a_file / "c.yaml")],  # under a file
        ["-o", str(tmp_path / "c.yaml"), "--dump-measurements", str(tmp_path / "missing" / "m.json")],
    ]
    for extra in bad:
        code = lagom_main(["calibrate", "--backend", "sim:low-bw", "--measurements", "20", *extra])
        err = capsys.readouterr().err
        assert code == 2, extra
        assert err.startswith("lagom calibrate: error:") and err.count("\n") == 1, err
    assert not (tmp_path / "c.yaml").exists()
