"""End to end: `lagom record` around real torchrun jobs (2 ranks, gloo, CPU), then `lagom analyze`
and `lagom tune` on the folder it wrote, as it is.

Two jobs run together (tests/online_job.py: a small model, SGD, gradients all-reduced): one
long enough for the window, one that ends before it. gloo traces have no GPU kernels:
analyze says the overlap is n/a, tune without --cluster says the collectives ran on the
CPU and asks for one (exit 2), and with --cluster tunes them with one warning line that
the figures are the model's. Both print the profiler's overhead, which the test computes
from the metadata itself.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from statistics import fmean

import pytest
from conftest import REPO_ROOT, run_jobs

from lagom.runtime.record_launch import RECORDING_FAILED_STATUS
from traces.workload import RECORD_METADATA_KEY

pytestmark = pytest.mark.slow  # two two-process torchrun jobs, then analyze and tune (about 25 s)

JOB = REPO_ROOT / "tests" / "online_job.py"
WINDOW = {"skip": 2, "timed": 3, "warmup": 1, "active": 3}  # the last recorded step is step 8
STEPS = 10


def _record(out, job_out, steps: int) -> list[str]:
    flags = [x for name, value in WINDOW.items() for x in (f"--{name}", str(value))]
    return [sys.executable, "-m", "lagom", "record", "-o", str(out), *flags, "--", sys.executable, "-m",
            "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(JOB), "--out", str(job_out),
            "--steps", str(steps)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAGOM_", "TORCH_NCCL_"))}
    return {**env, "PYTHONPATH": str(REPO_ROOT), "NCCL_ALGO": "Ring"}  # a variable the traces must carry


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("record")
    jobs = {"full": (_record(tmp / "traces", tmp / "job", STEPS), _env()),
            "short": (_record(tmp / "short", tmp / "short-job", 5), _env())}
    return tmp, run_jobs(jobs, timeout_s=240)


def _lagom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lagom", *args], capture_output=True, text=True, env=_env(),
                          timeout=300, check=False)


def _metadata(path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)[RECORD_METADATA_KEY]


def _expected_overhead(metas: list[dict]) -> float:
    profiled = fmean(fmean(m["step_time_us"]["profiled"]["host"]) for m in metas)
    unprofiled = fmean(fmean(m["step_time_us"]["unprofiled"]["host"]) for m in metas)
    return profiled / unprofiled - 1


def test_every_rank_writes_one_trace_of_one_job_with_the_window_and_the_environment(runs):
    tmp, results = runs
    status, err, _ = results["full"]
    assert status == 0, err[-3000:]
    assert sorted(os.listdir(tmp / "traces")) == ["lagom-record.txt", "rank-0.json.gz", "rank-1.json.gz"]
    metas = [_metadata(tmp / "traces" / f"rank-{r}.json.gz") for r in range(2)]
    assert metas[0]["job_id"] == metas[1]["job_id"]  # rank 0's id, through the store
    for meta in metas:
        assert meta["window"] == {**WINDOW, "first_profiled_step": 6} and meta["clock"] == "host"
        assert [len(meta["step_time_us"][p]["host"]) for p in ("unprofiled", "profiled")] == [3, 3]
        assert meta["nccl_env"]["NCCL_ALGO"] == "Ring" and meta["nccl_version"] is None
    assert "lagom record: 2 rank trace(s) in" in err
    assert f"lagom record: profiler overhead: {_expected_overhead(metas):+.1%} " in err
    # the job itself ran to its end unchanged
    assert all(len(json.loads((tmp / "job" / f"rank-{r}.json").read_text())["losses"]) == STEPS for r in range(2))


def test_a_job_shorter_than_the_window_records_nothing_and_says_why_per_rank(runs):
    tmp, results = runs
    status, err, _ = results["short"]
    assert status == RECORDING_FAILED_STATUS, err[-3000:]  # the job ran well; the recording did not
    assert f"lagom record: error: nothing recorded into {tmp / 'short'}" in err
    assert os.listdir(tmp / "short") == []  # an incomplete recording puts nothing there
    for rank in (0, 1):
        assert f"rank {rank} wrote no trace: the job ended after 5 optimizer step(s), before step 8" in err


def test_analyze_reads_the_folder_and_says_gloo_has_no_kernels_to_overlap(runs):
    tmp, results = runs
    assert results["full"][0] == 0
    done = _lagom("analyze", str(tmp / "traces"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("n/a (no communication kernels)") == 2  # one per rank, not a crash
    assert "allreduce (cpu)" in done.stdout
    metas = [_metadata(tmp / "traces" / f"rank-{r}.json.gz") for r in range(2)]
    assert f"profiler overhead: {_expected_overhead(metas):+.1%} " in done.stdout
    report = json.loads(_lagom("analyze", str(tmp / "traces"), "--json").stdout)
    assert report["profiler_overhead"]["overhead"] == pytest.approx(_expected_overhead(metas), abs=1e-4)
    assert report["profiler_overhead"]["ranks"] == 2


def test_tune_asks_for_a_cluster_then_tunes_the_cpu_collectives_as_the_models_figures(runs, tmp_path):
    tmp, results = runs
    assert results["full"][0] == 0
    refused = _lagom("tune", str(tmp / "traces"), "-o", str(tmp_path / "a.yaml"))
    assert refused.returncode == 2 and not (tmp_path / "a.yaml").exists()
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "CPU-side calls without their GPU kernels" in lines[0] and "give --cluster" in lines[0]
    done = _lagom("tune", str(tmp / "traces"), "--cluster", "low-bw", "--evaluator", "sim", "--no-autoccl",
                  "-o", str(tmp_path / "b.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    assert "its collectives ran on the CPU (no NCCL kernels: a gloo job)" in done.stderr
    summary = json.loads(done.stdout)
    rank0 = _metadata(tmp / "traces" / "rank-0.json.gz")  # tune reads rank 0
    assert summary["profiler_overhead"]["overhead"] == pytest.approx(_expected_overhead([rank0]), abs=1e-4)
    assert summary["signatures"] > 0 and (tmp_path / "b.yaml").exists()


def test_record_tune_run_export_a_gloo_job_with_the_readmes_commands(runs, tmp_path):
    """The loop from the user's cluster back: what was recorded is tuned (for a named cluster: a gloo
    job ran no NCCL), the job runs with the tuned file, and the tuned plan's prediction is exported
    as a trace that lagom analyze reads back step for step."""
    tmp, results = runs
    assert results["full"][0] == 0
    tuned = tmp_path / "lagom.yaml"
    done = _lagom("tune", str(tmp / "traces"), "--cluster", "low-bw", "--no-autoccl", "-o", str(tuned), "--json")
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([sys.executable, "-m", "lagom", "run", "--config", str(tuned), "--audit",
                          str(tmp_path / "audit.json"), "--", sys.executable, "-m", "torch.distributed.run",
                          "--standalone", "--nproc_per_node", "2", str(JOB), "--out", str(tmp_path / "job"),
                          "--steps", "3"], capture_output=True, text=True, env=_env(), timeout=240, check=False)
    assert ran.returncode == 0, ran.stderr
    assert json.loads((tmp_path / "audit.json").read_text())["format"] == "lagom.audit"
    export = tmp_path / "predicted.json.gz"
    plan = ["simulate", str(tmp / "traces"), "--cluster", "low-bw", "--config", str(tuned)]
    simulated = _lagom(*plan, "--scale", "comm=2", "--export-trace", str(export), "--json")
    assert simulated.returncode == 0, simulated.stderr
    result = json.loads(simulated.stdout)
    # a folder replays every rank at once; the export is the lowest rank's own steps in that replay
    predicted = result["ranks"]["0"]["steps"] if "ranks" in result else result["steps"]
    read_back = json.loads(_lagom("analyze", str(export), "--json").stdout)["ranks"][0]["steps"]
    assert [s["name"] for s in read_back] == [s["name"] for s in predicted]
    # the tuned plan alone, as the model predicts it: doubling its collectives lengthens every step. (Not
    # the measured step: the tuned plan's collectives are shorter than the recorded ones, so a recorded
    # step with little communication, or one that waited on a core the machine's load took, can stay
    # longer than the plan's what-if.)
    alone = json.loads(_lagom(*plan, "--json").stdout)
    tuned_steps = alone["ranks"]["0"]["steps"] if "ranks" in alone else alone["steps"]
    assert [s["name"] for s in tuned_steps] == [s["name"] for s in predicted]
    for p, r, t in zip(predicted, read_back, tuned_steps):
        assert r["iteration_us"] == pytest.approx(p["iteration_us"], rel=1e-3)
        # twice each collective's transfer (its wait for the peer is the replay's to find again)
        assert p["comm_us"] > t["comm_us"] and p["iteration_us"] > t["iteration_us"]
    if importlib.util.find_spec("hta") is not None:  # HTA opens it (its kernel analyses need GPU kernels)
        from hta.trace_analysis import TraceAnalysis

        (tmp_path / "hta").mkdir()
        shutil.copy(export, tmp_path / "hta" / "rank0.json.gz")
        TraceAnalysis(trace_dir=str(tmp_path / "hta"))


def test_a_recording_whose_ranks_cannot_write_fails_with_one_error_line(tmp_path):
    """Issue 31: `lagom record` into a full disk recorded nothing and exited 0. Here every write of the
    job's processes past 16 KiB fails (RLIMIT_FSIZE; Python ignores SIGXFSZ, so the write raises EFBIG,
    as on a full disk): the trace cannot be written, the job itself runs to its end."""
    import resource

    job = tmp_path / "job.py"
    job.write_text("import torch\n"
                   "model = torch.nn.Linear(4, 4)\n"
                   "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                   "for _ in range(6):\n"
                   "    optimizer.zero_grad()\n"
                   "    model(torch.randn(2, 4)).sum().backward()\n"
                   "    optimizer.step()\n")
    out = tmp_path / "out"

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))

    done = subprocess.run([sys.executable, "-m", "lagom", "record", "-o", str(out), "--skip", "1", "--timed", "1",
                           "--warmup", "1", "--active", "1", "--", sys.executable, str(job)], capture_output=True,
                          text=True, env=_env(), timeout=300, check=False, preexec_fn=small_files)
    assert done.returncode == RECORDING_FAILED_STATUS, done.stderr
    assert "lagom record: warning: rank 0 wrote no trace: cannot write" in done.stderr
    (error,) = [line for line in done.stderr.splitlines() if "error" in line.lower() and "lagom" in line]
    assert error == f"lagom record: error: nothing recorded into {out} (not every rank wrote its trace; nothing " \
                    "was put there)"
    assert os.listdir(out) == [] and "Traceback" not in done.stderr
