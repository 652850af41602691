"""bench/fidelity_ceiling.py: the sweep of the contention mechanism's constants runs the real
fidelity runner (its default point gives bench/fidelity.py's verdicts) and its overrides reach
every simulator the runner builds, the stand-in workloads' included."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from costmodel.cluster import load_cluster
from costmodel.sim.published_cases import FidelityRunner, load_cases

CLI = REPO_ROOT / "bench" / "fidelity_ceiling.py"
FIDELITY = REPO_ROOT / "bench" / "fidelity.py"
CONTENTION = REPO_ROOT / "tests" / "data" / "fidelity" / "contention.json"
ARXIV = "arxiv2507.03114-overlap-compute-slowdown-a100-h100-mi250-mi210"


def _module():
    spec = importlib.util.spec_from_file_location("bench_fidelity_ceiling", CLI)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_a_three_point_sweep_reports_every_checking_case_and_reproduces_the_runner(capsys):
    ceiling = _module()
    assert ceiling.main(["--samples", "2", "--no-coordinate-sweep", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["points"] == 3 and len(out["grid"]) == 3
    assert [p["origin"] for p in out["grid"]] == ["default", "sample", "sample"]
    assert out["grid"][0]["constants"] == {}
    assert all(set(p["constants"]) == {c.name for c in ceiling.CONSTANTS} for p in out["grid"][1:])
    assert out["admissible"] == sum(p["admissible"] for p in out["grid"])

    fidelity = subprocess.run([sys.executable, str(FIDELITY), str(CONTENTION), "--json"], capture_output=True,
                              text=True, timeout=300)
    assert fidelity.returncode in (0, 1), fidelity.stderr
    runner_cases = json.loads(fidelity.stdout)["cases"]
    # the sweep's default point is bench/fidelity.py, case for case
    assert out["default_verdicts"] == {c["id"]: c["holds"] for c in runner_cases}
    checking = [c["id"] for c in runner_cases if c["split"] == "check" and c["holds"] is not None]
    fitting = [c["id"] for c in runner_cases if c["split"] == "fit" and c["holds"] is not None]
    assert [c["id"] for c in out["cases"]] == checking
    assert out["check"]["judged"] == len(checking) and out["fit"]["judged"] == len(fitting)
    assert out["grid"][0]["check_held"] == out["check"]["held_default"] == sum(
        c["holds"] is True for c in runner_cases if c["id"] in checking)
    assert out["grid"][0]["fit_held"] == out["fit"]["held_default"]
    assert out["check"]["target"] == -(-8 * len(checking) // 10)  # 80%, rounded up
    assert set(out["not_judged"]) == {c["id"] for c in runner_cases if c["holds"] is None}
    # the anchors: the two in the contention file, then every case of paths.json and published.json
    assert out["anchors"][:2] == [
        "h100x8-gemm8192-fp16-ag64MiBshard-nccl-vs-zerocta-pr172714", ARXIV]
    assert "h100x8-matmul-allgather-copy-engine" in out["anchors"]
    assert "a100x8-allreduce-64MiB-ring-simple-channels" in out["anchors"]
    assert out["grid"][0]["anchors_hold"] and out["grid"][0]["admissible"]
    for case in out["cases"]:
        assert 0 <= case["holds_at"] <= out["admissible"] and case["holds_at"] <= case["holds_at_any"] <= 3
        near = case["closest"]
        assert near["holds"] == (near["distance"] == 0.0)
        if not near["holds"]:  # a miss says by how much and which way
            assert near["direction"] == ("model high" if near["error"] > 0 else "model low")
            assert abs(near["error"]) == pytest.approx(near["distance"], abs=1e-4)
    free = out["check"]["best_point_unconstrained"]
    assert free["held"] == max(p["check_held"] for p in out["grid"]) >= out["check"]["held_default"]
    assert set(out["check"]["held_anywhere"]) <= set(out["check"]["held_anywhere_unconstrained"])
    assert out["grid"][0]["check_holding"] == [c for c in checking if out["default_verdicts"][c]]
    assert set(out["never_hold"]) == {c["id"] for c in out["cases"] if c["holds_at"] == 0}
    assert ceiling.table(out).count("\n") >= len(checking) + 6  # the table renders the same object


def test_overrides_reach_the_presets_and_the_stand_ins_simulators():
    ceiling = _module()
    h100, a100 = load_cluster("h100-nvswitch"), load_cluster("a100-nvswitch")
    faster_link = ceiling.cluster_for(ceiling.Point((("intra_node.bw_gb_per_s", 1.2),)))
    assert faster_link(h100).intra_node.bw_gb_per_s == pytest.approx(380.0 * 1.2)
    assert faster_link(h100).intra_node.copy_engine_bw == pytest.approx(350.0)  # its own figure, unscaled
    assert faster_link(a100).intra_node.copy_engine_bw == pytest.approx(240.0)  # had none: the link's, unscaled
    charged = ceiling.cluster_for(ceiling.Point((("mem_efficiency", 0.8), ("launch_us", 20.0))))
    assert charged(h100).sim["mem_efficiency"] == 0.8 and charged(h100).sim["launch_us"] == 20.0
    assert h100.sim["mem_efficiency"] == 0.9  # the preset itself is not changed
    assert ceiling.cluster_for(ceiling.Point())(h100) == h100

    case = next(c for c in load_cases(CONTENTION) if c.id == ARXIV)  # its workloads run on runner.simulator
    default = FidelityRunner().run(case).model["slowdown_mean"]
    assert FidelityRunner(cluster_for=ceiling.cluster_for(ceiling.Point())).run(case).model["slowdown_mean"] == default
    # a whole chunk of FIFO per channel in L2 (the value before issue 23's fit): the kernels beside slow down
    whole_chunk = ceiling.Point((("fifo_resident_chunks", 1.0),))
    assert FidelityRunner(cluster_for=ceiling.cluster_for(whole_chunk)).run(case).model["slowdown_mean"] > default + 0.1


def test_the_grid_is_seeded_and_distinct():
    ceiling = _module()
    one, two = ceiling.grid(30, 5), ceiling.grid(30, 5)
    assert one == two and one[0] == ceiling.Point()
    samples = [p for p in one if p.origin == "sample"]
    assert len(samples) == 30 and len(set(samples)) == 30
    coordinate = [p for p in one if p.origin == "coordinate"]
    assert len(coordinate) == sum(len(c.levels) - (c.default in c.levels) for c in ceiling.CONSTANTS)
    assert ceiling.grid(30, 6) != one


def test_a_file_without_a_checking_set_is_one_line_and_exit_2(capsys):
    ceiling = _module()
    published = str(REPO_ROOT / "tests" / "data" / "fidelity" / "published.json")
    assert ceiling.main([published, "--samples", "0", "--no-coordinate-sweep"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no case has split 'check'" in err
