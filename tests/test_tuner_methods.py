"""One conformance suite every search method must pass (Optuna-style), plus Lagom's own claims.

The suite runs each method on hand-built workloads with a closed-form contention
evaluator (tests/tuner_toy.py) where exhaustive ground truth is cheap.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import EXAMPLES
from tuner_toy import ToyEvaluator, layered_workload

from costmodel.cluster import load_cluster
from nccl_env.errors import LagomError
from nccl_env.knobs import Algorithm, CommPath, Protocol
from nccl_env.plan import Plan
from nccl_env.rules import Mechanism, NcclVersion
from tuner import METHODS, AutoCCL, Exhaustive, LagomSearch, NcclDefault, OptunaTPE, Scope, SearchMethod, build_space
from tuner.space import knob_scopes

V = NcclVersion.parse


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("low-bw")


def small_case(cluster):
    workload = layered_workload(4, [8 << 20, 24 << 20])
    return workload, build_space(workload, cluster)


@pytest.fixture(scope="module")
def nvswitch():
    """An NVSwitch node on NCCL 2.30.7: its group may take symmetric kernels or copy engines. Without
    NVLink SHARP (the preset's flag would add NVLS subspaces, past the exhaustive search's 10,000 points)."""
    preset = load_cluster("h100-nvswitch")
    return replace(preset, nccl_version=V("2.30.7"), intra_node=replace(preset.intra_node, nvls=False))


def path_case(cluster):
    """The toy FSDP window with a path unit; without the plugin (channels per group, chunk and
    threads per process) so exhaustive ground truth stays cheap."""
    workload = layered_workload(2, [24 << 20], tail_bytes=4 << 20)
    ring_simple = [(Algorithm.RING, Protocol.SIMPLE)]
    return workload, build_space(workload, cluster, use_plugin=False, enabled_pairs=lambda c, s: ring_simple)


class MethodConformance:
    """Subclasses set ``method``; every test here must hold for every method."""

    method: SearchMethod

    def test_plan_respects_the_space(self, cluster):
        workload, space = small_case(cluster)
        result = self.method.tune(workload, ToyEvaluator(cluster), space)
        for sig, cfg in result.plan.entries.items():
            assert sig in space.signatures
            for axis in ("channels", "chunk_bytes", "threads"):
                value = getattr(cfg, axis)
                assert value is None or value in space.axes[axis].values
            if cfg.algorithm is not None:
                assert (cfg.algorithm, cfg.protocol) in space.pairs[sig]
        # signatures of one unit share the unit's values (what the doors can carry)
        for unit in space.resource_units:
            for axis in unit.axes:
                assert len({getattr(result.plan.config_for(s), axis) for s in unit.signatures}) == 1

    def test_prediction_is_the_evaluators_and_evaluations_are_counted(self, cluster):
        workload, space = small_case(cluster)
        evaluator = ToyEvaluator(cluster)
        result = self.method.tune(workload, evaluator, space)
        assert result.evaluations == evaluator.evaluations >= 1
        again = ToyEvaluator(cluster).evaluate(workload, result.plan)
        assert math.isclose(again.iteration_us, result.iteration_us, rel_tol=1e-9)

    def test_budget_is_respected(self, cluster):
        workload, space = small_case(cluster)
        evaluator = ToyEvaluator(cluster)
        result = self.method.tune(workload, evaluator, space, budget=7)
        assert evaluator.evaluations <= 7 and result.evaluations <= 7

    def test_deterministic(self, cluster):
        workload, space = small_case(cluster)
        a = self.method.tune(workload, ToyEvaluator(cluster), space)
        b = self.method.tune(workload, ToyEvaluator(cluster), space)
        assert a.iteration_us == b.iteration_us and a.plan.entries == b.plan.entries

    def test_paths_respect_the_space_and_take_no_knobs(self, nvswitch):
        """Every method emits a path only where the space offers it, one per group, and a
        signature a path takes off NCCL's kernels carries no kernel knob."""
        workload, space = path_case(nvswitch)
        assert [len(space.path_options[u.index]) for u in space.path_units] == [2]
        result = self.method.tune(workload, ToyEvaluator(nvswitch), space)
        for unit in space.path_units:
            paths = {result.plan.config_for(s).comm_path for s in unit.signatures}
            assert len(paths) == 1 and paths <= {None, *space.path_options[unit.index]}
        for sig, cfg in result.plan.entries.items():
            if space.mechanism(sig, cfg.comm_path) is not Mechanism.SM_KERNEL:
                assert (cfg.channels, cfg.chunk_bytes, cfg.threads, cfg.algorithm) == (None,) * 4
        assert result.evaluations >= 1

    def test_progress_reports_every_evaluation(self, cluster):
        workload, space = small_case(cluster)
        seen: list[int] = []
        result = self.method.tune(workload, ToyEvaluator(cluster), space, progress=seen.append)
        assert seen == list(range(1, result.evaluations + 1))


class TestLagomConformance(MethodConformance):
    method = LagomSearch()


