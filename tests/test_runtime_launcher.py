"""`lagom run` as a launcher: bad input, exit status, signals, the run folder.

The jobs here are small Python children (no torch) so each case costs well under a
second; the torchrun jobs are in test_runtime_e2e.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT

from lagom.cli import main

CONFIG = {
    "format": "lagom.tuned-config",
    "version": 1,
    "nccl_version": "2.18.3",
    "env": {"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "2097152"},
    "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 2}}],
}


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "lagom.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda d, c: ["run", "--config", str(d / "missing.yaml"), "--", "true"], "missing.yaml: no such file"),
        (lambda d, c: ["run", "--config", str(d / "corrupt.yaml"), "--", "true"], "corrupt.yaml: not valid YAML"),
        (lambda d, c: ["run", "--config", str(d / "other.yaml"), "--", "true"], "not a Lagom tuned config"),
        (lambda d, c: ["run", "--config", str(c)], "no command to run"),
        (lambda d, c: ["run", "--config", str(c), "--"], "no command to run"),
        (lambda d, c: ["run", "--config", str(c), "--no-plugin", "--", str(d / "no-such-program")],
         "command not found"),
        (lambda d, c: ["run", "--config", str(d / "badversion.yaml"), "--no-plugin", "--", "true"], "nccl_version"),
        (lambda d, c: ["run", "--config", str(d / "badpolicy.yaml"), "--no-plugin", "--", "true"],
         "unknown cta_policy 'fastest'"),
        (lambda d, c: ["run", "--config", str(c), "--audit", str(d / "nodir" / "a.json"), "--", "true"],
         "nodir is not an existing folder"),
        (lambda d, c: ["run", "--config", str(c), "--audit", str(d), "--", "true"], "is a folder"),
        (lambda d, c: ["run", "--config", str(d / "envlist.yaml"), "--no-plugin", "--", "true"],
         "env NCCL_NTHREADS: expected a single value"),
        (lambda d, c: ["run", "--config", str(d / "negchannels.yaml"), "--", "true"],
         "negchannels.yaml: collectives[0]: channels=-4 is not valid on NCCL 2.18.3"),
        (lambda d, c: ["run", "--config", str(c), "--noise", "0.1", "--", "true"],
         "--noise is an option of lagom run --online"),
        (lambda d, c: ["run", "--online", "--noise", "0.1", "--", "true"], "--noise goes with --simulate WORKLOAD"),
        (lambda d, c: ["run", "--online", "--cluster", "low-bw", "--", "true"],
         "--cluster goes with --simulate WORKLOAD"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, config_file, capsys, make_args, message):
    (tmp_path / "corrupt.yaml").write_text("format: [unclosed\n")
    (tmp_path / "other.yaml").write_text("a: 1\n")
    (tmp_path / "badversion.yaml").write_text(yaml.safe_dump(dict(CONFIG, nccl_version="two point eighteen")))
    (tmp_path / "envlist.yaml").write_text(yaml.safe_dump(dict(CONFIG, env={"NCCL_NTHREADS": [256]})))
    (tmp_path / "negchannels.yaml").write_text(yaml.safe_dump(dict(
        CONFIG, collectives=[{"match": {"collective": "allgather"}, "set": {"channels": -4}}])))
    (tmp_path / "badpolicy.yaml").write_text(yaml.safe_dump(dict(
        CONFIG, process_groups={"0": {"cta_policy": "fastest"}})))
    assert main(make_args(tmp_path, config_file)) == 2
    line = _error_line(capsys)
    assert line.startswith("lagom run: error: ") and message in line


def test_exit_status_passes_through(config_file, capsys):
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", sys.executable, "-c",
                 "import sys; sys.exit(3)"]) == 3
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", sys.executable, "-c", "pass"]) == 0
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", sys.executable, "-c",
                 killed]) == 128 + signal.SIGKILL


def test_audit_that_cannot_be_written_after_the_job_keeps_the_jobs_status(tmp_path, config_file, capsys):
    # the job replaces the audit's folder by a file: the audit fails after the job ran, and
    # lagom run warns but returns the job's own status (not 2: the job did not fail on bad input)
    folder = tmp_path / "out"
    folder.mkdir()
    job = f"import shutil, sys; shutil.rmtree({str(folder)!r}); open({str(folder)!r}, 'w').close(); sys.exit(5)"
    code = main(["run", "--config", str(config_file), "--no-plugin", "--audit", str(folder / "a.json"),
                 "--", sys.executable, "-c", job])
    assert code == 5
    err = capsys.readouterr().err
    assert "lagom run: warning:" in err and "cannot write the audit" in err


def test_run_folder_env_and_user_wins(tmp_path, config_file, capsys, monkeypatch):
    monkeypatch.setenv("NCCL_NTHREADS", "128")
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    workdir = tmp_path / "wd"
    dump = tmp_path / "env.json"
    child = f"import json, os; json.dump(dict(os.environ), open({str(dump)!r}, 'w'))"
    assert main(["run", "--config", str(config_file), "--no-plugin", "--workdir", str(workdir), "--", sys.executable,
                 "-c", child]) == 0
    env = json.loads(dump.read_text())
    assert env["NCCL_NTHREADS"] == "128" and env["NCCL_BUFFSIZE"] == "2097152"
    assert "NCCL_TUNER_PLUGIN" not in env  # --no-plugin
    boot, rest = env["PYTHONPATH"].split(os.pathsep)
    assert Path(boot) == workdir / "bootstrap" and rest == "/somewhere/else"
    assert (Path(boot) / "sitecustomize.py").is_file()
    assert Path(env["LAGOM_CONFIG"]) == workdir / "lagom.yaml"
    assert yaml.safe_load((workdir / "lagom.yaml").read_text()) == CONFIG
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"lagom run: applying {config_file}: 2 env knob(s), 0 process group(s), 1 collective entry",
        "lagom run: your environment wins for NCCL_NTHREADS=128 (tuned: 256)",
    ]


def test_temporary_run_folder_is_removed(config_file, tmp_path, capsys):
    dump = tmp_path / "dir.txt"
    child = f"import os; open({str(dump)!r}, 'w').write(os.environ['LAGOM_RUN_DIR'])"
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", sys.executable, "-c", child]) == 0
    assert dump.read_text() and not Path(dump.read_text()).exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_reach_the_job_and_its_status_comes_back(tmp_path, config_file, sig):
    ready = tmp_path / "ready"
    got = tmp_path / "got"
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time, pathlib\n"
        "def on(signum, frame):\n"
        f"    pathlib.Path({str(got)!r}).write_text(str(signum)); sys.exit(42)\n"
        "signal.signal(signal.SIGTERM, on); signal.signal(signal.SIGINT, on)\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-m", "lagom", "run", "--config", str(config_file), "--no-plugin", "--", sys.executable,
           str(child)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() is not None else "timeout")
            time.sleep(0.05)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert got.read_text() == str(int(sig))


def _state(pid: int) -> str:
    """A process's state letter from /proc ("" once it is gone; "Z": ended, not reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_job_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path, config_file):
    """Issue 31: a child that traps SIGTERM kept `lagom run` waiting until it ended by itself, then exit 0.
    Here the child also starts a worker in a session of its own (as torchrun does), out of the group's reach."""
    ready, worker = tmp_path / "ready", tmp_path / "worker"
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, subprocess, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda s, f: None)\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], start_new_session=True)\n"
        f"pathlib.Path({str(worker)!r}).write_text(str(w.pid))\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    grace_s = 1.0
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), LAGOM_KILL_GRACE_S=str(grace_s))
    cmd = [sys.executable, "-m", "lagom", "run", "--config", str(config_file), "--no-plugin", "--", sys.executable,
           str(child)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=grace_s + 10)
        took_s = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert status == 128 + signal.SIGKILL and grace_s <= took_s < grace_s + 5, (status, took_s, err)
    assert "lagom run: SIGTERM sent to the job; SIGKILL in 1 s if it has not ended" in err
    assert "did not end within 1 s of SIGTERM: SIGKILL sent to it" in err and "Traceback" not in err
    assert _state(int(worker.read_text())) in ("", "Z")  # the worker in its own session went too


