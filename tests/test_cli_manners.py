"""The CLI's manners: version, plain-text help, 100-column reports on a pipe, and a
shadowed package named rather than a traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import EXAMPLES, REPO_ROOT

from costmodel.cluster import load_cluster
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


# ---- every table fits 80 and 100 columns, with every number whole -------------------------------
_WIDE_TRACE = str(EXAMPLES / "a100_w2_allreduce_broadcast.json.gz")
_REPORTS = {
    "analyze": ["analyze", _WIDE_TRACE],
    "simulate-trace": ["simulate", _WIDE_TRACE],
    "simulate-spec": ["simulate", "tp:llama3-8b:tp=8,dp=2", "--cluster", "low-bw"],
    "tune-spec": ["tune", "tp:llama3-8b:tp=8,dp=2", "--cluster", "low-bw", "--evaluator", "sim", "--budget", "6",
                  "--no-autoccl", "-o", "tune-spec.yaml"],
    "tune-trace": ["tune", _WIDE_TRACE, "--evaluator", "sim", "--budget", "6", "--no-autoccl", "-o",
                   "tune-trace.yaml"],
    "calibrate": ["calibrate", "--backend", "sim:low-bw", "--budget", "20", "-o", "calibrate.yaml"],
    "doctor": ["doctor"],
}
_NUMBER = re.compile(r"(?<![\w.])[-+]?[0-9][0-9,]*(?:\.[0-9]+)?")


def _numbers(out: str) -> list[str]:
    """The numbers a report prints (sorted: a narrower table wraps its cells in another order); a timing
    ("in 5.1 s") differs from run to run and is left out."""
    return sorted(_NUMBER.findall(re.sub(r"evaluations in [0-9.]+ s", "", " ".join(out.split()))))


@pytest.mark.slow  # seven commands at three widths (the trace's replay and tuning take seconds)
@pytest.mark.parametrize("name", sorted(_REPORTS))
def test_every_report_fits_80_and_100_columns_without_cutting_a_number(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # output files without digits in their path: every digit printed is a figure
    outs = {}
    for columns in (400, 100, 80):
        monkeypatch.setenv("COLUMNS", str(columns))
        code = main(_REPORTS[name])
        outs[columns] = capsys.readouterr().out
        assert code in (0, 1), (name, code)  # doctor: 1 when it finds a problem on this machine
        lines = outs[columns].splitlines()
        assert lines and max(len(line) for line in lines) <= columns, (name, columns, outs[columns])
        assert "…" not in outs[columns], (name, columns, outs[columns])
    if name != "doctor":  # its numbers are inside paths, which fold
        assert _numbers(outs[80]) == _numbers(outs[100]) == _numbers(outs[400]), name


@pytest.mark.parametrize("action", ["build", "table", "check"])
def test_plugin_actions_describe_themselves(action, capsys):
    with pytest.raises(SystemExit):
        main(["plugin", action, "--help"])
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    description = rest.split("\n\n")[0]
    assert usage.startswith(f"usage: lagom plugin {action}")
    assert len(description.split()) > 20 and not description.startswith(("positional", "options")), description


def test_cluster_takes_a_preset_or_a_file_in_every_command(tmp_path):
    from lagom.cli import build_parser

    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text(load_cluster("a100-nvswitch").to_yaml())
    parser = build_parser()
    for value in ("a100-nvswitch", str(cluster_file)):
        for argv in (["bench", "--cluster", value], ["tune", "x", "--cluster", value],
                     ["simulate", "x", "--cluster", value], ["calibrate", "--backend", "torch", "--cluster", value],
                     ["run", "--online", "--simulate", "x", "--cluster", value]):
            assert parser.parse_args(argv).cluster in (value, [value])