class TestAutoCCLConformance(MethodConformance):
    method = AutoCCL()


class TestExhaustiveConformance(MethodConformance):
    method = Exhaustive(max_points=10_000)  # the path case has 9,504 points


class TestOptunaConformance(MethodConformance):
    method = OptunaTPE(default_budget=40)


class TestNcclDefaultConformance(MethodConformance):
    method = NcclDefault()


def test_methods_table_lists_every_method():
    assert set(METHODS) == {"lagom", "autoccl", "exhaustive", "optuna", "nccl"}
    assert all(issubclass(m, SearchMethod) and m.name == key for key, m in METHODS.items())


# ---- Lagom's own claims --------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[8 << 20, 24 << 20], [2 << 20], [48 << 20, 4 << 20]])
def test_lagom_within_two_percent_of_exhaustive_and_beats_optuna_at_equal_budget(cluster, sizes):
    workload = layered_workload(4, sizes)
    space = build_space(workload, cluster)
    truth = Exhaustive().tune(workload, ToyEvaluator(cluster), space)
    lagom = LagomSearch().tune(workload, ToyEvaluator(cluster), space)
    assert lagom.iteration_us <= truth.iteration_us * 1.02
    optuna = OptunaTPE().tune(workload, ToyEvaluator(cluster), space, budget=lagom.evaluations)
    assert lagom.iteration_us <= optuna.iteration_us
    assert lagom.evaluations < space.size() / 20


@pytest.mark.slow  # exhaustive over 9,504 points
def test_lagom_with_paths_is_within_two_percent_of_exhaustive_and_never_behind_its_knob_only_plan(nvswitch):
    workload, space = path_case(nvswitch)
    truth = Exhaustive(max_points=10_000).tune(workload, ToyEvaluator(nvswitch), space)
    lagom = LagomSearch().tune(workload, ToyEvaluator(nvswitch), space)
    knobs = LagomSearch(probe_paths=False).tune(workload, ToyEvaluator(nvswitch), space)
    assert lagom.iteration_us <= truth.iteration_us * 1.02
    assert lagom.iteration_us <= knobs.iteration_us
    # the GEMMs here are SM-bound: the optimum leaves NCCL's kernels for a path, and so does Lagom
    sig = space.path_units[0].signatures[0]
    assert truth.plan.config_for(sig).comm_path is not None
    assert lagom.plan.config_for(sig).comm_path is truth.plan.config_for(sig).comm_path
    # linear: the paths cost a few evaluations per path unit, not a product
    assert lagom.evaluations <= knobs.evaluations + 10 * len(space.path_units) + 40


def test_paths_are_offered_only_where_nccl_and_the_cluster_have_them(nvswitch, cluster):
    workload = layered_workload(2, [8 << 20])
    assert build_space(workload, cluster, nccl_version=V("2.30.7")).path_units == []  # PCIe: no NVLink domain
    assert build_space(workload, nvswitch, nccl_version=V("2.18.3")).path_units == []  # before 2.27
    symmetric_only = build_space(workload, nvswitch, nccl_version=V("2.27.3"))  # no copy engines before 2.28
    assert [space_paths for space_paths in symmetric_only.path_options.values()] == [(CommPath.SYMMETRIC,)]
    both = build_space(workload, nvswitch, nccl_version=V("2.28.3"))
    assert list(both.path_options.values()) == [(CommPath.SYMMETRIC, CommPath.COPY_ENGINE)]


def test_guard_never_returns_worse_than_nccl_default(cluster):
    workload, space = small_case(cluster)
    evaluator = ToyEvaluator(cluster)
    default = evaluator.evaluate(workload, Plan())
    # a budget of 2 leaves the search at minimum resources, far worse than NCCL's default
    result = LagomSearch().tune(workload, evaluator, space, budget=2)
    assert result.iteration_us <= default.iteration_us
    assert result.plan.entries == {} and any("guard" in n for n in result.notes)


def test_lagom_evaluations_grow_linearly_with_signatures():
    """On NCCL 2.30 every knob but threads is per collective: one unit per signature."""
    cluster = load_cluster("low-bw")
    counts, units = [], []
    for n in (1, 2, 4, 8):
        sizes = [(4 + 3 * i) << 20 for i in range(n)]
        workload = layered_workload(n, sizes)
        space = build_space(workload, cluster, nccl_version=V("2.30.3"))
        assert space.axes["chunk_bytes"].scope is Scope.COLLECTIVE
        result = LagomSearch().tune(workload, ToyEvaluator(cluster), space)
        counts.append(result.evaluations)
        units.append(len(space.resource_units))
    slope, intercept = np.polyfit(units, counts, 1)
    residual = max(abs(c - (slope * u + intercept)) for u, c in zip(units, counts))
    assert slope < 30 and residual < 0.25 * max(counts)
    assert counts[-1] < 12 * counts[0]


