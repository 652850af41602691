"""The analytic cost model: its closed forms behave as the paper says, its timeline is a real cascade."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from costmodel.analytic.collective_model import collective_estimate
from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.analytic.params import PARAM_NAMES, PATH_PARAMS, default_params, model_section, param_spec, params_for
from costmodel.calibration.calibrate import gemm_op
from costmodel.cluster import load_cluster
from costmodel.evaluator import Evaluator
from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Plan, Protocol, Signature
from traces import CollectiveOp, Dependency, ProcessGroup, Stream, StreamKind, Workload

MIB = 1024 * 1024
RING_SIMPLE = CommConfig(Algorithm.RING, Protocol.SIMPLE, 8, 512, 2 * MIB)


@pytest.fixture(scope="module")
def low_bw():
    return load_cluster("low-bw")


def _time(p, nbytes, channels=8, chunk=2 * MIB, threads=512, proto=Protocol.SIMPLE, ranks=8, nodes=1,
          ctype=CollectiveType.ALLREDUCE, algo=Algorithm.RING):
    return collective_estimate(p, ctype, nbytes, ranks, nodes, 8, algo, proto, channels, threads, chunk, 6 * MIB,
                               696e3 * 0.85).time_us


def test_collective_time_saturates_in_channels_and_has_an_interior_best_chunk(low_bw):
    p = default_params(low_bw)
    times = [_time(p, 64 * MIB, channels=nc) for nc in (1, 2, 4, 8, 16, 32)]
    assert times[0] > 1.5 * times[2]  # few channels: the channels' copy rate is the limit
    assert abs(times[4] - times[5]) / times[4] < 0.05  # many channels: the link is, flat
    chunks = [4 * 1024 * 2**i for i in range(12)]  # 4 KiB .. 8 MiB
    by_chunk = [_time(p, 16 * MIB, chunk=c, channels=4) for c in chunks]
    best = by_chunk.index(min(by_chunk))
    assert by_chunk[0] > 1.2 * by_chunk[best]  # tiny chunks pay a synchronisation per step
    assert best > 0 and by_chunk[-1] >= by_chunk[best]  # and past the best, no gain


def test_collective_time_grows_with_bytes_and_crosses_the_network(low_bw):
    p = default_params(low_bw)
    sizes = [2**i for i in range(12, 30, 2)]
    times = [_time(p, s) for s in sizes]
    assert times == sorted(times)
    busbw_gb = [s * 2 * 7 / 8 / t / 1e3 for s, t in zip(sizes, times)]
    assert busbw_gb[-1] > 10 * busbw_gb[0]  # latency-bound when small, bandwidth-bound when large
    assert busbw_gb[-1] <= p["intra_bw_gb_per_s"] * 1.0001
    assert _time(p, 64 * MIB, ranks=16, nodes=2) > _time(p, 64 * MIB)  # 100 Gb/s NIC < PCIe
    ll = _time(p, 64 * MIB, proto=Protocol.LL)
    assert ll > 1.5 * _time(p, 64 * MIB)  # LL halves the payload: slow for big messages
    assert _time(p, 8 * 1024, proto=Protocol.LL) < _time(p, 8 * 1024)  # but wins on latency


def _window(nbytes: int) -> tuple[Workload, Signature]:
    """A Llama FFN GEMM overlapped with an AllReduce (the paper's first anchor), then a GEMM that
    needs the AllReduce's result."""
    ffn = replace(gemm_op(4096, 14336, 4096), op_id=1, stream=0, start_us=0.0)
    nxt = replace(gemm_op(2048, 4096, 4096), op_id=3, stream=0, start_us=3000.0)
    w = Workload(
        rank=0, world_size=8,
        streams=[Stream(0, StreamKind.COMPUTE), Stream(1, StreamKind.COMMUNICATION)],
        compute_ops=[ffn, nxt],
        collectives=[CollectiveOp(2, "ar", CollectiveType.ALLREDUCE, nbytes, 1, 0.0, 1.0, "tp")],
        groups={"tp": ProcessGroup("tp", tuple(range(8)), 1)},
        dependencies=[Dependency(2, 3)],
        gpus_per_node=8,
    )
    return w, w.signature(w.collectives[0])


def test_compute_slows_with_channels_and_the_cascade_follows(low_bw):
    ev = AnalyticEvaluator(low_bw)
    assert isinstance(ev, Evaluator)
    w, sig = _window(256 * MIB)
    # small chunks keep the L2 to the GEMM: what is left is the SMs the channels hold
    timings = {nc: ev.evaluate(w, Plan({sig: CommConfig(Algorithm.RING, Protocol.SIMPLE, nc, 512, 64 * 1024)}))
               for nc in (1, 2, 8, 16, 32)}
    ffn = [timings[nc].ops[1].duration_us for nc in (1, 2, 8, 16, 32)]
    assert ffn == sorted(ffn) and ffn[-1] > 1.2 * ffn[0]  # SMs taken by channels slow the GEMM
    assert ffn[-1] / ffn[-2] > 1.2  # 32 vs 16 channels: 52 vs 68 free SMs (paper: +30%)
    coll = [timings[nc].ops[2].duration_us for nc in (16, 32)]
    assert abs(coll[0] - coll[1]) / coll[0] < 0.05  # while the AllReduce itself barely changes
    for t in timings.values():
        assert set(t.ops) == {1, 2, 3}
        # the dependent GEMM starts when both the AllReduce and the FFN have ended
        assert t.ops[3].start_us == pytest.approx(max(t.ops[1].end_us, t.ops[2].end_us))
        assert t.iteration_us == pytest.approx(t.ops[3].end_us)
        assert t.compute_slowdown >= 1.0
        assert 0.0 <= t.exposed_comm_us <= t.comm_us
    assert ev.evaluations == 5
    # big chunks take the L2 too: the same channels cost the GEMM more
    big = ev.evaluate(w, Plan({sig: CommConfig(Algorithm.RING, Protocol.SIMPLE, 8, 512, 2 * MIB)}))
    assert big.ops[1].duration_us > 1.05 * timings[8].ops[1].duration_us


def test_alone_compute_is_exact_and_timing_sums_are_consistent(low_bw):
    ev = AnalyticEvaluator(low_bw)
    w, sig = _window(1024)  # a tiny collective: almost no overlap
    t = ev.evaluate(w, Plan({sig: RING_SIMPLE}))
    alone = ev.compute_time_us(w.compute_ops[1])
    assert t.ops[3].duration_us == pytest.approx(alone)  # runs alone: the roofline of its FLOPs and bytes
    assert t.compute_uncontended_us == pytest.approx(ev.compute_time_us(w.compute_ops[0]) + alone)
    assert t.compute_us == pytest.approx(t.ops[1].duration_us + t.ops[3].duration_us)
    assert t.comm_us == pytest.approx(t.ops[2].duration_us)


@pytest.mark.parametrize("spec", ["fsdp:hidden=1024,layers=3,ffn=4096,heads=16,vocab=8000:gpus=16",
                                  "tp:hidden=1024,layers=2,ffn=4096,heads=16,vocab=8000:tp=8,dp=2"])
def test_fast_timelines_agree_with_the_general_one(low_bw, spec):
    """The jump timeline (two streams) and the one-compute-stream loop are optimisations of the
    general phase timeline: same starts and ends for every op, same busy and exposed times."""
    from costmodel.analytic.jump import jump_timeline
    from costmodel.calibration.accuracy import random_plan
    from traces.generate import generate_workload

    w = generate_workload(spec)
    ev = AnalyticEvaluator(low_bw)
    st = ev._statics.get(w)
    rng = random.Random(5)
    for plan in (Plan(), random_plan(rng, w, low_bw), random_plan(rng, w, low_bw)):
        ests = [ev.estimate(s, plan.config_for(s)) for s in st.signatures]
        general = ev._timeline(st, ests)
        fast = ev._timeline_one_compute_stream(st, ests)
        variants = [(fast, st.index)]
        if st.jump is not None:
            starts, ends, busy_c, busy_x, exposed, _, fill = jump_timeline(st.jump, ests, st.pair_many)
            fill()
            variants.append(((starts, ends, busy_c, busy_x, exposed), st.jump.index))
        for result, index in variants:
            for op_id, k in st.index.items():
                assert result[1][index[op_id]] == pytest.approx(general[1][k], rel=1e-6, abs=1e-6)
                assert result[0][index[op_id]] == pytest.approx(general[0][k], rel=1e-6, abs=1e-6)
            for a, b in zip(result[2:5], general[2:5]):
                assert a == pytest.approx(b, rel=1e-6, abs=1e-6)
    assert (st.jump is not None) == spec.startswith("fsdp")
    timing = ev.evaluate(w, Plan())
    assert len(timing.ops) == len(w.compute_ops) + len(w.collectives)
    assert all(timing.ops[o.op_id].duration_us > 0 for o in w.compute_ops)


def test_uncalibrated_cluster_uses_hardware_defaults_and_bad_model_keys_fail(low_bw, tmp_path):
    assert params_for(low_bw) == default_params(low_bw)
    # the fitted parameters and the path ones (copy engines, direct copies: not fitted)
    assert set(default_params(low_bw)) == set(PARAM_NAMES) | {p.name for p in PATH_PARAMS}
    assert not set(PARAM_NAMES) & {p.name for p in PATH_PARAMS}
    # a calibrated file keeps a path figure its cluster file set, and pins none it did not
    defaults = default_params(low_bw)
    assert "ce_bw_gb_per_s" not in model_section(defaults, "sim:x", defaults=defaults)
    assert model_section({**defaults, "ce_bw_gb_per_s": 40.0}, "sim:x", defaults=defaults)["ce_bw_gb_per_s"] == 40.0
    data = low_bw.to_dict()
    data["model"] = {"intra_bw_gb_per_s": 20.0, "no_such_param": 1.0}
    import yaml

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LagomError, match="no_such_param"):
        AnalyticEvaluator(load_cluster(path))
    data["model"] = {"intra_bw_gb_per_s": -3}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(LagomError, match="outside"):
        AnalyticEvaluator(load_cluster(path))


