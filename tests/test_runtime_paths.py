"""`lagom run` with a file that puts a group on a path (copy engines, symmetric kernels).

What can run here runs: the launcher's choices (no tuner plugin when no entry needs it; a
warning when a plugin would switch NCCL's EFFICIENCY re-selection off), the env that has
NCCL write its TUNING log into the run folder, and a real two-rank torchrun job (gloo, CPU)
whose audit carries the log's reading. NCCL itself does not run on gloo, so the reader of
NCCL's log is checked on lines in the exact format NCCL's source prints (debug.cc prefix,
ce_coll.cc / symmetric_sched.cc / enqueue.cc messages at v2.30.7-1).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, run_jobs

from lagom.runtime import launcher, nccl_paths
from lagom.runtime.launcher import prepare

PATH_FILE = {
    "format": "lagom.tuned-config",
    "version": 1,
    "cluster": "h100-nvswitch",
    "nccl_version": "2.30.7",
    "method": "lagom",
    "process_groups": {"0": {"cta_policy": "zero"}},
    "collectives": [
        {"match": {"collective": "allgather", "group": "0"}, "set": {"path": "copy_engine"}},
        {"match": {"collective": "reducescatter", "group": "0"}, "set": {"path": "copy_engine"}},
    ],
    "requirements": ["group 0 (copy_engine): allocate the buffers of its allgather in NCCL symmetric memory"],
}

# One line of each kind, as NCCL writes them: "<host>:<pid>:<tid> [<dev>] NCCL INFO <message>" (debug.cc)
NCCL_LINES = [
    "node1:4242:4300 [0] NCCL INFO AllGather [Copy Engine]: 67108864 Bytes -> cudaMemcpy; CE synchronization with NVLS",
    "node1:4242:4300 [0] NCCL INFO AllGather [Hierarchical CE]: 67108864 Bytes -> RMA proxy + CE",
    "node1:4242:4300 [0] NCCL INFO ReduceScatter [Symmetric]: 8388608 Bytes -> Kernel ReduceScatter_LD nchannels 9 "
    "nthreads 512 nWorks 1",
    "node1:4242:4300 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
    "node1:4242:4300 [0] NCCL INFO Init CE, rank 0 baseUCSymReadyPtr 0x7f, baseUCSymComplPtr 0x7f, seq num 0",
    "node1:4242:4301 [0] enqueue.cc:1234 NCCL WARN something went wrong",
]


def _write(tmp_path: Path, data: dict, name: str = "lagom.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_nccls_tuning_lines_are_read_path_by_path():
    parsed = [nccl_paths.parse_line(line) for line in NCCL_LINES]
    assert parsed[0] == nccl_paths.PathLine("AllGather", 67108864, nccl_paths.COPY_ENGINE, 0)
    assert parsed[1] == nccl_paths.PathLine("AllGather", 67108864, nccl_paths.COPY_ENGINE, 0)
    assert parsed[2] == nccl_paths.PathLine("ReduceScatter", 8388608, nccl_paths.SYMMETRIC, 9, "ReduceScatter_LD")
    assert parsed[3] == nccl_paths.PathLine("AllReduce", 4096, nccl_paths.KERNEL, 2, "RING/LL")
    assert parsed[4] is None and parsed[5] is None


def test_the_run_folders_logs_add_up_and_keep_nccls_warnings(tmp_path):
    folder = tmp_path / nccl_paths.LOG_DIR
    folder.mkdir()
    (folder / "nccl.node1.4242.log").write_text("\n".join(NCCL_LINES) + "\n")
    (folder / "nccl.node1.4243.log").write_text(NCCL_LINES[0] + "\n" + NCCL_LINES[0] + "\n")
    report = nccl_paths.read_logs(tmp_path)
    data = report.to_dict()
    assert data["files"] == 2
    assert data["by_path"] == {nccl_paths.COPY_ENGINE: 4, nccl_paths.KERNEL: 1, nccl_paths.SYMMETRIC: 1}
    assert report.warnings == [NCCL_LINES[5]]
    assert nccl_paths.summary_line(report) == ("NCCL's log: 4 on the copy engines, 1 on sm kernels, "
                                               "1 on symmetric kernels")
    assert "writes none" in nccl_paths.summary_line(nccl_paths.read_logs(tmp_path / "nowhere"))


def test_no_plugin_when_no_entry_has_a_setting_for_it(tmp_path):
    setup = prepare(_write(tmp_path, PATH_FILE), tmp_path / "wd", base_env={})
    assert setup.plugin_path is None and "NCCL_TUNER_PLUGIN" not in setup.env
    assert any("the plugin is not loaded" in m and "EFFICIENCY" in m for m in setup.messages)
    # one entry with channels: the plugin is loaded as before
    with_channels = {**PATH_FILE, "collectives": [*PATH_FILE["collectives"],
                                                  {"match": {"collective": "allreduce"}, "set": {"channels": 4}}]}
    setup = prepare(_write(tmp_path, with_channels, "b.yaml"), tmp_path / "wd2", base_env={})
    assert setup.plugin_path is not None and not any("not loaded" in m for m in setup.messages)


def test_efficiency_with_a_loaded_plugin_is_a_warning(tmp_path):
    data = {**PATH_FILE, "process_groups": {"0": {"cta_policy": "efficiency"}},
            "collectives": [{"match": {"collective": "allreduce"}, "set": {"channels": 4}}]}
    setup = prepare(_write(tmp_path, data), tmp_path / "wd", base_env={})
    assert any("EFFICIENCY" in m and "--no-plugin" in m for m in setup.messages)


def test_the_audit_has_nccl_write_its_tuning_log_unless_the_user_set_nccl_debug(tmp_path):
    setup = prepare(_write(tmp_path, PATH_FILE), tmp_path / "wd", base_env={})
    assert launcher.uses_paths(setup.config) and launcher.observe_paths(setup)
    assert setup.env["NCCL_DEBUG"] == "INFO" and setup.env["NCCL_DEBUG_SUBSYS"] == "TUNING"
    assert setup.env["NCCL_DEBUG_FILE"] == str(setup.run_dir / nccl_paths.LOG_DIR / "nccl.%h.%p.log")
    mine = prepare(_write(tmp_path, PATH_FILE, "b.yaml"), tmp_path / "wd2", base_env={"NCCL_DEBUG": "WARN"})
    assert not launcher.observe_paths(mine) and mine.env["NCCL_DEBUG"] == "WARN"
    assert "NCCL_DEBUG_FILE" not in mine.env and any("your NCCL_DEBUG wins" in m for m in mine.messages)
    plain = {**PATH_FILE, "process_groups": {}, "collectives": [{"match": {}, "set": {"channels": 2}}]}
    assert not launcher.uses_paths(prepare(_write(tmp_path, plain, "c.yaml"), tmp_path / "wd3", base_env={}).config)


@pytest.mark.slow  # a real two-process torchrun job (about 20 s)
def test_a_torchrun_job_under_a_path_file(tmp_path):
    config = _write(tmp_path, PATH_FILE)
    out, audit_file = tmp_path / "out", tmp_path / "audit.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAGOM_")) or k == "LAGOM_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    cmd = [sys.executable, "-m", "lagom", "run", "--config", str(config), "--audit", str(audit_file), "--workdir",
           str(tmp_path / "wd"), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2", str(REPO_ROOT / "tests" / "runtime_job.py"), "--out", str(out), "--steps", "1"]
    code, err, _ = run_jobs({"job": (cmd, env)}, timeout_s=240)["job"]
    assert code == 0, err[-3000:]
    for rank in range(2):
        seen = json.loads((out / f"rank-{rank}.json").read_text())["env"]
        assert "NCCL_TUNER_PLUGIN" not in seen  # nothing for it to carry
        assert seen["NCCL_DEBUG_SUBSYS"] == "TUNING"
        assert Path(seen["NCCL_DEBUG_FILE"]).parent == tmp_path / "wd" / nccl_paths.LOG_DIR
    document = json.loads(audit_file.read_text())
    assert document["nccl_paths"]["files"] == 0  # gloo: NCCL never ran, wrote nothing, and the audit says so
    assert document["nccl_paths"]["by_path"] == {}
    assert "lagom run: NCCL wrote no TUNING line in 0 log file(s)" in err
    assert "the plugin is not loaded" in err
