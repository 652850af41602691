"""The shared vocabulary: CommConfig, Workload JSON round trip, overlap windows, tuned-config files."""

from __future__ import annotations

import pytest

from lagom.files.tuned_config import CollectiveEntry, Match, TunedConfig, load_tuned_config
from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Protocol, Signature
from nccl_env.rules import NcclVersion
from traces import (
    CollectiveOp,
    ComputeOp,
    Dependency,
    ProcessGroup,
    Stream,
    StreamKind,
    Workload,
    overlap_windows,
)
from traces.workload_io import load_workload, save_workload


def small_workload() -> Workload:
    return Workload(
        rank=1,
        world_size=2,
        streams=[Stream(7, StreamKind.COMPUTE), Stream(20, StreamKind.COMMUNICATION, "nccl")],
        compute_ops=[
            ComputeOp(1, "gemm", 7, 0.0, 10.0, grid=(4, 2, 1), block=(128, 1, 1), blocks_per_sm=1.5),
            ComputeOp(2, "gemm", 7, 10.0, 10.0, flops=1e9, dram_bytes=2e6),
            ComputeOp(3, "relu", 7, 40.0, 5.0),
        ],
        collectives=[
            CollectiveOp(4, "ncclKernel_AllReduce", CollectiveType.ALLREDUCE, 1 << 20, 20, 5.0, 12.0, "0",
                         dtype="Float", recorded_algorithm=Algorithm.RING, recorded_protocol=Protocol.LL),
            CollectiveOp(5, "ncclKernel_Broadcast", CollectiveType.BROADCAST, 4096, 20, 30.0, 2.0, "0"),
        ],
        groups={"0": ProcessGroup("0", (0, 1), nodes=1)},
        dependencies=[Dependency(1, 4)],
        profiler_steps=[(0.0, 50.0)],
    )


def test_workload_json_round_trip(tmp_path):
    w = small_workload()
    for name in ("w.json", "w.json.gz"):
        save_workload(w, tmp_path / name)
        back = load_workload(tmp_path / name)
        assert back.to_dict() == w.to_dict()
        assert back.collectives[0].recorded_algorithm is Algorithm.RING
        assert back.compute_ops[0].grid == (4, 2, 1)
        assert back.compute_ops[0].thread_blocks == 8


def test_bad_workload_file_is_a_lagom_error(tmp_path):
    (tmp_path / "x.json").write_text('{"format": "something else"}')
    with pytest.raises(LagomError, match="not a valid Lagom workload"):
        load_workload(tmp_path / "x.json")
    with pytest.raises(LagomError, match="no such file"):
        load_workload(tmp_path / "missing.json")


def test_overlap_windows_group_concurrent_ops():
    windows = overlap_windows(small_workload())
    # allreduce [5,17) overlaps gemm 1 [0,10) and gemm 2 [10,20); broadcast [30,32) overlaps nothing.
    assert [(w.collective_ids, w.compute_ids) for w in windows] == [((4,), (1, 2)), ((5,), ())]
    assert windows[0].start_us == 0.0 and windows[0].end_us == 20.0


def test_signature_uses_group_span():
    w = small_workload()
    sig = w.signature(w.collectives[0])
    assert (sig.group, sig.collective, sig.message_bytes, sig.ranks, sig.nodes) == ("0", CollectiveType.ALLREDUCE,
                                                                                    1 << 20, 2, 1)


def test_comm_config_merge_and_dict():
    c = CommConfig(channels=4, chunk_bytes=1 << 19)
    base = CommConfig(Algorithm.RING, Protocol.SIMPLE, 8, 512, 1 << 21)
    assert c.merged_over(base) == CommConfig(Algorithm.RING, Protocol.SIMPLE, 4, 512, 1 << 19)
    assert CommConfig.from_dict(base.to_dict()) == base
    with pytest.raises(ValueError):
        CommConfig.from_dict({"channel": 3})


def test_tuned_config_round_trip_and_lookup(tmp_path):
    cfg = TunedConfig(
        cluster="low-bw", nccl_version=NcclVersion.parse("2.18.3"), method="lagom", env={"NCCL_NTHREADS": "256"},
        process_groups={"0": {"min_ctas": 2, "max_ctas": 8}},
        collectives=[CollectiveEntry(Match(CollectiveType.ALLGATHER, "0", 1000, 2000, 8, 1),
                                     CommConfig(Algorithm.RING, Protocol.SIMPLE, channels=2, chunk_bytes=700416))],
        predictions={"baseline_us": 10.0, "tuned_us": 8.0},
    )
    cfg.dump(tmp_path / "lagom.yaml")
    back = load_tuned_config(tmp_path / "lagom.yaml")
    assert back.to_dict() == cfg.to_dict()
    assert back.lookup(CollectiveType.ALLGATHER, "0", 1500, 8, 1).config.channels == 2
    assert back.lookup(CollectiveType.ALLGATHER, "0", 2500, 8, 1) is None
    assert back.lookup(CollectiveType.ALLREDUCE, "0", 1500, 8, 1) is None
    hit = Signature("0", CollectiveType.ALLGATHER, 1500, 8, 1)
    miss = Signature("0", CollectiveType.ALLGATHER, 1500, 4, 1)
    plan = back.to_plan([hit, miss])
    assert plan.config_for(hit).channels == 2 and plan.config_for(miss) == CommConfig()


@pytest.mark.parametrize("text,needle", [
    ("format: other\n", "not a Lagom tuned config"),
    ("format: lagom.tuned-config\nversion: 99\n", "version 99"),
    ("format: lagom.tuned-config\nversion: 1\ncollectives: [{match: {collective: bogus}, set: {}}]\n",
     "collectives[0]"),
    ("format: lagom.tuned-config\nversion: 1\ncollectives: [{match: {}, set: {channels: many}}]\n", "collectives[0]"),
    ("{{{{", "not valid YAML"),
])
def test_bad_tuned_config_is_one_line_error(tmp_path, text, needle):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(LagomError) as info:
        load_tuned_config(tmp_path / "bad.yaml")
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("match,needle", [
    ("{min_bytes: abc}", "match.min_bytes"),
    ("{min_bytes: 1.5}", "match.min_bytes"),
    ("{ranks: true}", "match.ranks"),
    ("{nodes: 0}", "match.nodes"),
])
def test_tuned_config_match_values_are_checked_by_key(tmp_path, match, needle):
    (tmp_path / "bad.yaml").write_text(
        f"format: lagom.tuned-config\nversion: 1\ncollectives: [{{match: {match}, set: {{channels: 2}}}}]\n")
    with pytest.raises(LagomError, match=needle.replace(".", r"\.")):
        load_tuned_config(tmp_path / "bad.yaml")


def test_cli_usage_errors_are_one_line(capsys):
    from lagom.cli import main

    with pytest.raises(SystemExit) as info:
        main(["analyze", "x", "--top", "notanumber"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--top" in err


def test_workload_missing_key_is_named(tmp_path):
    (tmp_path / "w.json").write_text('{"format": "lagom.workload", "version": 1, "ops": 5}')
    with pytest.raises(LagomError, match="missing key 'rank'"):
        load_workload(tmp_path / "w.json")


@pytest.mark.parametrize("text", ["1.0", "3.0.1"])
def test_nccl_versions_outside_2x_are_refused(text):
    from nccl_env.rules import NcclVersion

    with pytest.raises(LagomError, match="NCCL 2.x only"):
        NcclVersion.parse(text)