class _ModelTruth:
    """A backend whose truth is the analytic model itself at hidden parameters, with 1% noise:
    calibration must recover those parameters (identifiability of the fit)."""

    def __init__(self, cluster, params, seed=0):
        self.cluster, self.name, self.measurements = cluster, "model-truth", 0
        self.ev = AnalyticEvaluator(cluster, params)
        self.rng = random.Random(seed)

    def _noisy(self, value, count=1):
        self.measurements += count
        return value * (1.0 + self.rng.gauss(0.0, 0.01))

    def rank_layouts(self):
        return [(8, 1), (16, 2)]

    def measure_collective(self, sig, cfg):
        return self._noisy(self.ev.estimate(sig, cfg).time_us)

    def measure_compute(self, op):
        return self._noisy(self.ev.compute_time_us(op))

    def measure_overlap(self, op, sig, cfg):
        a, b = self.ev.overlap_us(op, sig, cfg)
        return self._noisy(a), self._noisy(b, count=0)


@pytest.mark.slow  # a full least-squares fit
def test_fit_recovers_hidden_parameters_through_noise(low_bw):
    from costmodel.calibration.calibrate import calibrate

    truth = default_params(low_bw)
    rng = random.Random(3)
    for name in ("intra_bw_gb_per_s", "net_bw_gb_per_s", "channel_bw_simple_gb_per_s", "sync_simple_us",
                 "launch_us", "gemm_efficiency", "l2_working_set", "fifo_chunks"):
        truth[name] = min(truth[name] * rng.uniform(0.6, 1.5), param_spec(name).upper)
    backend = _ModelTruth(low_bw, truth)
    result = calibrate(backend, budget=200)
    assert backend.measurements <= 200
    for name in ("intra_bw_gb_per_s", "net_bw_gb_per_s", "channel_bw_simple_gb_per_s", "sync_simple_us",
                 "gemm_efficiency"):
        assert result.params[name] == pytest.approx(truth[name], rel=0.05), name
    assert result.report.mape_pct < 1.5  # ~ the noise
    assert result.report.default_mape_pct > 3 * result.report.mape_pct


