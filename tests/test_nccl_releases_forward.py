"""Releases forward (issue 30): the newest release Lagom knows runs with no word; a newer one is
accepted from a flag, a file or a trace alike, said in one warning line and modelled as the newest
known; a never-released version at or below the newest stays refused; a trace's version as
distributions write it is the release it names (issue 32)."""

from __future__ import annotations

import pytest
import yaml
from conftest import run_cli
from kineto_builder import TraceBuilder

from costmodel.cluster import load_cluster
from lagom.files.tuned_config import load_tuned_config
from nccl_env.errors import LagomError
from nccl_env.nccl_releases import NEWEST_RELEASE, RELEASED, released_version, reported_version
from nccl_env.rules import NcclVersion

NEWER_LINE = ("warning: NCCL 2.33.1 is newer than the newest release Lagom knows (2.32.6): "
              "modelled as 2.32.6")


def _newer_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "newer than the newest release" in line]


def _h100_trace(tmp_path, nccl_version: str):
    b = TraceBuilder(rank=0, world_size=8, device="NVIDIA H100 80GB HBM3", nccl_version=nccl_version)
    args: dict = {"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 22,
                  "Out msg nelems": 1 << 22, "Process Group Name": "0", "Group size": 8}
    for step in range(3):
        t0 = step * 400
        b.kernel("gemm", 7, t0 + 100, 150)
        b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, t0 + 110,
                 60, **args)
    return b.write(tmp_path / f"h100_{nccl_version}.json")


def test_the_release_list_reaches_2_32_6():
    assert RELEASED[-1] == NcclVersion(2, 32, 6) == NEWEST_RELEASE
    assert released_version("2.32.6", "--nccl-version") == NcclVersion(2, 32, 6)


def test_never_released_at_or_below_the_newest_is_refused_newer_is_modelled_as_the_newest(capsys):
    with pytest.raises(LagomError, match=r"NCCL never released 2.30.1 .*closest: 2.30.3, 2.30.4, 2.30.7\)$"):
        released_version("2.30.1", "--nccl-version")
    with pytest.raises(LagomError, match=r"NCCL never released 2.32.4 .*closest: 2.32.3, 2.32.6\)$"):
        released_version("2.32.4", "--nccl-version")
    assert released_version("2.99.1", "nccl_version") == NEWEST_RELEASE  # newer: accepted, as 2.33.1
    assert reported_version("2.99.1", "trace") == NEWEST_RELEASE
    assert _newer_lines(capsys.readouterr().err) == [
        "warning: NCCL 2.99.1 is newer than the newest release Lagom knows (2.32.6): modelled as 2.32.6"]


@pytest.mark.parametrize("text", ["2.21.5-1+cuda12.4", "2.21.5+cuda12.4", "2.21.5-1", "v2.21.5-1"])
def test_distribution_version_strings_are_the_release_they_name(text):
    assert reported_version(text, "trace") == NcclVersion(2, 21, 5)
    assert released_version(text, "nccl_version") == NcclVersion(2, 21, 5)


def test_a_trace_with_a_distribution_version_string_is_modelled_on_that_release(tmp_path, capsys):
    trace = _h100_trace(tmp_path, "2.21.5-1+cuda12.4")
    tuned = tmp_path / "x.yaml"
    code, _, err = run_cli(capsys, "tune", str(trace), "--budget", "2", "--no-autoccl", "-o", str(tuned))
    assert code == 0, err
    assert "not an NCCL version" not in err
    assert "note: NCCL 2.21.5 from the trace's distributedInfo" in err
    assert str(load_tuned_config(tuned).nccl_version) == "2.21.5"


@pytest.mark.parametrize("command", ["simulate", "tune"])
@pytest.mark.parametrize("version, lines", [("2.32.6", []), ("2.33.1", [NEWER_LINE])])
def test_the_newest_release_as_a_flag_runs_silently_a_newer_one_with_one_warning_line(tmp_path, capsys, command,
                                                                                       version, lines):
    out = [] if command == "simulate" else ["--budget", "2", "--no-autoccl", "-o", str(tmp_path / "x.yaml")]
    code, _, err = run_cli(capsys, command, "fsdp:llama3-8b:gpus=8", "--cluster", "h100-nvswitch",
                           "--nccl-version", version, *out)
    assert code == 0, err
    assert _newer_lines(err) == lines, err
    assert "warning" not in err or lines, err
    if command == "tune":
        assert load_tuned_config(tmp_path / "x.yaml").nccl_version == NEWEST_RELEASE


@pytest.mark.parametrize("command", ["simulate", "tune"])
def test_a_trace_stating_a_newer_release_runs_with_one_warning_line(tmp_path, capsys, command):
    trace = _h100_trace(tmp_path, "2.33.1")
    out = ["--json"] if command == "simulate" else ["--budget", "2", "--no-autoccl", "-o", str(tmp_path / "x.yaml")]
    code, _, err = run_cli(capsys, command, str(trace), *out)
    assert code == 0, err
    assert _newer_lines(err) == [NEWER_LINE], err
    assert "not an NCCL version" not in err
    # the flag and the trace agree: both say 2.33.1, nothing differs, no second line
    code, _, err = run_cli(capsys, command, str(trace), "--nccl-version", "2.33.1", *out)
    assert code == 0, err
    assert _newer_lines(err) == [NEWER_LINE], err
    assert "the trace ran NCCL" not in err


def test_a_cluster_and_a_tuned_file_stating_a_newer_release_are_accepted(tmp_path, capsys):
    cluster = load_cluster("h100-nvswitch").to_dict()
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**cluster, "nccl_version": "2.33.1"}))
    tuned = tmp_path / "x.yaml"
    code, _, err = run_cli(capsys, "tune", "fsdp:llama3-8b:gpus=8", "--cluster", str(path), "--budget", "2",
                           "--no-autoccl", "-o", str(tuned))
    assert code == 0, err
    assert _newer_lines(err) == [NEWER_LINE], err
    doc = yaml.safe_load(tuned.read_text())
    tuned.write_text(yaml.safe_dump({**doc, "nccl_version": "2.33.1"}))
    code, _, err = run_cli(capsys, "simulate", "fsdp:llama3-8b:gpus=8", "--cluster", "h100-nvswitch",
                           "--config", str(tuned))
    assert code == 0, err
    assert _newer_lines(err) == [NEWER_LINE], err
