"""Files a user owns are never lost (lagom/files/output_paths.py and its users).

What the bad-input matrix refuses, here the other side: a file Lagom wrote is replaced
when the same command runs again, ``--force`` replaces a user's file, a link keeps
pointing where it did, a write leaves no temporary file behind, an earlier run's
``--workdir`` is reused, and online tuning's plan survives a bad ``--save`` and a Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES

from lagom.cli import main
from lagom.files.output_paths import OutputFormat, check_output, write_output
from lagom.files.tuned_config import TunedConfig, load_tuned_config
from lagom.runtime.launcher import ONLINE_RESULT, OnlineRequest, RunSetup, _interrupt_deferred, _save_online
from nccl_env.errors import LagomError

TRACE = EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"
CONFIG = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.18.3",
          "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 2}}]}


def _tune(out: Path, *extra: str) -> int:
    return main(["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--evaluator", "sim", "--budget", "4",
                 "--no-autoccl", "-o", str(out), "--json", *extra])


def test_a_file_lagom_wrote_is_replaced_and_force_replaces_a_users(tmp_path, capsys):
    out = tmp_path / "lagom.yaml"
    assert _tune(out) == 0 and _tune(out) == 0  # its own file, twice
    mine = tmp_path / "mine.yaml"
    mine.write_text("my notes\n")
    assert _tune(mine) == 2
    assert mine.read_text() == "my notes\n"
    assert _tune(mine, "--force") == 0
    assert load_tuned_config(mine).method == "lagom"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lagom.yaml", "mine.yaml"]  # no temporary file left
    capsys.readouterr()


def test_a_link_keeps_pointing_where_it_did(tmp_path, capsys):
    target = tmp_path / "real.yaml"
    link = tmp_path / "link.yaml"
    assert _tune(target) == 0
    link.symlink_to(target)
    before = target.stat().st_mtime_ns
    assert _tune(link) == 0
    assert link.is_symlink() and link.resolve() == target and target.stat().st_mtime_ns >= before
    capsys.readouterr()


@pytest.mark.parametrize("fmt, text", [
    (OutputFormat.TUNED_CONFIG, TunedConfig(method="nccl").to_yaml()),
    (OutputFormat.AUDIT, '{\n "format": "lagom.audit",\n "version": 1\n}\n'),
    (OutputFormat.CLUSTER, "# Lagom cluster file (fitted against sim:low-bw; --cluster takes it)\nname: x\n"),
])
def test_each_format_knows_its_own_files_and_no_other(tmp_path, fmt, text):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write_output(ours, text)
    theirs.write_text(text.replace("agom", "ogam"))
    assert check_output("-o", ours, fmt) == ours
    with pytest.raises(LagomError, match="give --force"):
        check_output("-o", theirs, fmt)
    assert check_output("-o", theirs, fmt, force=True) == theirs


def test_a_hard_link_to_an_input_is_the_input(tmp_path):
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(TRACE.read_bytes())
    os.link(trace, tmp_path / "same.json.gz")
    with pytest.raises(LagomError, match="is also this command's input"):
        check_output("-o", tmp_path / "same.json.gz", OutputFormat.TUNED_CONFIG, [("WORKLOAD", str(trace))])
    with pytest.raises(LagomError, match="is also this command's input"):  # a folder input: its files
        check_output("-o", trace, OutputFormat.TUNED_CONFIG, [("WORKLOAD", str(tmp_path))])


@pytest.mark.slow  # two analyses of the bundled trace with their plots: about 4 s
def test_plots_and_tables_carry_their_marker(tmp_path, capsys):
    plot = tmp_path / "t.png"
    assert main(["analyze", str(TRACE), "--plot", str(plot), "--json"]) == 0
    assert main(["analyze", str(TRACE), "--plot", str(plot), "--json"]) == 0  # Lagom's own plot: replaced
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and OutputFormat.PLOT.written_by_lagom(plot)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    table = tmp_path / "table.csv"
    assert main(["plugin", "table", str(cfg), "-o", str(table)]) == 0
    assert main(["plugin", "table", str(cfg), "-o", str(table)]) == 0
    capsys.readouterr()


def test_calibrate_takes_o_and_still_takes_out_saying_it_is_deprecated(tmp_path, capsys):
    calibrate = ["calibrate", "--backend", "sim:low-bw", "--measurements", "20"]
    assert main([*calibrate, "-o", str(tmp_path / "a.yaml")]) == 0
    assert main([*calibrate, "--out", str(tmp_path / "a.yaml")]) == 0
    err = capsys.readouterr().err
    assert "lagom calibrate: warning: --out is deprecated; use -o/--output" in err
    assert (tmp_path / "a.yaml").read_text().startswith("# Lagom cluster file")


def test_run_workdir_is_new_empty_or_an_earlier_runs(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    wd = tmp_path / "wd"
    job = ["--no-plugin", "--", sys.executable, "-c", "pass"]
    assert main(["run", "--config", str(cfg), "--workdir", str(wd), *job]) == 0  # new
    assert main(["run", "--config", str(cfg), "--workdir", str(wd), *job]) == 0  # an earlier run's
    assert main(["run", "--config", str(wd / "lagom.yaml"), "--workdir", str(wd), *job]) == 0  # its own copy
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", "--config", str(cfg), "--workdir", str(empty), *job]) == 0
    capsys.readouterr()


def _setup(run_dir: Path) -> RunSetup:
    run_dir.mkdir()
    (run_dir / ONLINE_RESULT).write_text(TunedConfig(method="lagom-online").to_yaml())
    return RunSetup(config=TunedConfig(), config_path=run_dir / "lagom.yaml", run_dir=run_dir, env={})


def test_online_plan_is_saved_after_a_late_interrupt_and_beside_the_audit_when_save_fails(tmp_path, capsys):
    setup = _setup(tmp_path / "run")
    save = tmp_path / "out" / "tuned.yaml"
    save.parent.mkdir()
    # the job was interrupted after tuning had ended (status 130): the plan is saved all the same
    assert _save_online(setup, OnlineRequest(save=str(save)), 130, sys.stderr, None, temporary=True) is False
    assert load_tuned_config(save).method == "lagom-online"
    assert "plan saved to" in capsys.readouterr().err  # no outcome file: "online tuning ended; its plan saved to"
    # --save's folder went away during the job: the plan goes beside the audit, and the line says where
    save.unlink()
    save.parent.rmdir()
    audit = tmp_path / "audit.json"
    assert _save_online(setup, OnlineRequest(save=str(save)), 0, sys.stderr, str(audit), temporary=True) is False
    beside = tmp_path / f"audit.{ONLINE_RESULT}"
    assert load_tuned_config(beside).method == "lagom-online"
    err = capsys.readouterr().err
    assert f"tuned plan saved beside the audit instead: {beside}" in err
    # and without an audit the run folder is kept, with its path said
    assert _save_online(setup, OnlineRequest(save=str(save)), 0, sys.stderr, None, temporary=True) is True
    assert f"tuned plan kept in the run folder instead: {setup.run_dir / ONLINE_RESULT}" in capsys.readouterr().err


def test_a_ctrl_c_after_the_job_waits_for_the_files(tmp_path):
    written = tmp_path / "written"
    # Python's own handler, whatever this test process had before (a worker of the suite may start
    # with SIGINT ignored): the block must put back what it found
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), _interrupt_deferred():
            os.kill(os.getpid(), signal.SIGINT)  # a real SIGINT, delivered inside the block
            written.write_text("saved")  # still runs: the interrupt waits for the block's end
        assert written.read_text() == "saved"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_file_that_appears_or_changes_after_the_check_is_not_replaced(tmp_path):
    """Issue 24: the check ran only before the work; a file created at -o during a long tune was replaced."""
    out = tmp_path / "lagom.yaml"
    checked = check_output("-o", out, OutputFormat.TUNED_CONFIG)
    out.write_text("# mine, written while the command worked\n")
    with pytest.raises(LagomError, match=r"appeared or changed since this command checked it .*the new one is "
                                         r"\S+lagom.yaml.new \(give --force to replace\)"):
        write_output(checked, "format: lagom.tuned-config\n", "-o")
    assert out.read_text() == "# mine, written while the command worked\n"
    assert (tmp_path / "lagom.yaml.new").read_text() == "format: lagom.tuned-config\n"
    check_output("-o", out, OutputFormat.TUNED_CONFIG, force=True)  # the user's file now: --force to replace it
    out.write_text("# changed again\n")
    out_checked = check_output("-o", out, OutputFormat.TUNED_CONFIG, force=True)
    os.utime(out, ns=(0, 0))  # changed after this check too: with --force it is replaced all the same
    write_output(out_checked, "format: lagom.tuned-config\n# forced\n", "-o")
    assert out.read_text().endswith("# forced\n")
    check_output("-o", out, OutputFormat.TUNED_CONFIG)
    out.write_text("format: lagom.tuned-config\n# another program's\n")
    with pytest.raises(LagomError, match=r"the new one is \S+lagom.yaml.new2 "):  # never over the first .new
        write_output(out, "format: lagom.tuned-config\n", "-o")
    check_output("-o", out, OutputFormat.TUNED_CONFIG)  # unchanged since the check: replaced
    write_output(out, "format: lagom.tuned-config\n# again\n", "-o")
    assert out.read_text().endswith("# again\n")