def test_a_job_that_ends_well_after_a_forwarded_signal_still_exits_non_zero(tmp_path, config_file):
    ready = tmp_path / "ready"
    child = tmp_path / "child.py"
    child.write_text(
        "import signal, sys, time, pathlib\n"
        "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "lagom", "run", "--config", str(config_file), "--no-plugin", "--",
                             sys.executable, str(child)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM  # stopped, not finished
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_bad_grace_period_is_refused_before_the_job_starts(config_file, capsys, monkeypatch):
    monkeypatch.setenv("LAGOM_KILL_GRACE_S", "soon")
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", "true"]) == 2
    assert "LAGOM_KILL_GRACE_S=soon: give seconds" in _error_line(capsys)


@pytest.mark.slow
def test_a_ctrl_c_at_any_moment_of_the_start_prints_no_traceback(tmp_path, config_file):
    """Issue 31: a Ctrl-C in lagom run's first half second printed a KeyboardInterrupt traceback (imports),
    and one during orjson's import crashed the interpreter. The job is not Python: its own start is not judged."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    cmd = [sys.executable, "-m", "lagom", "run", "--config", str(config_file), "--no-plugin", "--", "sleep", "30"]
    reached = 0  # tries whose SIGINT came once the interpreter had started
    for delay_s in (0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        frames = [line for line in err.splitlines() if line.lstrip().startswith('File "')]
        if any(python in err for python in ("init_import_site", "Could not import runpy module")) or (
                frames and all(line.lstrip().startswith('File "<frozen ') for line in frames)):
            continue  # on a loaded machine: still the interpreter's own start (site, runpy), before Lagom's code
        reached += 1
        # 130: lagom said "interrupted"; -SIGINT: the signal came before Python's own handler was in place
        assert "Traceback" not in err and proc.returncode in (130, -signal.SIGINT), (delay_s, proc.returncode, err)
    if not reached:
        pytest.skip("every SIGINT came during the interpreter's own start (a loaded machine)")


def test_a_file_for_an_nccl_without_tuner_plugins_says_the_plugin_door_is_closed(tmp_path, config_file, capsys):
    # CONFIG is for NCCL 2.18.3: no tuner-plugin ABI there, so the table cannot act
    # (one message: not "N entries via the tuner plugin" and then a note that contradicts it)
    assert main(["run", "--config", str(config_file), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert "which the file's NCCL 2.18.3 does not load" in err and " via tuner plugin" not in err, err
    newer = tmp_path / "newer.yaml"
    newer.write_text(yaml.safe_dump(dict(CONFIG, nccl_version="2.30.3")))
    assert main(["run", "--config", str(newer), "--", "true"]) == 0
    err = capsys.readouterr().err
    assert " via tuner plugin " in err and "does not load" not in err, err


def test_workers_load_the_launchers_lagom_even_when_another_comes_first(tmp_path, config_file, capsys, monkeypatch):
    """A second install earlier on PYTHONPATH (an old checkout, a site-wide copy) must not
    read this config with its own code: the bootstrap imports from LAGOM_HOME."""
    decoy = tmp_path / "decoy"
    marker = tmp_path / "decoy-ran"
    (decoy / "lagom" / "runtime").mkdir(parents=True)
    (decoy / "lagom" / "__init__.py").write_text("")
    (decoy / "lagom" / "runtime" / "__init__.py").write_text("")
    (decoy / "lagom" / "runtime" / "bootstrap.py").write_text(
        f"def activate():\n    open({str(marker)!r}, 'w').write('decoy')\n")
    for package in ("nccl_env", "traces", "costmodel", "tuner"):
        (decoy / package).mkdir()
        (decoy / package / "__init__.py").write_text("")
    monkeypatch.setenv("PYTHONPATH", str(decoy))
    monkeypatch.chdir(tmp_path)  # not the checkout: the child's sys.path[0] (its cwd) would find the real packages
    dump = tmp_path / "modules.json"
    # traces, costmodel, tuner: imported later in a worker (the recorder, the online session)
    child = ("import json, sys, traces, costmodel, tuner; json.dump({k: sys.modules[k].__file__ for k in "
             f"('lagom', 'nccl_env', 'traces', 'costmodel', 'tuner') if k in sys.modules}}, open({str(dump)!r}, 'w'))")
    assert main(["run", "--config", str(config_file), "--no-plugin", "--", sys.executable, "-c", child]) == 0
    loaded = json.loads(dump.read_text())
    assert not marker.exists()
    assert Path(loaded["lagom"]).resolve() == (REPO_ROOT / "lagom" / "__init__.py").resolve()
    for package in ("nccl_env", "traces", "costmodel", "tuner"):
        assert Path(loaded[package]).resolve() == (REPO_ROOT / package / "__init__.py").resolve()
    assert "warning" not in capsys.readouterr().err


def test_an_entry_for_a_group_the_job_never_ran_is_warned_about_after_the_job(tmp_path, capsys):
    """The job (here: one that writes its rank's audit part as the hook does, collectives in
    group "0") never ran group "tp": the entry naming it matched nothing, and lagom run says so
    in the words simulate --config and plugin table use."""
    config = tmp_path / "lagom.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "collectives": [
        {"match": {"collective": "allgather", "group": "tp"}, "set": {"channels": 2}},
        {"match": {"collective": "allgather", "group": "0"}, "set": {"channels": 4}}]}))
    job = ("import os; from lagom.runtime import audit; "
           "c = audit.SignatureCount('allgather', '0', 2, 1, 4096, 3, 1); "
           "audit.write_rank_part(os.environ['LAGOM_RUN_DIR'], audit.rank_part(0, [c], [], []))")
    code = main(["run", "--config", str(config), "--no-plugin", "--audit", str(tmp_path / "a.json"), "--workdir",
                 str(tmp_path / "wd"), "--", sys.executable, "-c", job])
    assert code == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "'tp'" in line]
    assert said == [f"lagom run: warning: {config}: entry 1 names group 'tp', which the job does not have "
                    "(its groups: '0'): lagom simulate and the hook match no collective with it; the plugin's table, "
                    "which cannot tell groups apart, applies it to every group's collectives of that type and size"]
