"""Issue 31: a tuned file cannot take over the job, and ``lagom run`` never starts what will fail.

A tuned file is data passed around; ``lagom run`` puts it into every rank. Its ``env`` is
an allowlist (the NCCL knobs Lagom tunes, each value by NCCL's rules); the paths it stores
resolve against its own folder and what the ranks will read is checked before the child
starts (:mod:`lagom.runtime.preflight`); the user's own NCCL variables that cap or override
a tuned value are named, one line each. The rows of the same refusals for every command
that reads a tuned file are in tests/test_bad_input_matrix.py (ROWS_31).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, REPO_ROOT

from costmodel.cluster import load_cluster
from lagom.cli import main
from lagom.files.tuned_config import load_tuned_config, resolve_stored, stored_path
from lagom.runtime import launcher
from lagom.runtime.preflight import preflight
from nccl_env.delivery import ENV_NAMES, TUNED_ENV_NAMES
from nccl_env.env_effects import EFFECTS
from nccl_env.env_values import RULED_NAMES, validate_env
from nccl_env.errors import LagomError
from nccl_env.knob_table import KNOBS
from nccl_env.rules import NcclVersion
from traces.generate import generate_workload
from traces.workload_io import save_workload

TRACE = EXAMPLES / "fsdp8_a100_2ch_synthetic.json.gz"
CONFIG = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.21.5", "cluster": "a100-nvswitch",
          "env": {"NCCL_NTHREADS": "256"},
          "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 8}},
                          {"match": {"collective": "allreduce"}, "set": {"algorithm": "ring", "channels": 12}}]}


def _write(path: Path, **changes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**CONFIG, **changes}, sort_keys=False))
    return path


@pytest.mark.parametrize("name, value", [
    ("LD_PRELOAD", "./evil.so"), ("FOO_BAR", "1"), ("NCCL_DEBUG_FILE", "/tmp/nccl.%h.log"),
    ("LD_LIBRARY_PATH", "/tmp"), ("CUDA_VISIBLE_DEVICES", "0"), ("NCCL_TOPO_DUMP_FILE", "/tmp/topo.xml"),
    ("NCCL_TUNER_PLUGIN", "./evil.so"), ("NCCL_NET_PLUGIN", "evil"), ("NCCL_DEBUG", "INFO"),
])
def test_an_env_name_outside_the_allowlist_is_refused_and_the_job_never_starts(tmp_path, capfd, name, value):
    path = _write(tmp_path / "f.yaml", env={name: value})
    assert main(["run", "--config", str(path), "--", "env"]) == 2
    out, err = capfd.readouterr()
    assert out == "", "the child ran (env printed its environment)"
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"f.yaml: env {name} is refused: a tuned file's env may set only the NCCL knobs Lagom tunes" in err, err


def test_every_name_a_tuned_file_may_set_is_one_delivery_writes_and_has_a_value_rule():
    assert set(TUNED_ENV_NAMES) <= RULED_NAMES  # each value is checked by NCCL's rules
    assert set(TUNED_ENV_NAMES) < set(ENV_NAMES) and "NCCL_TUNER_PLUGIN" not in TUNED_ENV_NAMES
    assert {"NCCL_ALGO", "NCCL_PROTO", "NCCL_NTHREADS", "NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS",
            "NCCL_CTA_POLICY"} <= set(TUNED_ENV_NAMES)


@pytest.mark.parametrize("value, version, ok", [
    ("2", "2.28.3", True), ("ZERO|efficiency", "2.29.2", True), ("0", "2.27.3", True),
    ("2", "2.27.3", False), ("ZERO", "2.28.3", False), ("4", "2.30.7", False), ("1", "2.21.5", False),
    ("fast", "2.30.7", False),
])
def test_nccl_cta_policy_values_by_version(value, version, ok):
    env = {"NCCL_CTA_POLICY": value}
    if ok:
        validate_env(env, NcclVersion.parse(version))
    else:
        with pytest.raises(LagomError, match=rf"env NCCL_CTA_POLICY='{value}' is not valid on NCCL {version}"):
            validate_env(env, NcclVersion.parse(version))


def test_stored_paths_are_relative_to_the_files_folder_or_absolute_and_resolve_from_anywhere(tmp_path,
                                                                                              monkeypatch):
    (tmp_path / "proj" / "traces").mkdir(parents=True)
    shutil.copyfile(TRACE, tmp_path / "proj" / "traces" / "t.json.gz")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    assert stored_path("traces/t.json.gz", "workload", "out.yaml") == "traces/t.json.gz"  # under the file's folder
    outside = stored_path("traces/t.json.gz", "workload", tmp_path / "elsewhere" / "s.yaml")
    assert outside == str(tmp_path / "proj" / "traces" / "t.json.gz")  # elsewhere: absolute
    assert stored_path("fsdp:phi2:gpus=16", "workload", "out.yaml") == "fsdp:phi2:gpus=16"
    assert stored_path("low-bw", "cluster", "out.yaml") == "low-bw"
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert resolve_stored("traces/t.json.gz", "workload", tmp_path / "proj" / "s.yaml") == (
        str(tmp_path / "proj" / "traces" / "t.json.gz"), None)
    with pytest.raises(LagomError, match=r"s.yaml: workload traces/t.json.gz: no such file relative to the file's "
                                         r"folder \(\S+elsewhere\), where a tuned file's paths resolve$"):
        resolve_stored("traces/t.json.gz", "workload", tmp_path / "elsewhere" / "s.yaml")


def test_an_old_file_with_a_path_relative_to_the_current_folder_is_read_from_it_with_one_note(tmp_path,
                                                                                                monkeypatch):
    (tmp_path / "work" / "traces").mkdir(parents=True)
    shutil.copyfile(TRACE, tmp_path / "work" / "traces" / "t.json.gz")
    seed = _write(tmp_path / "mail" / "s.yaml", workload="traces/t.json.gz")  # what lagom tune wrote before
    monkeypatch.chdir(tmp_path / "work")
    checked = preflight(load_tuned_config(seed), seed, {}, ranks_read_stored=True)
    assert checked.config.workload == str(tmp_path / "work" / "traces" / "t.json.gz") and checked.changed
    assert len(checked.messages) == 1 and "found from the current folder instead" in checked.messages[0]


def test_the_run_folders_copy_names_the_files_paths_absolutely_and_a_plain_run_only_notes_a_bad_one(tmp_path,
                                                                                                      monkeypatch):
    shutil.copyfile(TRACE, tmp_path / "t.json.gz")
    good = _write(tmp_path / "good.yaml", workload="t.json.gz")
    monkeypatch.chdir("/")
    setup = launcher.prepare(good, tmp_path / "wd1", base_env={}, use_plugin=False)
    assert load_tuned_config(setup.run_dir / "lagom.yaml").workload == str(tmp_path / "t.json.gz")
    # a plain run reads neither the workload nor the cluster: a missing one is one note, and the job runs
    bad = _write(tmp_path / "bad.yaml", workload="gone.json.gz", cluster="no-such-cluster")
    setup = launcher.prepare(bad, tmp_path / "wd2", base_env={}, use_plugin=False)
    notes = [m for m in setup.messages if "note:" in m]
    assert len(notes) == 2 and "gone.json.gz: no such file" in notes[0] and "no-such-cluster" in notes[1], notes


def test_an_online_seed_from_another_folder_passes_the_checks_and_its_ranks_get_absolute_paths(tmp_path,
                                                                                                monkeypatch):
    save_workload(generate_workload("tp:phi2:tp=8,dp=1"), tmp_path / "w.json")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(load_cluster("low-bw").to_dict()))
    seed = _write(tmp_path / "seed.yaml", workload="w.json", cluster="./c.yaml")
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")
    monkeypatch.delenv(launcher.PLUGIN_ENV, raising=False)
    monkeypatch.setattr(launcher, "_has_gpu", lambda: False)  # the clock's line only: spares importing torch
    setup = launcher.prepare_online(launcher.OnlineRequest(), seed, tmp_path / "wd")
    copy = load_tuned_config(setup.run_dir / "lagom.yaml")
    assert (copy.workload, copy.cluster) == (str(tmp_path / "w.json"), str(tmp_path / "c.yaml"))
    assert copy.collectives == load_tuned_config(seed).collectives


@pytest.mark.slow
def test_an_online_gloo_job_started_from_another_folder_runs(tmp_path):
    """The reproducer: a file lagom tune wrote in the checkout, run --online from another folder. Before,
    every rank died "online tuning failed: ... not a file (status 3)"."""
    seed = _write(tmp_path / "cfg" / "seed.yaml", workload="t.json.gz", collectives=[])
    shutil.copyfile(TRACE, tmp_path / "cfg" / "t.json.gz")
    (tmp_path / "job").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NCCL_", "LAGOM_", "TORCH_NCCL_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    job = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(REPO_ROOT / "tests" / "online_job.py"), "--out", str(tmp_path / "out"), "--steps", "6"]
    done = subprocess.run([sys.executable, "-m", "lagom", "run", "--online", "--config", str(seed), "--budget-steps",
                           "4", "--", *job], cwd=tmp_path / "job", env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "online tuning failed" not in done.stderr and "online tuning done" in done.stderr, done.stderr[-3000:]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"rank-0.json", "rank-1.json"}


def _lines(tmp_path: Path, env: dict[str, str], name: str = "c.yaml", use_plugin: bool = False,
           **changes) -> list[str]:
    setup = launcher.prepare(_write(tmp_path / name, **changes), tmp_path / f"wd-{name}", base_env=env,
                             use_plugin=use_plugin)
    return [m for m in setup.messages if m.startswith("lagom run: your NCCL_")]


def test_a_users_nccl_variable_that_caps_or_overrides_a_tuned_value_gets_one_line(tmp_path):
    groups = {"process_groups": {"0": {"min_ctas": 12}}}
    assert _lines(tmp_path, {"NCCL_MAX_NCHANNELS": "4"}) == [
        "lagom run: your NCCL_MAX_NCHANNELS=4 caps the tuned 8-12 channels of 2 collective entries"]
    assert _lines(tmp_path, {"NCCL_MAX_CTAS": "2"}, "g.yaml", **groups) == [
        "lagom run: your NCCL_MAX_CTAS=2 caps the tuned 8-12 channels of 2 collective entries and process group "
        "'0' (min_ctas 12)"]
    assert _lines(tmp_path, {"NCCL_ALGO": "Tree"}) == [
        "lagom run: your NCCL_ALGO=Tree rules out the tuned ring algorithm of 1 collective entry"]
    assert _lines(tmp_path, {"NCCL_MIN_NCHANNELS": "10", "NCCL_ALGO": "^tree"}) == [
        "lagom run: your NCCL_MIN_NCHANNELS=10 raises the tuned 8 channels of 1 collective entry"]
    # through the plugin a collective's channels are capped by the communicator's, never raised by them
    assert _lines(tmp_path, {"NCCL_MIN_NCHANNELS": "10", "NCCL_MAX_NCHANNELS": "10"}, "p.yaml", use_plugin=True) == [
        "lagom run: your NCCL_MAX_NCHANNELS=10 caps the tuned 12 channels of 1 collective entry"]
    # values that change no tuned setting, and a variable of the file's own env (merge_env says that one)
    quiet = {"NCCL_MAX_NCHANNELS": "32", "NCCL_ALGO": "ring,tree", "NCCL_NTHREADS": "512", "NCCL_PROTO": "LL"}
    assert _lines(tmp_path, quiet) == []


def test_every_variable_of_the_knob_table_has_one_effect_row():
    assert [e.name for e in EFFECTS] == list(dict.fromkeys(e.name for e in EFFECTS))
    assert {e.name for e in EFFECTS} == {name for knob in KNOBS for name in knob.env}


def test_lagom_run_names_the_cap_before_the_job(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "4")
    path = _write(tmp_path / "c.yaml")
    assert main(["run", "--config", str(path), "--no-plugin", "--", sys.executable, "-c", "print('ran')"]) == 0
    out, err = capfd.readouterr()
    assert out == "ran\n"
    assert "lagom run: your NCCL_MAX_NCHANNELS=4 caps the tuned 8-12 channels of 2 collective entries\n" in err, err