def test_the_jump_timelines_prefix_sums_follow_the_estimate_not_its_address(low_bw):
    """The jump timeline caches each estimate's prefix sums. Keyed by ``id(estimate)`` (and not
    emptied when the evaluator empties its estimates after 200,000 of them), a new estimate at a
    freed one's address read the old one's sums: an estimate with other values must get its own."""
    from costmodel.analytic.jump import _per_estimate
    from traces.generate import generate_workload

    w = generate_workload("fsdp:hidden=1024,layers=3,ffn=4096,heads=16,vocab=8000:gpus=16")
    ev = AnalyticEvaluator(low_bw)
    st = ev._statics.get(w)
    assert st.jump is not None
    sig = st.signatures[0]
    first = ev.estimate(sig, CommConfig(Algorithm.RING, Protocol.SIMPLE, 2, 512, 2 * MIB))
    _per_estimate(st.jump, replace(first), st.pair_many)  # a copy, freed at once: its address is free again
    for channels in range(3, 40):  # CPython gives a freed object's address to the next one of its size
        other = replace(ev.estimate(sig, CommConfig(Algorithm.RING, Protocol.SIMPLE, channels, 512, 2 * MIB)))
        got = _per_estimate(st.jump, other, st.pair_many)
        y, yx, wait = st.pair_many(other)
        assert got[0] == pytest.approx(y.tolist()) and got[4] == pytest.approx(wait.tolist()), channels
        del other, got
