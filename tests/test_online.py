"""Online tuning in process: the reductions, the online space, rank agreement under noise and
faults, the store timeout, the compiled plugin's table swaps, and the CLI's refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from costmodel.cluster import load_cluster
from costmodel.evaluator import OpTiming, Timing
from lagom.online.agent import RankAgent, run_in_process, simulated_ranks
from lagom.online.clock import SimulatedClock, StepClock
from lagom.online.controller import OnlineController, OnlineSettings
from lagom.online.measure import across_ranks, lower_median, robust_timing
from lagom.online.plugin_view import PluginView
from lagom.online.protocol import (
    MemoryStore,
    decision_key,
    decode_decision,
    encode_decision,
)
from lagom.orchestration import tuning
from nccl_env.delivery import deliver
from nccl_env.errors import LagomError
from nccl_env.plugin_abi import TunerLibrary
from nccl_env.plugin_build import build_plugin
from nccl_env.plugin_table import format_table
from nccl_env.rules import NcclVersion
from tuner.space import Scope, online_space

SPEC = "tp:phi2:tp=8,dp=1"  # one signature: the fastest workload to tune
VERSION = "2.30.3"


def _setup(preset: str = "low-bw", spec: str = SPEC, version: str = VERSION):
    cluster = tuning.with_nccl_version(load_cluster(preset), NcclVersion.parse(version))
    workload = tuning.load_workload_arg(spec)
    return cluster, workload, tuning.space_for(workload, cluster)


def _timing(iteration: float, op: float, start: float = 0.0) -> Timing:
    return Timing(iteration, iteration / 2, op, op / 4, iteration / 3, {7: OpTiming(start, op)})


def test_step_and_rank_reductions_select_values_never_average_them():
    steps = [_timing(100.0, 10.0), _timing(140.0, 12.0), _timing(90.0, 30.0)]
    one_rank = robust_timing(steps)
    assert (one_rank.iteration_us, one_rank.ops[7].duration_us) == (100.0, 12.0)  # lower medians
    assert lower_median([4.0, 1.0, 3.0, 2.0]) == 2.0
    ranks = [_timing(100.0, 11.0, 5.0), _timing(103.0, 9.5, 6.0)]
    agreed = across_ranks(ranks)
    assert agreed.iteration_us == 103.0  # the slowest rank is the critical path
    assert agreed.ops[7].duration_us == 9.5  # the least skewed collective time
    assert across_ranks(list(reversed(ranks))).ops == agreed.ops  # order of ranks does not matter


def test_online_space_keeps_only_what_the_plugin_changes_per_call():
    cluster, workload, space = _setup()
    seed = tuning.tune(workload, cluster, tuning.make_evaluator("sim", cluster), with_autoccl=False).result.plan
    online = online_space(space, seed.config_for)
    assert all(u.scope is Scope.COLLECTIVE for u in online.resource_units)
    assert {a for u in online.resource_units for a in u.axes} == {"channels", "chunk_bytes"}
    plan = online.plan(online.minimum_point())
    assert all(plan.config_for(s).threads == seed.config_for(s).threads for s in space.signatures)
    _, _, space_225 = _setup(version="2.25.1")  # chunk is NCCL_BUFFSIZE's there: pinned too
    online_225 = online_space(space_225, seed.config_for)
    assert {a for u in online_225.resource_units for a in u.axes} == {"channels"}
    cluster_ep, workload_ep, space_ep = _setup(spec="ep:deepseek-moe-16b:ep=8,gpus=8")
    seed_ep = tuning.tune(
        workload_ep, cluster_ep, tuning.make_evaluator("sim", cluster_ep), with_autoccl=False
    ).result.plan
    online_ep = online_space(space_ep, seed_ep.config_for)
    p2p = [s for s in space_ep.signatures if s.collective.value == "alltoall"]
    assert p2p and all(u.scope is Scope.COLLECTIVE for u in online_ep.resource_units)
    plan_ep = online_ep.plan(online_ep.minimum_point())  # NCCL_P2P_*_CHUNKSIZE is read at start: the seed's step stays
    assert all(plan_ep.config_for(s).chunk_bytes == seed_ep.config_for(s).chunk_bytes is not None for s in p2p)
    _, _, space_218 = _setup(version="2.18.3")
    with pytest.raises(LagomError, match="NCCL >= 2.21"):
        online_space(space_218, seed.config_for)


class FaultyStore(MemoryStore):
    """A real in-memory store whose decision for one step is damaged on its way in."""

    def __init__(self, step: int, kind: str) -> None:
        super().__init__()
        self.step, self.kind = step, kind

    def set(self, key: str, value: str) -> None:
        if key == decision_key(self.step):
            if self.kind == "corrupt":  # one byte of the body changes: the checksum no longer matches
                value = value[:-2] + ("0" if value[-2] != "0" else "1") + value[-1]
            else:  # stale: intact, but for an epoch that is not the next one
                body = json.loads(value.split("\n", 1)[1])
                decision = decode_decision(value.encode(), self.step, body["epoch"], len(body["configs"]))
                assert decision is not None
                value = encode_decision(dataclasses.replace(decision, epoch=decision.epoch + 2))
        super().set(key, value)


def _run(ranks: int, noise: float, seed: int, budget: int = 120, store: MemoryStore | None = None):
    cluster, workload, space = _setup()
    controller = OnlineController(workload, space, None, OnlineSettings(budget_steps=budget))
    clocks: list[StepClock] = [SimulatedClock(workload, cluster, r, noise, seed) for r in range(ranks)]
    agents = simulated_ranks(controller, clocks, store=store)
    run_in_process(agents, budget + 10)
    return cluster, workload, controller, agents


def _agree(agents: list[RankAgent]) -> None:
    first = agents[0]
    for agent in agents[1:]:
        assert agent.epochs == first.epochs
        assert agent.plan.entries == first.plan.entries
        assert (agent.active, agent.result) == (first.active, first.result)


@pytest.mark.parametrize("kind", ["corrupt", "stale"])
def test_a_damaged_decision_keeps_the_current_epoch_on_every_rank(kind):
    fault_step = 9
    _, _, _, agents = _run(3, 0.02, 1, store=FaultyStore(fault_step, kind))
    _agree(agents)
    assert all(not a.active and a.result == "stopped" for a in agents)
    assert agents[0].epochs and all(e.step <= fault_step for e in agents[0].epochs)  # nothing began after it
    assert agents[0].epoch == agents[0].epochs[-1].epoch
    assert all("stale or corrupt" in a.warnings[0] for a in agents)


@pytest.mark.slow
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(ranks=st.integers(2, 4), noise=st.floats(0.0, 0.05), seed=st.integers(0, 2**16),
       fault=st.one_of(st.none(), st.tuples(st.integers(1, 50), st.sampled_from(["corrupt", "stale"]))))
def test_ranks_agree_under_independent_noise_and_faults(ranks, noise, seed, fault):
    store = FaultyStore(*fault) if fault else MemoryStore()
    cluster, workload, controller, agents = _run(ranks, noise, seed, budget=80, store=store)
    _agree(agents)
    assert controller.steps_spent <= controller.settings.budget_steps
    if fault is None:
        assert agents[0].result in ("kept", "reverted")
        judge = tuning.make_evaluator("sim", cluster, noise=0.0)
        seed_us = judge.evaluate(workload, controller.seed).iteration_us
        assert judge.evaluate(workload, controller.final).iteration_us <= seed_us * 1.002  # never slower than the seed


class ScriptedClock:
    """A clock whose every plan but the seed runs 10% faster, and whose seed, re-measured in the A/B,
    takes ``seed_us[k]`` at its k-th measurement (its first is steady: the search sees no noise)."""

    def __init__(self, seed, signatures, seed_us: list[float]) -> None:
        self.seed, self.signatures, self.seed_us = seed, signatures, seed_us
        self.on_seed, self.seed_runs = False, 0

    def switched(self, plan, epoch: int) -> None:
        self.on_seed = all(plan.config_for(s) == self.seed.config_for(s) for s in self.signatures)
        self.seed_runs += self.on_seed

    def step_ended(self) -> Timing:
        step_us = self.seed_us[min(self.seed_runs, len(self.seed_us)) - 1] if self.on_seed else 900.0
        return Timing(step_us, step_us, 0.0, 0.0, step_us, {})


def _scripted(seed_us: list[float], calls: int):
    """Two ranks on :class:`ScriptedClock`, each reporting ``calls`` calls per signature per step."""
    _, workload, space = _setup()
    controller = OnlineController(workload, space, None, OnlineSettings(budget_steps=200))
    clocks: list[StepClock] = [ScriptedClock(controller.seed, space.signatures, seed_us) for _ in range(2)]
    agents = simulated_ranks(controller, clocks)
    for agent in agents:
        agent.calls = lambda: [calls] * len(space.signatures)
    run_in_process(agents, 210)
    return controller, agents


def test_a_job_that_runs_none_of_the_tuned_signatures_keeps_the_seed_at_once():
    controller, agents = _scripted([1000.0], calls=0)  # every other plan looks 10% faster: chance, not tuning
    assert controller.done and controller.result == "reverted" and controller.final == controller.seed
    assert controller.reason == "the job ran none of the tuned signatures"
    assert controller.evaluations == 1 and all(len(a.epochs) == 1 for a in agents)  # the seed only, never a switch
    assert agents[0].summary()["reason"] == controller.reason
    kept, _ = _scripted([1000.0], calls=1)  # the same job running its signature keeps the faster plan
    assert kept.result == "kept" and kept.final != kept.seed and kept.calls_measured and kept.gain > 0.09


def test_a_gain_within_the_seeds_own_spread_is_not_kept():
    # the seed re-measured in the A/B: 1000, 1100, 960 us: a 14% spread, wider than the result's 10% gain
    controller, _ = _scripted([1000.0, 1100.0, 960.0], calls=1)
    assert controller.result == "reverted" and controller.final == controller.seed
    assert controller.reason == "its gain 10.0% is within the noise bound 14.0%"


def test_a_rank_that_never_reports_ends_the_decider_within_its_timeout():
    torch_dist = pytest.importorskip("torch.distributed")
    store = torch_dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    prefixed = torch_dist.PrefixStore("lagom/online/", store)
    cluster, workload, space = _setup()
    controller = OnlineController(workload, space, None, OnlineSettings())
    agent = RankAgent(0, 2, prefixed, SimulatedClock(workload, cluster, 0, 0.0), space.signatures, lambda plan: None,
                      controller, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(LagomError, match="sample/1/1 within 1 s"):
        agent.boundary()
    assert time.monotonic() - started < 10


def test_table_swaps_reach_the_compiled_plugin_and_nccl_would_run_the_decided_plan():
    _, workload, space = _setup(spec="fsdp:phi2:gpus=16")
    version = NcclVersion.parse(VERSION)
    library = TunerLibrary(build_plugin())
    view = PluginView(library, version)
    controller = OnlineController(workload, space, None, OnlineSettings())
    calls = {s: 1 for s in space.signatures}
    plans = [controller.space.plan(controller.start), controller.space.plan(controller.space.minimum_point())]
    try:
        for plan in plans * 2:
            library.set_table(format_table(deliver(plan, version).plugin_entries))
            assert view.plan_in_force(plan, calls).entries == {s: plan.config_for(s) for s in space.signatures}
    finally:
        view.close()
        library.set_table(None)


def _lagom_run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lagom", "run", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


@pytest.mark.parametrize("args, message", [
    (["--nccl-version", "2.18.3", "--simulate", SPEC, "--cluster", "low-bw"], "needs NCCL >= 2.21"),
    (["--nccl-version", "2.30.3"], "needs --config SEED.yaml from lagom tune"),
    (["--nccl-version", "2.30.3", "--simulate", SPEC, "--cluster", "low-bw", "--collective-timing"],
     "does not go with --simulate"),
    (["--nccl-version", "2.30.3", "--simulate", SPEC], "needs --cluster"),
    (["--nccl-version", "2.30.3", "--simulate", "tp:nosuchmodel", "--cluster", "low-bw"], "unknown model"),
])
def test_online_refusals_are_one_line_and_exit_2(args, message):
    pytest.importorskip("torch")
    done = _lagom_run("--online", *args, "--", sys.executable, "-c", "pass")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.slow
def test_a_single_process_job_tunes_through_explicit_steps_and_saves_the_plan(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    import lagom.runtime
    from lagom.files.tuned_config import load_tuned_config
    from lagom.runtime import online

    settings = online.OnlineSettingsFile(nccl_version=NcclVersion.parse(VERSION), plugin=str(build_plugin()),
                                         result_path=str(tmp_path / "tuned.yaml"), simulate=SPEC, cluster="low-bw",
                                         noise=0.02, budget_steps=60)
    monkeypatch.setenv("LAGOM_ONLINE", str(settings.write(tmp_path / "online.json")))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    lines: list[str] = []
    session = online.install(lines.append)
    assert session is not None
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    try:
        optimizer.step()  # the global optimizer hook marks a boundary
        assert session.agent is not None and session.agent.step == 1
        for _ in range(80):
            lagom.runtime.step()  # from here on the explicit calls do, and the optimizer hook stands down
        optimizer.step()
        agent = session.agent
        assert session.finished and agent.result in ("kept", "reverted") and agent.step <= 62
        assert session.summary([])["steps_spent"] <= 60
        assert any("online tuning done" in line for line in lines)
        saved = load_tuned_config(tmp_path / "tuned.yaml")
        assert str(saved.nccl_version) == VERSION and saved.collectives and saved.method == "lagom-online"
    finally:
        online.step_hook.uninstall()
