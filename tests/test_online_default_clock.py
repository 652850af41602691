"""The online clock by default never touches TORCH_NCCL_ENABLE_TIMING: `lagom run --online` around
real torchrun jobs (2 ranks, gloo, CPU) without --simulate, so through the launcher's real
environment path and the host clock, with and without --collective-timing.

Each rank of tests/online_job.py writes the NCCL_* / TORCH_NCCL_* / LAGOM_* variables it ran
with. The user's environment holds no TORCH_NCCL_ENABLE_TIMING: by default no rank may see
one; with --collective-timing every rank sees 1. Everything else is the real online path:
the seed, the plugin's table, the store, the optimizer step hook, the host clock.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml
from conftest import REPO_ROOT, run_jobs

from nccl_env.plugin_build import build_plugin

pytestmark = pytest.mark.slow  # two two-process torchrun jobs, run together (about 15 s)

JOB = REPO_ROOT / "tests" / "online_job.py"
TIMING = "TORCH_NCCL_ENABLE_TIMING"
SEED = {"format": "lagom.tuned-config", "version": 1, "cluster": "low-bw", "nccl_version": "2.30.1",
        "workload": "tp:phi2:tp=8,dp=1",
        "collectives": [{"match": {"collective": "allreduce"}, "set": {"channels": 2}}]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clock")
    seed = tmp / "seed.yaml"
    seed.write_text(yaml.safe_dump(SEED))
    build_plugin()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAGOM_", "TORCH_NCCL_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    jobs = {}
    for name, extra in (("default", []), ("timing", ["--collective-timing"])):
        jobs[name] = ([sys.executable, "-m", "lagom", "run", "--online", "--config", str(seed), *extra, "--",
                       sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                       str(JOB), "--out", str(tmp / name), "--steps", "6"], env)
    return tmp, run_jobs(jobs, timeout_s=240)


def _envs(out) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text())["env"] for r in range(2)]


def test_by_default_no_rank_sees_nccl_timing_and_the_clock_is_the_step_time(runs):
    tmp, results = runs
    status, err, _ = results["default"]
    assert status == 0, err[-3000:]
    envs = _envs(tmp / "default")
    assert all(TIMING not in env for env in envs), envs
    assert all(env.get("LAGOM_ONLINE") for env in envs)  # the online run reached every rank
    assert "clock: step time from the host clock" in err
    assert "collective durations unavailable" not in err  # no Work handle is read: nothing to fall back from


def test_collective_timing_is_opt_in_and_sets_nccl_timing_in_every_rank(runs):
    tmp, results = runs
    status, err, _ = results["timing"]
    assert status == 0, err[-3000:]
    assert [env.get(TIMING) for env in _envs(tmp / "timing")] == ["1", "1"]
    assert "it costs overlap" in err
