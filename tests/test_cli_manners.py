"""The CLI's manners: version, plain-text help, 100-column reports on a pipe, and a
shadowed package named rather than a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from lagom import __version__
from lagom.cli import COMMANDS, main
from lagom.package_check import shadowed


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"lagom {__version__}\n"


@pytest.mark.parametrize("command", [[]] + [[c] for c in COMMANDS] + [["plugin", "table"], ["plugin", "build"]])
def test_help_is_plain_text(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: lagom")
    assert "`" not in out and ":mod:" not in out and ":class:" not in out, out


def test_tune_report_fits_100_columns_on_a_pipe(tmp_path, capsys):
    # wide signature labels: two groups, 16 GPUs on 2 nodes
    assert main(["tune", "tp:llama3-8b:tp=8,dp=2", "--cluster", "low-bw", "--evaluator", "sim", "--budget", "6",
                 "--no-autoccl", "-o", str(tmp_path / "lagom.yaml")]) == 0
    out = capsys.readouterr().out
    assert "allreduce[dp]" in out and "allreduce[tp]" in out  # group names are not eaten as markup
    assert max(len(line.rstrip()) for line in out.splitlines()) <= 100, out
    assert "…" not in out, out


def test_this_checkout_is_not_shadowed():
    assert shadowed() == []


@pytest.mark.parametrize("name", ["tuner", "nccl_env"])
def test_a_shadowing_module_is_named_not_a_traceback(tmp_path, name):
    (tmp_path / f"{name}.py").write_text("x = 1\n")  # a stray file in the folder the command runs from
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lagom", "doctor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{name} resolves to {tmp_path / f'{name}.py'}, which shadows Lagom's" in proc.stderr, proc.stderr


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    assert main(["calibrate", "--backend", "sim:low-bw", "--budget", "40", "-o", str(tmp_path / "c.yaml")]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("calibrate sim:low-bw: ")]
    assert lines[0] == "calibrate sim:low-bw: started (40 steps)"
    assert lines[-1] == "calibrate sim:low-bw: done (40 steps)"
    assert [line.split(": ")[1].split()[0] for line in lines[1:-1]] == ["10/40", "20/40", "30/40"], lines
