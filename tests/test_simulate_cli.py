"""`lagom simulate` end to end (in process), and the WORKLOAD / --set argument parsers."""

from __future__ import annotations

import json

import pytest
from conftest import trace_path

from lagom.args.knob_args import parse_set, parse_size
from lagom.cli import main
from lagom.files.tuned_config import CollectiveEntry, Match, TunedConfig
from lagom.orchestration.workload_arg import load_workload_arg
from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Protocol
from traces.generate import generate_workload
from traces.workload_io import save_workload


def run_json(capsys, *argv) -> dict:
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sizes_and_set():
    assert parse_size("2MiB") == 2 << 20 and parse_size("684KB") == 684 * 1024 and parse_size("4096") == 4096
    cfg = parse_set("channels=16,chunk=2MiB,threads=256,algorithm=ring,protocol=simple")
    assert cfg == CommConfig(Algorithm.RING, Protocol.SIMPLE, 16, 256, 2 << 20)
    for bad in ("channels=0", "chunk=1.5B", "speed=3", "algorithm=fast", "channels", "chunk=1MiB,chunk_bytes=2MiB"):
        with pytest.raises(LagomError):
            parse_set(bad)


def test_simulate_spec_json_and_set_changes_the_result(capsys):
    base = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--noise", "0")
    assert {"iteration_us", "compute_us", "comm_us", "exposed_comm_us", "compute_slowdown", "evaluations"} <= set(base)
    assert base["evaluations"] == 1 and base["ops"] > 500
    assert base["iteration_us"] >= max(base["compute_us"], base["comm_us"])
    assert base["compute_slowdown"] > 1.0
    lean = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--noise", "0", "--set",
                    "channels=2,chunk=684KB")
    assert lean["compute_slowdown"] < base["compute_slowdown"]
    again = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--noise", "0")
    assert again == base  # noise 0 is exact
    noisy = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--seed", "3")
    assert noisy["iteration_us"] != base["iteration_us"]
    assert abs(noisy["iteration_us"] / base["iteration_us"] - 1) < 0.05


def test_simulate_table_and_tuned_config(tmp_path, capsys):
    assert main(["simulate", "ep:olmoe:ep=8", "--cluster", "low-bw"]) == 0
    out = capsys.readouterr().out
    assert "iteration (Z)" in out and "compute slowdown" in out
    tuned = TunedConfig(cluster="high-bw", collectives=[
        CollectiveEntry(Match(collective=CollectiveType.ALLGATHER), CommConfig(channels=2, chunk_bytes=700416))])
    tuned.dump(tmp_path / "lagom.yaml")
    with_file = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--noise", "0", "--config",
                         str(tmp_path / "lagom.yaml"))
    base = run_json(capsys, "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--noise", "0")
    assert with_file["iteration_us"] != base["iteration_us"]


def test_workload_file_and_trace_arguments(tmp_path, capsys):
    w = generate_workload("tp:phi2:tp=8,dp=1")
    save_workload(w, tmp_path / "w.json")
    loaded = load_workload_arg(str(tmp_path / "w.json"))
    assert loaded.to_dict() == w.to_dict()
    trace = trace_path("a100_w2_allreduce_broadcast.json.gz")
    recovered = load_workload_arg(str(trace))
    assert recovered.rank == 0 and len(recovered.collectives) == 21
    out = run_json(capsys, str(trace), "--cluster", "a100-nvswitch")
    assert out["collectives"] == 21 and out["iteration_us"] > 0


