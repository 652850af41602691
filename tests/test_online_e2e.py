"""End to end: `lagom run --online --simulate` around real torchrun jobs (2 ranks, gloo, CPU).

Everything is real but the clock: torchrun, the default group's TCPStore carrying the
measurements and decisions, the optimizer step hook, the compiled tuner plugin whose
table every rank swaps and reads back, the audit, the saved file. Each rank's step
times come from the simulator of the *measuring* cluster (high-bw) at 2% noise,
independent per rank; the seed is the plan tuned offline for the *other* cluster
(low-bw). Four jobs run together: the same job without Lagom, the online one, one
whose rank 1 dies mid-tuning, and one on the real clock (no --simulate: the launcher's
own environment path, the host clock) whose ranks must not see TORCH_NCCL_ENABLE_TIMING
and whose job runs none of the seed's signatures (the seed is kept, and saved as it was).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import REPO_ROOT, run_jobs

from costmodel.cluster import load_cluster
from lagom.files.tuned_config import load_tuned_config
from lagom.orchestration import tuning
from nccl_env.plan import Plan
from nccl_env.plugin_build import build_plugin
from nccl_env.rules import NcclVersion

JOB = REPO_ROOT / "tests" / "online_job.py"
SPEC = "fsdp:phi2:gpus=16"  # two nodes: the presets' inter-node links differ, and so do their plans
VERSION = "2.30.3"
STEPS = 260
BUDGET = 240

pytestmark = pytest.mark.slow


def _tuned(preset: str, path) -> Plan:
    cluster = tuning.with_nccl_version(load_cluster(preset), NcclVersion.parse(VERSION))
    workload = tuning.load_workload_arg(SPEC)
    outcome = tuning.tune(workload, cluster, tuning.make_evaluator("sim", cluster), with_autoccl=False)
    tuning.tuned_config(outcome, cluster, preset, SPEC).dump(path)
    return outcome.result.plan


def _torchrun(out, *job_args: str, steps: int = STEPS) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB),
            "--out", str(out), "--steps", str(steps), *job_args]


def _online(tmp, name: str, seed) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lagom",
        "run",
        "--online",
        "--config",
        str(seed),
        "--save",
        str(tmp / f"{name}.yaml"),
        "--budget-steps",
        str(BUDGET),
        "--simulate",
        SPEC,
        "--cluster",
        "high-bw",
        "--noise",
        "0.02",
        "--audit",
        str(tmp / f"{name}-audit.json"),
        "--",
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("online")
    seed = tmp / "seed-low-bw.yaml"
    _tuned("low-bw", seed)
    build_plugin()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAGOM_", "TORCH_NCCL_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    plans = {
        "plain": _torchrun(tmp / "plain"),
        "online": _online(tmp, "online", seed) + _torchrun(tmp / "online"),
        "killed": _online(tmp, "killed", seed) + _torchrun(tmp / "killed", "--die-at", "1:40"),
        # the real clock (no --simulate: the launcher's own environment path) on a job whose all-reduces are none
        # of the seed's signatures (fsdp's all-gathers and reduce-scatters): whatever the host clock shows, there is
        # nothing to keep; the clock's test and the saved seed's read this one job
        "nomatch": [sys.executable, "-m", "lagom", "run", "--online", "--config", str(seed), "--save",
                    str(tmp / "nomatch.yaml"), "--audit", str(tmp / "nomatch-audit.json"), "--",
                    *_torchrun(tmp / "nomatch", steps=40)],
    }
    results = run_jobs({name: (cmd, env) for name, cmd in plans.items()}, timeout_s=300)
    return tmp, seed, results


def _losses(out) -> list[list[str]]:
    return [json.loads((out / f"rank-{r}.json").read_text())["losses"] for r in range(2)]


def test_online_result_matches_the_measuring_clusters_offline_plan(runs, tmp_path):
    tmp, seed, results = runs
    status, err, _ = results["online"]
    assert status == 0, err[-3000:]
    cluster = tuning.with_nccl_version(load_cluster("high-bw"), NcclVersion.parse(VERSION))
    workload = tuning.load_workload_arg(SPEC)
    signatures = tuning.space_for(workload, cluster).signatures
    judge = tuning.make_evaluator("sim", cluster, noise=0.0)
    offline_us = judge.evaluate(workload, _tuned("high-bw", tmp_path / "offline.yaml")).iteration_us
    online_us = judge.evaluate(workload, load_tuned_config(tmp / "online.yaml").to_plan(signatures)).iteration_us
    seed_us = judge.evaluate(workload, load_tuned_config(seed).to_plan(signatures)).iteration_us
    assert seed_us > offline_us * 1.05  # the other cluster's plan is far off here: there is something to find
    assert online_us <= offline_us * 1.01


def test_losses_are_bit_identical_to_the_job_without_lagom(runs):
    tmp, _, results = runs
    assert results["plain"][0] == 0 and results["online"][0] == 0
    assert _losses(tmp / "online") == _losses(tmp / "plain")


def test_every_rank_ran_the_same_epochs_and_the_audit_says_so(runs):
    tmp, _, results = runs
    document = json.loads((tmp / "online-audit.json").read_text())
    online = document["online"]
    assert online["result"] == "kept"
    assert 0 < online["steps_spent"] <= BUDGET and online["evaluations"] > 1
    assert len(online["per_rank"]["0"]) > 2 and online["per_rank"]["0"] == online["per_rank"]["1"]
    # the summary lines say what the online run did; calls are matched against the plan in force
    assert online["epochs"] == len(online["per_rank"]["0"])
    assert online["summary"]["collectives"] == document["summary"]["collectives"] > 0
    done = (f"online tuning kept its result: {online['epochs']} epochs, {online['steps_spent']} steps spent, "
            f"{online['evaluations']} measured plans; ")
    rank0 = document["per_rank"]["0"]["online"]["summary"]["collectives"]
    err = results["online"][1]
    assert f"rank 0: {done}{rank0} collectives" in err
    assert f"all ranks: {done}{online['summary']['collectives']} collectives" in err
    assert "matched a tuned entry" not in err
    epochs = [document["per_rank"][r]["online"]["epochs"] for r in ("0", "1")]
    assert epochs[0] == epochs[1]  # same plan hash from the same step on every rank
    assert [e[2] for e in epochs[0]] == sorted(e[2] for e in epochs[0])
    calls_per_step = len(tuning.load_workload_arg(SPEC).collectives)  # all-gathers and reduce-scatters
    for rank in ("0", "1"):
        tables = document["per_rank"][rank]["online"]["tables"]
        assert len(tables) == len(epochs[0]) and all(t["entries"] == 4 for t in tables)  # each swap reached the plugin
        assert [t["generation"] for t in tables] == sorted({t["generation"] for t in tables})
        for table, (start, end) in zip(tables, zip(epochs[0], epochs[0][1:], strict=False), strict=False):
            # the plugin's own per-line counts: every call of the epoch's steps answered by one of its lines
            assert sum(table["coll_info"]) == (end[2] - start[2]) * calls_per_step


def test_a_rank_lost_mid_tuning_ends_the_job_with_an_error_not_a_hang(runs):
    tmp, _, results = runs
    status, err, elapsed = results["killed"]
    assert status != 0 and "<timed out>" not in err
    assert elapsed < 240
    assert not (tmp / "killed.yaml").exists() and "no tuned plan to save" in err


def test_the_default_clock_never_sets_nccl_timing_in_any_rank(runs):
    """No --simulate, no --collective-timing: the real launcher path; the user set no TORCH_NCCL_ENABLE_TIMING and
    no rank may see one (opting in sets it: tests/test_online_work_timing.py, on the same launcher env)."""
    tmp, _, results = runs
    status, err, _ = results["nomatch"]
    assert status == 0, err[-3000:]
    envs = [json.loads((tmp / "nomatch" / f"rank-{r}.json").read_text())["env"] for r in range(2)]
    assert all(env.get("LAGOM_ONLINE") for env in envs)  # the online run reached every rank
    assert all("TORCH_NCCL_ENABLE_TIMING" not in env for env in envs), envs
    assert "clock: step time from the host clock" in err
    # the session ran its boundaries on that clock, and saw the job's all-reduces are none of the seed's signatures
    assert "lagom: rank 0: online tuning reverted to the seed (the job ran none of the tuned signatures)" in err


def _final_line(err: str) -> str:
    """The launcher's last word on online tuning: what it decided and where the plan went."""
    return next(line for line in reversed(err.splitlines()) if line.startswith("lagom run: online tuning "))