def test_scopes_follow_the_nccl_version():
    old = knob_scopes(V("2.18.3"))
    assert old["threads"] is Scope.PROCESS and old["chunk_bytes"] is Scope.PROCESS
    assert old["channels"] is Scope.GROUP and old["algorithm"] is Scope.PROCESS
    new = knob_scopes(V("2.30.3"))
    assert new["chunk_bytes"] is Scope.COLLECTIVE and new["channels"] is Scope.COLLECTIVE
    assert new["threads"] is Scope.PROCESS


def test_exhaustive_refuses_large_spaces(cluster):
    workload = layered_workload(4, [1 << 20, 2 << 20, 3 << 20, 4 << 20])
    space = build_space(workload, cluster, nccl_version=V("2.30.3"))
    with pytest.raises(LagomError, match="points"):
        Exhaustive(max_points=1000).tune(workload, ToyEvaluator(cluster), space)


def test_workload_without_collectives_is_a_lagom_error(cluster):
    workload = layered_workload(2, [1 << 20])
    workload.collectives = []
    with pytest.raises(LagomError, match="no collectives"):
        build_space(workload, cluster)


@pytest.mark.parametrize("version", ["2.18.3", "2.21.5", "2.30.3"])
def test_point_to_point_gets_its_own_step_unit_and_plans_match_what_nccl_will_run(version):
    """AllToAll takes only a step size (NCCL_P2P_*_CHUNKSIZE); every plan the space emits is
    exactly what delivery hands NCCL, including the 2.19+ cut to NCCL_BUFFSIZE / 8."""
    from nccl_env.delivery import deliver
    from nccl_env.rules import NcclVersion, p2p_chunk_envs
    from traces.generate import generate_workload
    from tuner.space import Point

    cluster = load_cluster("low-bw")
    workload = generate_workload("ep:olmoe-1b-7b:ep=8,gpus=16")
    space = build_space(workload, cluster, nccl_version=V(version))
    p2p = [u for u in space.resource_units if any(s.collective.value == "alltoall" for s in u.signatures)]
    assert [(u.key, u.axes) for u in p2p] == [("p2p intra", ("chunk_bytes",))]
    assert all(s.collective.value != "alltoall" for u in space.resource_units if u not in p2p for s in u.signatures)
    cut = 0
    rng = np.random.default_rng(0)
    for _ in range(60):
        point = Point(
            tuple(sorted((u.index, a, int(rng.integers(len(space.axes[a].values)))) for u in space.resource_units
                         for a in u.axes)),
            tuple((u.index, None) for u in space.subspace_units))
        plan = space.plan(point)
        delivered = deliver(plan, NcclVersion.parse(version))
        for sig, cfg in plan.entries.items():
            if sig.collective.value == "alltoall":
                assert cfg.threads is None and cfg.channels is None
                wanted = space.axes["chunk_bytes"].values[point.level(p2p[0].index, "chunk_bytes")]
                cut += cfg.chunk_bytes < wanted
                for env in p2p_chunk_envs(sig.nodes):
                    assert delivered.env[env] == str(cfg.chunk_bytes)
        assert not any("point-to-point" in c for c in delivered.compromises)  # nothing asked that NCCL ignores
    assert (cut > 0) == (version == "2.21.5")  # only there does NCCL_BUFFSIZE both set the chunk and cap the step


@pytest.mark.slow
def test_a_search_keeps_per_op_timings_for_a_bounded_number_of_points(monkeypatch):
    """Issue 31: every measured point kept its Timing (per-op arrays), so a tune's memory was evaluations x
    ops (5.5 GB on 999,000 kernels). With room for only two full timings, older points are kept slim and
    timed again when asked: the searches find the same plans, and the same evaluations are charged."""
    import tuner.objective as objective
    from costmodel.analytic.evaluator import AnalyticEvaluator
    from costmodel.replay.trace_evaluator import ReplayEvaluator
    from lagom.orchestration import tuning
    from traces.reader import read_trace

    (workload,) = read_trace(EXAMPLES / "fsdp8_a100_2ch_synthetic.json.gz")
    cluster = load_cluster("a100-nvswitch")

    def outcome():
        return tuning.tune(workload, cluster, ReplayEvaluator(AnalyticEvaluator(cluster), 8), budget=60)

    whole = outcome()
    slims: list[int] = []
    original = objective.Objective._slim

    def counted(self, measured):
        slims.append(1)
        return original(self, measured)

    monkeypatch.setattr(objective, "FULL_TIMINGS_BYTES", 1)  # room for two
    monkeypatch.setattr(tuning, "FULL_TIMINGS_BYTES", 1)
    monkeypatch.setattr(objective.Objective, "_slim", counted)
    bounded = outcome()
    assert len(slims) > 20  # most points were kept slim
    for a, b in ((whole.result, bounded.result), (whole.autoccl, bounded.autoccl)):
        assert a is not None and b is not None
        assert a.plan == b.plan and a.evaluations == b.evaluations
        assert a.iteration_us == pytest.approx(b.iteration_us, rel=1e-12)
        assert len(b.timing.ops) == len(a.timing.ops) > 0  # the result's timing is whole