@pytest.mark.parametrize("argv, message", [
    (["fsdp:gpt9:gpus=8", "--cluster", "low-bw"], "unknown model"),
    (["nothing-here", "--cluster", "low-bw"], "not a file"),
    (["fsdp:phi2", "--cluster", "mars"], "unknown cluster"),
    (["fsdp:phi2", "--cluster", "low-bw", "--set", "chunk=lots"], "bad size"),
    (["fsdp:phi2", "--cluster", "low-bw", "--config", "/nonexistent.yaml"], "no such file"),
    (["fsdp:phi2", "--cluster", "low-bw", "--noise", "-1"], "--noise"),
    (["fsdp:phi2", "--cluster", "low-bw", "--noise", "nan"], "--noise"),
    (["fsdp:phi2", "--cluster", "low-bw", "--noise", "inf"], "--noise"),
    (["fsdp:phi2", "--cluster", "low-bw", "--seed", "-3"], "--seed must be >= 0"),
    (["fsdp:phi2", "--cluster", "high-bw", "--set", "algorithm=nvls"],
     "--set: algorithm=nvls: cluster high-bw has no NVLink SHARP (intra_node.nvls is false); the evaluators "
     "model ring and tree here"),
    (["fsdp:phi2", "--cluster", "low-bw", "--set", "channels=2,nc=4"], "channels is given twice"),
    (["fsdp:phi2", "--cluster", "low-bw", "--set", "channels=61"], "not valid on NCCL 2.18"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys):
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("knobs, message", [
    ("{channels: 999}", "collectives[0]: channels=999 is not valid on NCCL 2.18.3"),
    ("{threads: 7}", "collectives[0]: threads=7 is not valid on NCCL 2.18.3"),
    ("{algorithm: nvls}", "collectives[0]: algorithm=nvls: cluster high-bw has no NVLink SHARP"),
])
def test_tuned_config_values_are_checked_like_set(tmp_path, capsys, knobs, message):
    """A tuned file used to be simulated with channels 999 (clamped to the SM count) or 7 threads."""
    cfg = tmp_path / "lagom.yaml"
    cfg.write_text(f"format: lagom.tuned-config\nversion: 1\ncollectives:\n  - match: {{collective: allgather}}\n"
                   f"    set: {knobs}\n")
    assert main(["simulate", "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(cfg) in err


def test_workloads_that_do_not_fit_the_cluster_are_warned_about_once(tmp_path, capsys):
    """A trace without distributedInfo (groups of 1 rank), a job wider than the cluster and
    a tuned file for another workload each get one warning line; the numbers still come."""
    assert main(["simulate", str(trace_path("no_distributed_info.json.gz")), "--cluster", "a100-nvswitch",
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["collectives"] == 6
    assert captured.err.count("warning:") == 1 and "6 of 6 collectives have a group of 1 rank" in captured.err

    assert main(["simulate", "fsdp:phi2:gpus=32", "--cluster", "low-bw", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["collectives"] > 0
    assert captured.err.count("warning:") == 1
    assert "process group of 32 ranks but low-bw has 16 GPUs" in captured.err and "4 nodes" in captured.err

    tuned = TunedConfig(cluster="low-bw", collectives=[
        CollectiveEntry(Match(collective=CollectiveType.ALLGATHER, ranks=16), CommConfig(channels=2))])
    tuned.dump(tmp_path / "lagom.yaml")
    assert main(["simulate", "fsdp:phi2:gpus=8", "--cluster", "low-bw", "--config", str(tmp_path / "lagom.yaml")]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "none of its 1 collective entries matches" in err
    # a file that keeps NCCL's defaults (no entries) is said to, not "none of its 0 entries matches"
    TunedConfig(cluster="low-bw").dump(tmp_path / "defaults.yaml")
    assert main(["simulate", "fsdp:phi2:gpus=8", "--cluster", "low-bw", "--config",
                 str(tmp_path / "defaults.yaml")]) == 0
    err = capsys.readouterr().err
    assert "has no collective entries: it keeps NCCL's defaults" in err and "none of its" not in err, err
    # an entry that matches: no warning
    assert main(["simulate", "fsdp:phi2:gpus=16", "--cluster", "low-bw", "--config", str(tmp_path / "lagom.yaml")]) == 0
    assert "warning:" not in capsys.readouterr().err


EXAMPLE_TRACE = "traces/examples/fsdp8_a100_2ch_synthetic.json.gz"  # one rank's trace (rank 0 of 8)


@pytest.mark.parametrize("argv, message", [
    (["simulate", EXAMPLE_TRACE, "--scale", "compute=0.8@5"], "holds no rank 5 (it holds rank 0)"),
    (["simulate", EXAMPLE_TRACE, "--scale", "compute=0.8@200000"], "holds no rank 200000"),
    (["simulate", EXAMPLE_TRACE, "--scale", "comm=0.5,compute=0.8@0-1"], "holds no rank 1 (it holds rank 0)"),
    (["tune", EXAMPLE_TRACE, "--rank", "99", "-o", "{tmp}/t.yaml"], "--rank 99: "),
    (["simulate", EXAMPLE_TRACE, "--rank", "3"], "--rank 3: "),
])
def test_a_rank_the_trace_file_lacks_is_refused(argv, message, tmp_path, capsys):
    """A what-if or --rank on a rank one rank's trace does not hold would replay the
    measurement unchanged and pass for an answer: one line, exit 2, as on a folder."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().splitlines()[-1].startswith(f"lagom {argv[0]}: error:")
    assert not (tmp_path / "t.yaml").exists()


def test_a_what_if_on_the_ranks_a_file_holds_still_runs(capsys):
    out = run_json(capsys, EXAMPLE_TRACE, "--scale", "compute=0.8@0")
    assert out["whatif"] and out["iteration_us"] < out["measured"]["iteration_us"]


def test_an_entry_for_a_group_the_job_lacks_is_warned_about_alike(tmp_path, capsys):
    """An entry whose match.group names no group of the job: simulate matches nothing with it,
    the plugin's table applies it to every group. Both commands say so in the same words."""
    tuned = TunedConfig(cluster="a100-nvswitch", process_groups={"0": {"min_ctas": 2}}, collectives=[
        CollectiveEntry(Match(collective=CollectiveType.ALLGATHER, group="tp"), CommConfig(channels=4)),
        CollectiveEntry(Match(collective=CollectiveType.ALLGATHER, group="0"), CommConfig(channels=2))])
    tuned.dump(tmp_path / "lagom.yaml")
    assert main(["simulate", EXAMPLE_TRACE, "--config", str(tmp_path / "lagom.yaml")]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "name" in line and "'tp'" in line]
    assert len(said) == 1 and said[0].startswith(f"warning: {tmp_path / 'lagom.yaml'}: entry 1 names group 'tp', "
                                                 "which the job does not have (its groups: '0')")
    assert main(["plugin", "table", str(tmp_path / "lagom.yaml")]) == 0
    table_err = capsys.readouterr().err
    assert "entry 1 names group 'tp', which the job it was tuned for does not have (its groups: '0')" in table_err
    tail = "the plugin's table, which cannot tell groups apart, applies it to every group's collectives"
    assert tail in said[0] and tail in table_err
    # every entry for a group the job has: no word
    tuned.collectives.pop(0)
    tuned.dump(tmp_path / "lagom.yaml")
    assert main(["simulate", EXAMPLE_TRACE, "--config", str(tmp_path / "lagom.yaml")]) == 0
    assert "does not have" not in capsys.readouterr().err
