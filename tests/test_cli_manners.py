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
from lagom.orchestration.package_check import shadowed


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
    assert main(["calibrate", "--backend", "sim:low-bw", "--measurements", "40", "-o", str(tmp_path / "c.yaml")]) == 0
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
    "calibrate": ["calibrate", "--backend", "sim:low-bw", "--measurements", "20", "-o", "calibrate.yaml"],
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


# ---- one vocabulary, 80 columns ----------------------------------------------------------------
_HELP_COMMANDS = [[c] for c in COMMANDS] + [["plugin", a] for a in ("build", "table", "check")] + [[]]


@pytest.mark.parametrize("columns", ["80", "200", "60"])
@pytest.mark.parametrize("command", _HELP_COMMANDS, ids=lambda c: " ".join(c) or "lagom")
def test_help_fits_80_columns_and_wraps_between_words(command, columns, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if len(line) > 80] == []  # 60: narrower, but a long token stays whole
    # wrapped between words: no line ends inside a flag or a word that the next line continues
    words = set(out.split())
    for flag in ("--nccl-version", "--evaluator", "--cluster", "--json"):
        if flag in out:
            assert any(w.startswith(flag) for w in words)


def _shared_actions(option: str) -> dict[str, object]:
    """Every (sub)command's action for ``option``, by command name."""
    import argparse

    from lagom.cli import build_parser

    found = {}
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if option in action.option_strings:
                found[name] = action
    return found


@pytest.mark.parametrize("option, commands", [
    ("--cluster", {"analyze", "simulate", "tune", "run", "calibrate", "bench"}),
    ("--nccl-version", {"simulate", "tune", "run", "calibrate", "bench"}),
    ("--evaluator", {"simulate", "tune", "bench"}),
    ("--noise", {"simulate", "run", "calibrate"}),
    ("--seed", {"simulate", "tune", "calibrate"}),
    ("--json", {"record", "analyze", "simulate", "tune", "run", "calibrate", "bench", "doctor"}),
])
def test_a_shared_flag_has_one_metavar_default_and_meaning(option, commands):
    from lagom.args import common_args

    actions = _shared_actions(option)
    assert set(actions) == commands, option
    shared = {"--cluster": common_args.CLUSTER_HELP, "--nccl-version": common_args.NCCL_VERSION_HELP,
              "--evaluator": common_args.EVALUATOR_HELP, "--noise": common_args.NOISE_HELP,
              "--seed": common_args.SEED_HELP, "--json": common_args.JSON_HELP}[option]
    for name, action in actions.items():
        assert action.help.startswith(shared), (option, name, action.help)
    for attribute in ("metavar", "choices", "type"):
        assert len({str(getattr(a, attribute)) for a in actions.values()}) == 1, (option, attribute)
    defaults = {getattr(a, "default", None) for a in actions.values()}
    assert len(defaults) == 1 and (defaults <= {None, False}), (option, defaults)


def test_evaluator_help_says_why_its_default_differs():
    helps = {name: a.help for name, a in _shared_actions("--evaluator").items()}
    assert "default: sim (" in helps["simulate"] and "default: analytic (" in helps["tune"]