def test_online_keeps_and_saves_the_seed_when_the_job_ran_none_of_its_signatures(runs):
    tmp, seed, results = runs
    status, err, _ = results["nomatch"]
    assert status == 0, err[-3000:]
    document = json.loads((tmp / "nomatch-audit.json").read_text())
    assert document["online"]["summary"]["matched"] == 0 < document["online"]["summary"]["collectives"]
    assert document["online"]["result"] == "reverted"
    assert document["online"]["reason"] == "the job ran none of the tuned signatures"
    assert document["online"]["evaluations"] == 1  # the seed's, and nothing tried after it
    saved, original = load_tuned_config(tmp / "nomatch.yaml"), load_tuned_config(seed)
    # the seed's plan as the seed file had it, not NCCL's defaults
    assert (saved.env, saved.process_groups, saved.collectives) == (original.env, original.process_groups,
                                                                    original.collectives)
    assert saved.collectives and saved.env and saved.method == "lagom-online"
    assert any("the job ran none of the tuned signatures" in note for note in saved.notes)
    line = _final_line(err)
    assert line.startswith("lagom run: online tuning kept the seed (the job ran none of the tuned signatures); "
                           f"the seed's plan, unchanged, saved to {tmp / 'nomatch.yaml'}"), line
    assert "starts tuned" not in err


def test_the_final_line_and_the_saved_file_agree_on_a_kept_result(runs):
    tmp, seed, results = runs
    line = _final_line(results["online"][1])
    saved, original = load_tuned_config(tmp / "online.yaml"), load_tuned_config(seed)
    assert line.startswith("lagom run: online tuning kept its result (") and "the tuned plan saved to" in line
    assert saved.method == "lagom-online" and saved.collectives != original.collectives
    assert any(note.startswith("online: kept after") for note in saved.notes)
    gain = float(line.split("(", 1)[1].split("%", 1)[0]) / 100
    base, tuned = saved.predictions["baseline_us"], saved.predictions["tuned_us"]
    assert gain > 0 and tuned < base
