"""`lagom tune` end to end on generated workloads and the real simulator."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, run_cli

from costmodel.cluster import load_cluster
from costmodel.sim.simulator import Simulator
from lagom.files.tuned_config import load_tuned_config
from nccl_env.knobs import CollectiveType
from nccl_env.plan import Plan
from nccl_env.rules import NcclVersion
from traces.generate import generate_workload
from tuner.space import workload_signatures


def test_tune_writes_a_file_that_reproduces_its_prediction(tmp_path, capsys):
    spec = "fsdp:phi2:gpus=8"
    out_file = tmp_path / "lagom.yaml"
    code, out, err = run_cli(capsys, "tune", spec, "--cluster", "high-bw", "--evaluator", "sim", "-o", str(out_file),
                             "--json")
    assert code == 0, err
    summary = json.loads(out)
    for key in ("baseline_us", "tuned_us", "autoccl_us", "speedup_vs_nccl", "speedup_vs_autoccl", "evaluations"):
        assert key in summary
    assert summary["tuned_us"] <= summary["baseline_us"]  # the guard
    assert math.isclose(summary["speedup_vs_nccl"], summary["baseline_us"] / summary["tuned_us"], rel_tol=1e-3)
    config = load_tuned_config(out_file)
    assert config.method == "lagom" and config.nccl_version == load_cluster("high-bw").nccl_version
    assert config.predictions["tuned_us"] == pytest.approx(summary["tuned_us"], rel=1e-6)
    # the file, applied to the same workload on the same (noise-free) simulator, gives the prediction
    cluster = load_cluster("high-bw")
    workload = generate_workload(spec)
    plan = config.to_plan(workload_signatures(workload, cluster.gpus_per_node))
    again = Simulator(cluster, noise=0.0).evaluate(workload, plan)
    assert again.iteration_us == pytest.approx(summary["tuned_us"], rel=1e-6)
    assert len(summary["rows"]) == summary["signatures"] >= 1


def test_tune_table_names_every_signature(tmp_path, capsys):
    code, out, err = run_cli(capsys, "tune", "tp:phi2:tp=8,dp=1", "--cluster", "low-bw", "--evaluator", "sim",
                             "-o", str(tmp_path / "t.yaml"), "--no-autoccl")
    assert code == 0, err
    workload = generate_workload("tp:phi2:tp=8,dp=1")
    for sig in workload_signatures(workload, 8):
        assert sig.collective.value in out
    assert "predicted per iteration: NCCL's settings" in out and "evaluations" in out


def test_bad_input_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(capsys, "tune", "fsdp:phi2:gpus=8", "--cluster", "no-such-cluster", "-o",
                           str(tmp_path / "x.yaml"))
    assert code == 2 and err.startswith("lagom tune: error:") and err.count("\n") == 1
    code, _, err = run_cli(capsys, "tune", str(tmp_path / "missing.json"), "--cluster", "low-bw", "-o",
                           str(tmp_path / "x.yaml"))
    assert code == 2 and err.count("\n") == 1


def test_every_method_runs_from_the_cli(tmp_path, capsys):
    results = {}
    for method in ("nccl", "lagom", "autoccl", "optuna"):
        code, out, err = run_cli(capsys, "tune", "ep:olmoe:ep=8", "--cluster", "low-bw", "--evaluator", "sim",
                                 "--method", method, "--budget", "40", "--no-autoccl", "-o",
                                 str(tmp_path / f"{method}.yaml"), "--json")
        assert code == 0, err
        results[method] = json.loads(out)
    assert results["nccl"]["tuned_us"] == pytest.approx(results["nccl"]["baseline_us"])
    assert results["lagom"]["tuned_us"] <= results["nccl"]["tuned_us"]
    assert all(r["evaluations_by_method"][m] <= 40 for m, r in results.items())  # --budget caps the method
    cluster = load_cluster("low-bw")
    default = Simulator(cluster, noise=0.0).evaluate(generate_workload("ep:olmoe:ep=8"), Plan())
    assert results["nccl"]["baseline_us"] == pytest.approx(default.iteration_us)


def test_default_evaluator_is_the_calibrated_model_and_its_plan_holds_on_the_simulator(tmp_path, capsys):
    spec = "tp:phi2:tp=8,dp=1"
    code, out, err = run_cli(capsys, "tune", spec, "--cluster", "low-bw", "--no-autoccl", "-o",
                             str(tmp_path / "a.yaml"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["evaluator"] == "analytic"
    assert summary["tuned_us"] < summary["baseline_us"]
    # judged on the simulator, the model's plan still beats NCCL's default
    cluster = load_cluster("low-bw")
    workload = generate_workload(spec)
    plan = load_tuned_config(tmp_path / "a.yaml").to_plan(workload_signatures(workload, cluster.gpus_per_node))
    sim = Simulator(cluster, noise=0.0)
    assert sim.evaluate(workload, plan).iteration_us < sim.evaluate(workload, Plan()).iteration_us


def test_bad_budget_and_output_are_one_line_errors(tmp_path, capsys):
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    cases = [
        ["--budget", "0", "-o", str(tmp_path / "x.yaml")],
        ["--budget", "-3", "-o", str(tmp_path / "x.yaml")],
        ["-o", str(tmp_path / "missing" / "x.yaml")],
        ["-o", str(tmp_path)],
        ["-o", str(a_file / "x.yaml")],
    ]
    for extra in cases:
        code, _, err = run_cli(capsys, "tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--evaluator", "sim", *extra)
        assert code == 2, extra
        assert err.startswith("lagom tune: error:") and err.count("\n") == 1, err


def test_budget_of_one_keeps_nccl_default(tmp_path, capsys):
    # the guard's evaluation of NCCL's default uses the only evaluation: the result is that default
    code, out, err = run_cli(capsys, "tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--evaluator", "sim",
                             "--budget", "1", "--no-autoccl", "-o", str(tmp_path / "x.yaml"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["evaluations"] == 1 and summary["tuned_us"] == summary["baseline_us"]
    assert load_tuned_config(tmp_path / "x.yaml").collectives == []


def test_unusable_cache_dir_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(a_file))
    code, _, err = run_cli(capsys, "tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--evaluator", "analytic",
                           "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and err.startswith("lagom tune: error: LAGOM_CACHE_DIR=") and err.count("\n") == 1, err


def test_tune_warns_once_about_a_job_wider_than_the_cluster(tmp_path, capsys):
    code, out, err = run_cli(capsys, "tune", "fsdp:phi2:gpus=32", "--cluster", "low-bw", "--evaluator", "sim",
                             "--budget", "1", "--no-autoccl", "-o", str(tmp_path / "x.yaml"), "--json")
    assert code == 0, err
    assert json.loads(out)["evaluations"] == 1
    assert err.count("warning:") == 1 and "process group of 32 ranks but low-bw has 16 GPUs" in err


def test_tune_says_why_in_numbers_from_its_own_timings(tmp_path, capsys):
    """Compute-bound FSDP Phi-2 on high-bw: the gain is contention removed; FSDP Llama-3-8B
    on 16 low-bw GPUs: communication-bound, the NIC decides."""
    cluster = load_cluster("high-bw")
    workload = generate_workload("fsdp:phi2:gpus=8")
    base = Simulator(cluster).evaluate(workload, Plan())
    code, out, err = run_cli(capsys, "tune", "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--evaluator", "sim",
                             "-o", str(tmp_path / "a.yaml"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    why = summary["why"]
    assert why[0].startswith("compute-bound") and summary["nccl"]["bound"] == "compute-bound"
    tuned_line = next(line for line in why if line.startswith("tuned: "))
    assert f"(slowdown x{base.compute_slowdown:.3f} -> " in tuned_line  # the gain is contention removed
    assert summary["tuned"]["compute_slowdown"] < base.compute_slowdown
    assert any(line.startswith("AutoCCL's plan") for line in why)  # AutoCCL loses here
    code, out, err = run_cli(capsys, "tune", "fsdp:llama3-8b:gpus=16", "--cluster", "low-bw", "--evaluator", "sim",
                             "--no-autoccl", "-o", str(tmp_path / "b.yaml"))
    assert code == 0, err
    assert "why: communication-bound:" in out


@pytest.mark.slow
def test_readme_setup_command_tunes_the_bundled_trace(tmp_path):
    # The README's first set-up command ends in a `lagom tune` of a bundled trace: run that
    # part as the README writes it (as `python -m lagom`), in a scratch folder for lagom.yaml.
    readme = (REPO_ROOT / "README.md").read_text()
    setup = re.search(r"```bash\n(pip install [^\n]+)\n", readme)
    assert setup is not None, "the README's set-up block starts with a pip install line"
    command = setup.group(1).split("&&", 1)[1].split()
    assert command[:2] == ["lagom", "tune"]
    args = [str(REPO_ROOT / a) if (REPO_ROOT / a).exists() else a for a in command[1:]]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lagom", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # its first line says plainly why this trace has nothing to gain (README: and points at one that has)
    assert lines[0].startswith("why: idle-bound: under NCCL's settings a step is"), lines[0]
    flat = " ".join(proc.stdout.split())
    assert "nothing for NCCL's settings to gain here" in flat
    assert "the model reproduces 2 steps of this trace within 0.0%" in flat
    config = load_tuned_config(tmp_path / "lagom.yaml")
    assert str(config.nccl_version) == "2.17.1"  # the trace's own NCCL, not the preset's 2.18.3
    pointer = re.search(r"`lagom tune (traces/examples/\S+)`", readme)
    assert pointer is not None, "the README points at a bundled trace that has something to gain"
    proc = subprocess.run([sys.executable, "-m", "lagom", "tune", str(REPO_ROOT / pointer.group(1)), "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["speedup_vs_nccl"] >= 1.05 and not summary["kept"]  # item 6: x1.05 or more on the 2-channel case


def test_evaluations_count_every_evaluation_tune_ran_the_comparison_included(tmp_path, capsys):
    """The AutoCCL comparison's evaluations count too; a plan Lagom already measured is not run again."""
    from costmodel.sim import Simulator as Sim
    from lagom.orchestration import tuning

    cluster = load_cluster("low-bw")
    workload = generate_workload("ep:olmoe:ep=8")
    counted = Sim(cluster, noise=0.0)
    outcome = tuning.tune(workload, cluster, counted)
    assert outcome.evaluations_run == counted.evaluations  # every evaluation the evaluator served
    assert outcome.autoccl is not None
    lagom_runs, autoccl_runs = outcome.result.evaluations, outcome.autoccl.evaluations
    assert lagom_runs < outcome.evaluations_run <= lagom_runs + autoccl_runs
    code, out, err = run_cli(capsys, "tune", "ep:olmoe:ep=8", "--cluster", "low-bw", "--evaluator", "sim",
                             "-o", str(tmp_path / "x.yaml"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["evaluations"] == outcome.evaluations_run
    assert summary["evaluations_by_method"] == {"lagom": outcome.result.evaluations,
                                                "autoccl": outcome.autoccl.evaluations}


@pytest.mark.slow  # the simulator evaluates an FSDP Llama-3-8B iteration a few hundred times
def test_tune_puts_a_group_on_the_copy_engines_and_says_what_to_turn_on(tmp_path, capsys):
    """FSDP Llama-3-8B on one H100 node at NCCL 2.30.7: the all-gathers go to the copy engines;
    the file sets CTA policy ZERO for the group and lists what the user must do (FSDP2's
    set_symm_mem_for_comm, the versions), the table says so, and the file replays its prediction."""
    from dataclasses import replace

    spec, out_file = "fsdp:llama3-8b:gpus=8", tmp_path / "lagom.yaml"
    code, out, err = run_cli(capsys, "tune", spec, "--cluster", "h100-nvswitch", "--nccl-version", "2.30.7",
                             "--evaluator", "sim", "--no-autoccl", "-o", str(out_file))
    assert code == 0, err
    config = load_tuned_config(out_file)
    assert config.process_groups["0"]["cta_policy"] == "zero"
    gathers = [e for e in config.collectives if e.match.collective is CollectiveType.ALLGATHER]
    assert gathers and all(e.config.comm_path is not None and e.config.channels is None for e in gathers)
    text = " ".join(config.requirements)
    assert "set_symm_mem_for_comm" in text and "NCCL >= 2.28.0" in text and "CUDA driver >= 12.5" in text
    flat = " ".join(out.split())  # the table wraps long cells
    assert "copy-engine" in flat  # the table names the path (its cell may wrap after the '>')
    assert flat.count("requires: group 0 (copy_engine)") == len(config.requirements)
    cluster = replace(load_cluster("h100-nvswitch"), nccl_version=NcclVersion.parse("2.30.7"))
    workload = generate_workload(spec)
    again = Simulator(cluster, noise=0.0).evaluate(workload, config.to_plan(workload_signatures(workload, 8)))
    assert again.iteration_us == pytest.approx(config.predictions["tuned_us"], rel=1e-6)


def _w128_pair(tmp_path):
    from conftest import trace_path

    folder = tmp_path / "w128"
    folder.mkdir()
    for r in (0, 1):
        name = f"w128_sendrecv_rank{r}.json.gz"
        (folder / name).write_bytes(trace_path(name).read_bytes())
    return folder


def test_a_folders_signature_rows_are_the_jobs_step(tmp_path, capsys):
    """The shared 128-rank pair: the rows were rank 0's totals over the whole trace (the dropped
    unfinished step included: 396.2 ms) under a column that says per step, against 168.0 ms of
    collectives in the job's step, and two signatures only rank 1 ran showed 0.00 ms. Now the
    rows are per kept step on the step's slowest rank and sum to the step's collective time; a
    signature the step's rank never ran shows its own rank, named, outside the total."""
    folder = _w128_pair(tmp_path)
    code, out, err = run_cli(capsys, "tune", str(folder), "--json", "--no-autoccl", "--budget", "4",
                             "-o", str(tmp_path / "t.yaml"))
    assert code == 0, err
    summary = json.loads(out)
    rows = {(r["signature"]): r for r in summary["rows"]}
    assert summary["rows_figures_of"] == "the job's step (its slowest rank: 1)"
    assert summary["rows_total"]["nccl_ms"] == pytest.approx(summary["nccl"]["collectives_ms"], abs=0.01)
    assert summary["nccl"]["collectives_ms"] == pytest.approx(168.03, abs=0.01)
    assert all(r["nccl_ms"] > 0 for r in rows.values())  # every recorded signature has its time
    step = [r for r in rows.values() if r["rank"] is None and not r["outside_steps"]]
    assert len(step) == 5 and len(rows) == 10
    small = next(r for label, r in rows.items() if label.startswith("alltoall[0] 3072B"))
    assert small["rank"] == 0 and small["nccl_ms"] == pytest.approx(30.669, abs=0.001)
    assert {r["rank"] for r in rows.values() if r["outside_steps"]} == {0, 1}  # ran only in the dropped step
    # the transfer of collectives seen once, beside 126 ranks not recorded, is the cluster's bound
    assert err.count("called wait for ranks not recorded") == 1
    code, out, _ = run_cli(capsys, "tune", str(folder), "--no-autoccl", "--budget", "4", "-o", str(tmp_path / "t.yaml"))
    assert code == 0 and "ms per step of the job's step (its slowest" in " ".join(out.split())
    assert "the step's 5 signatures" in out and "(rank 0)" in out


def test_simulate_a_folder_names_whose_figures_it_prints(tmp_path, capsys):
    folder = _w128_pair(tmp_path)
    code, out, _ = run_cli(capsys, "simulate", str(folder), "--json")
    assert code == 0
    assert json.loads(out)["figures_of"] == "w128: 2 ranks, the job's step (its slowest rank: 1)"
    code, out, _ = run_cli(capsys, "simulate", str(folder / "w128_sendrecv_rank0.json.gz"), "--json")
    assert code == 0 and json.loads(out)["figures_of"] == "w128_sendrecv_rank0.json.gz (rank 0)"