@pytest.mark.parametrize("argv, command", [
    (["analyze", "x.json", "-o", "out"], "lagom analyze"),
    (["doctor", "--budget", "3"], "lagom doctor"),
    (["plugin", "table", "t.yaml", "--json"], "lagom plugin table"),
])
def test_an_option_a_command_lacks_names_that_commands_help(argv, command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{command}: error: unrecognized arguments") and f"(see '{command} --help')" in err, err
    assert err.count("\n") == 1


def test_the_readme_stays_short():
    # the words a reader reads: bench/figures.py's markers are HTML comments, not shown
    words = len(re.sub(r"<!--.*?-->", " ", (REPO_ROOT / "README.md").read_text()).split())
    assert words <= 2000, f"README.md has {words} words: move detail to docs/"


def test_a_narrow_table_keeps_every_header_word_and_number_whole():
    from rich.console import Console
    from rich.table import Table

    from lagom.reports.console import fit_columns

    table = Table(title="profiler steps")
    headers = ("step", "measured", "replayed", "tuned", "coll.", "exposed", "critical")
    for h in headers:
        table.add_column(h, justify="right")
    table.add_row("ProfilerStep#4", "222.05", "222.05", "222.05", "11.99>11.99", "10.16>10.16", "0.00")
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(fit_columns(table, 80))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    words = text.split()
    for word in (*headers, "ProfilerStep#4", "11.99>11.99", "10.16>10.16"):
        assert word in words, (word, text)


def test_calibrates_old_budget_spelling_warns_once_and_names_itself(tmp_path, capsys):
    assert main(["calibrate", "--backend", "sim:low-bw", "--budget", "5", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["lagom calibrate: warning: --budget is deprecated; use --measurements",
                   "lagom calibrate: error: --budget 5: must be between 20 and 100000"], err


def test_simulate_honours_a_tuned_files_own_nccl_version(tmp_path, capsys):
    """A file tuned for NCCL 2.30.7 (copy engines) on a cluster whose preset says 2.18.3: simulate
    reads the file's version unless --nccl-version overrides it."""
    config = tmp_path / "lagom.yaml"
    config.write_text("format: lagom.tuned-config\nversion: 1\nnccl_version: 2.30.7\ncollectives:\n"
                      "- match: {collective: allgather}\n  set: {path: copy_engine}\n")
    argv = ["simulate", "fsdp:llama3-8b:gpus=8", "--cluster", "h100-nvswitch", "--config", str(config), "--json"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--nccl-version", "2.18.3"]) == 2
    assert "path=copy_engine is not valid on NCCL 2.18.3" in capsys.readouterr().err


def test_tune_takes_a_seed(tmp_path, capsys):
    assert main(["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--method", "optuna", "--budget", "8", "--seed", "-1",
                 "-o", str(tmp_path / "t.yaml")]) == 2
    assert "--seed must be >= 0" in capsys.readouterr().err


def test_record_json_says_what_was_recorded(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lagom", "record", "-o", str(tmp_path / "rec"), "--json", "--",
                           sys.executable, "-c", "pass"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the job succeeded, the recording (no step at all) did not
    import json

    summary = json.loads(proc.stdout.splitlines()[-1])
    assert summary["exit_status"] == 1 and summary["traces"] == [] and summary["window"]["active"] == 5


@pytest.mark.slow  # a real gloo job under lagom run (about 10 s)
def test_run_json_summarises_the_job_and_its_collectives(tmp_path):
    config = tmp_path / "lagom.yaml"
    config.write_text("format: lagom.tuned-config\nversion: 1\ncollectives:\n"
                      "- match: {collective: allreduce, max_bytes: 64}\n  set: {channels: 2}\n")
    job = ("import torch, torch.distributed as d; d.init_process_group('gloo', store=d.HashStore(), rank=0, "
           "world_size=1); [d.all_reduce(torch.ones(4)) for _ in range(3)]; d.all_reduce(torch.ones(64)); "
           "print('job out')")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "lagom", "run", "--config", str(config), "--no-plugin", "--json",
                           "--", sys.executable, "-c", job], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    import json

    lines = proc.stdout.splitlines()
    assert lines[0] == "job out"
    summary = json.loads(lines[-1])
    assert summary["exit_status"] == 0 and summary["ranks"] == 1 and summary["audit"] is None
    assert summary["summary"] == {"collectives": 4, "matched": 3, "bytes": 3 * 16 + 256, "bytes_matched": 48}


def test_noise_has_one_default_for_a_spec_and_none_for_a_trace(tmp_path):
    """run --online --simulate takes --noise as simulate does: the simulator's spread (0.01) for a
    spec or a workload file, none for a trace (replayed from its measured times)."""
    from lagom.args.common_args import DEFAULT_NOISE
    from lagom.commands.run import _default_noise

    assert _default_noise("tp:phi2:tp=8") == DEFAULT_NOISE == 0.01
    assert _default_noise(_WIDE_TRACE) == 0.0
