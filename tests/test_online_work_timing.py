"""Per-collective timing for the online clock, opt-in (``--collective-timing``): the hook hands the
Work handles of async calls to :class:`lagom.online.work_timing.WorkDurations` on a real 1-rank
gloo group (gloo cannot time them: the one fallback line); by default it does not, and the
launcher leaves ``TORCH_NCCL_ENABLE_TIMING`` as the user set it."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
import yaml

import lagom.runtime as runtime
from costmodel.cluster import load_cluster
from lagom.online.work_timing import WorkDurations, op_ids_of_call, op_timings
from lagom.orchestration import tuning
from lagom.runtime import launcher
from lagom.runtime.env import ENV_ONLINE
from lagom.runtime.online import OnlineSettingsFile
from nccl_env.errors import LagomError
from nccl_env.rules import NcclVersion

V = NcclVersion.parse

SPEC = "tp:phi2:tp=8,dp=1"
SEED = {"format": "lagom.tuned-config", "version": 1, "cluster": "low-bw", "nccl_version": "2.18.3",
        "workload": SPEC, "collectives": [{"match": {"collective": "allreduce"}, "set": {"channels": 2}}]}


@pytest.fixture
def seed_file(tmp_path):
    path = tmp_path / "seed.yaml"
    path.write_text(yaml.safe_dump(SEED))
    return path


def _install(seed_file, tmp_path, monkeypatch, online: bool, collective_timing: bool = True):
    if online:  # the settings are read by install only: no session here
        settings = OnlineSettingsFile(nccl_version=V("2.30.3"), plugin="", result_path="",
                                      collective_timing=collective_timing)
        monkeypatch.setenv(ENV_ONLINE, str(settings.write(tmp_path / "online.json")))
    else:
        monkeypatch.delenv(ENV_ONLINE, raising=False)
    return runtime.install(seed_file, run_dir=tmp_path / "run", stream=io.StringIO())


def test_the_hook_hands_async_works_keyed_by_signature_and_gloo_falls_back_once(world, seed_file, tmp_path,
                                                                                monkeypatch):
    hook = _install(seed_file, tmp_path, monkeypatch, online=True)
    lines: list[str] = []
    durations = WorkDurations(lines.append)
    hook.work_sink = durations.record
    try:
        small, large = torch.ones(16), torch.ones(8, 4)
        first = dist.all_reduce(small, async_op=True)
        assert dist.all_reduce(small) is None  # a synchronous call returns no Work: nothing to time
        second = dist.broadcast(large, 0, async_op=True)
        first.wait()
        second.wait()
        assert [work for _, work in durations.works] == [first, second]
        assert all(got is sent for (_, got), sent in zip(durations.works, [first, second], strict=True))
        calls = [call for call, _ in durations.works]
        assert calls == [("allreduce", "0", 1, None, 64), ("broadcast", "0", 1, None, 128)]
        assert durations.collect() == {}  # gloo: "This Backend doesn't support getDuration"
        dist.all_reduce(small, async_op=True).wait()
        assert durations.collect() == {} and durations.works == []
    finally:
        runtime.uninstall()
    assert len(lines) == 1 and "getDuration" in lines[0] and "step time only" in lines[0]
    assert hook.counts and not hook.failed


@pytest.mark.parametrize("online", [False, True])
def test_without_collective_timing_the_hook_keeps_its_plain_wrappers(world, seed_file, tmp_path, monkeypatch, online):
    hook = _install(seed_file, tmp_path, monkeypatch, online=online, collective_timing=False)
    durations = WorkDurations(lambda line: None)
    hook.work_sink = durations.record
    try:
        dist.all_reduce(torch.ones(4), async_op=True).wait()
    finally:
        runtime.uninstall()
    assert not hook.deliver_works and durations.works == []


def test_a_call_maps_to_its_workload_signature_and_its_time_is_spread_over_its_ops():
    cluster = tuning.with_nccl_version(load_cluster("low-bw"), V("2.30.3"))
    space = tuning.space_for(tuning.load_workload_arg(SPEC), cluster)
    (sig, ids), *_ = space.collective_ids.items()
    call = (sig.collective.value, "torch-group-name", sig.ranks, None, sig.message_bytes)
    assert op_ids_of_call(space.collective_ids, call) == ids
    assert op_ids_of_call(space.collective_ids, call[:4] + (sig.message_bytes + 1,)) == ()
    ops = op_timings({call: 300.0 * len(ids)}, space.collective_ids, {})
    assert set(ops) == set(ids) and {o.duration_us for o in ops.values()} == {300.0}


@pytest.mark.parametrize("gpu", [False, True])
def test_the_launcher_leaves_nccl_timing_alone_unless_collective_timing_is_asked(seed_file, tmp_path, monkeypatch,
                                                                                  gpu):
    monkeypatch.setattr(launcher, "_has_gpu", lambda: gpu)  # the GPU path's settings, on a machine without one
    monkeypatch.delenv(launcher.TIMING_ENV, raising=False)
    default = launcher.prepare_online(launcher.OnlineRequest(nccl_version=V("2.30.3")), seed_file, tmp_path / "a")
    assert launcher.TIMING_ENV not in default.env
    assert not OnlineSettingsFile.read(default.env[ENV_ONLINE]).collective_timing
    assert any(("CUDA events" if gpu else "host clock") in m for m in default.messages)
    # a value the user set stays exactly as it is, and nothing is said about it
    monkeypatch.setenv(launcher.TIMING_ENV, "0")
    kept = launcher.prepare_online(launcher.OnlineRequest(nccl_version=V("2.30.3")), seed_file, tmp_path / "b")
    assert kept.env[launcher.TIMING_ENV] == "0" and not any(launcher.TIMING_ENV in m for m in kept.messages)
    monkeypatch.delenv(launcher.TIMING_ENV)
    request = launcher.OnlineRequest(nccl_version=V("2.30.3"), collective_timing=True)
    asked = launcher.prepare_online(request, seed_file, tmp_path / "c")
    assert asked.env[launcher.TIMING_ENV] == "1" and OnlineSettingsFile.read(asked.env[ENV_ONLINE]).collective_timing
    assert any("costs overlap" in m for m in asked.messages)
    # a 2.18 seed run on 2.30.3: the note follows the NCCL in force, which loads the plugin
    assert any(" via tuner plugin " in m for m in asked.messages)
    assert not any("does not load" in m for m in asked.messages)
    monkeypatch.setenv(launcher.TIMING_ENV, "0")  # asked, but the user's own value still wins, and one line says so
    mine = launcher.prepare_online(request, seed_file, tmp_path / "d")
    assert mine.env[launcher.TIMING_ENV] == "0" and any(launcher.TIMING_ENV in m for m in mine.messages)
    monkeypatch.delenv(launcher.TIMING_ENV)
    request = launcher.OnlineRequest(nccl_version=V("2.30.3"), simulate=SPEC, cluster="low-bw")
    simulated = launcher.prepare_online(request, seed_file, tmp_path / "e")
    assert launcher.TIMING_ENV not in simulated.env  # the simulator's clock reads no Work
    with pytest.raises(LagomError, match="does not go with --simulate"):
        launcher.prepare_online(launcher.OnlineRequest(nccl_version=V("2.30.3"), simulate=SPEC, cluster="low-bw",
                                                       collective_timing=True), seed_file, tmp_path / "f")


def test_the_plugin_note_names_the_nccl_in_force(seed_file, tmp_path):

    assert any("which the file's NCCL 2.18.3 does not load" in m
               for m in launcher.prepare(seed_file, tmp_path / "a").messages)
    in_force = launcher.prepare(seed_file, tmp_path / "b", nccl_version=V("2.30.3"))
    assert not any("does not load" in m for m in in_force.messages)
