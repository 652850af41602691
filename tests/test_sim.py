"""The simulator as an Evaluator: protocol, schedule, noise, tiny workloads."""

from __future__ import annotations

import pytest

from costmodel.cluster import load_cluster
from costmodel.evaluator import Evaluator
from costmodel.sim.simulator import Simulator, tiny_overlap_workload
from nccl_env import CollectiveType, CommConfig, LagomError, Plan, Signature
from traces.generate import generate_workload
from traces.workload import ComputeOp


def ffn_gemm(tokens=4096, hidden=4096, ffn=14336) -> ComputeOp:
    return generate_workload(f"fsdp:hidden={hidden},layers=1,ffn={ffn},heads=32,vocab=1024:gpus=8,mb=1,seq={tokens}") \
        .compute_ops[6]


def test_protocol_counts_and_fills_every_op():
    sim = Simulator(load_cluster("low-bw"))
    assert isinstance(sim, Evaluator)
    w = generate_workload("fsdp:phi2:gpus=8")
    t = sim.evaluate(w, Plan())
    assert sim.evaluations == 1
    assert set(t.ops) == {o.op_id for o in (*w.compute_ops, *w.collectives)}
    # dependencies and stream order hold in the simulated schedule
    for d in w.dependencies:
        assert t.ops[d.after].start_us >= t.ops[d.before].end_us - 1e-6
    by_stream = {}
    for o in sorted(w.compute_ops, key=lambda o: t.ops[o.op_id].start_us):
        prev = by_stream.get(o.stream)
        assert prev is None or t.ops[o.op_id].start_us >= prev - 1e-6
        by_stream[o.stream] = t.ops[o.op_id].end_us
    assert t.iteration_us >= max(t.compute_us, t.comm_us)
    assert 0 <= t.exposed_comm_us <= t.comm_us
    sim.evaluate(w, Plan())
    assert sim.evaluations == 2


def test_noise_is_seeded_and_zero_is_exact():
    w = generate_workload("ep:olmoe:ep=8")
    cl = load_cluster("high-bw")
    a = [Simulator(cl, noise=0.02, seed=5).evaluate(w, Plan()).iteration_us for _ in range(2)]
    assert a[0] == a[1]
    b = Simulator(cl, noise=0.02, seed=6).evaluate(w, Plan()).iteration_us
    assert b != a[0] and abs(b / a[0] - 1) < 0.05
    exact = Simulator(cl, noise=0.0)
    assert exact.evaluate(w, Plan()).iteration_us == exact.evaluate(w, Plan()).iteration_us


@pytest.mark.parametrize("kwargs", [{"noise": float("nan")}, {"noise": float("inf")}, {"noise": -0.01},
                                    {"seed": -1}, {"seed": 1.5}])
def test_bad_noise_or_seed_is_a_lagom_error(kwargs):
    """NaN noise used to switch noise off silently; a negative seed raised numpy's ValueError."""
    with pytest.raises(LagomError, match="noise|seed"):
        Simulator(load_cluster("high-bw"), **kwargs)


def test_tiny_workload_entry_points():
    sim = Simulator(load_cluster("low-bw"), noise=0.0)
    op = ffn_gemm()
    sig = Signature("g", CollectiveType.ALLREDUCE, 32 << 20, 8, 1)
    alone = sim.compute_time_us(op)
    comp, coll = sim.overlap_us(op, sig, CommConfig(channels=16))
    assert comp > alone
    assert coll == pytest.approx(sim.collective_time_us(sig, CommConfig(channels=16)), rel=0.25)
    assert sim.evaluations == 0  # helpers are not evaluations
    t = sim.evaluate(tiny_overlap_workload(op, sig), Plan())
    assert len(t.ops) == 2 and sim.evaluations == 1


def test_speed_fsdp_llama_16_gpus_within_50_ms():
    import time

    sim = Simulator(load_cluster("low-bw"))
    w = generate_workload("fsdp:llama3-8b:gpus=16")
    assert len(w.compute_ops) + len(w.collectives) > 1000
    sim.evaluate(w, Plan())
    best = float("inf")
    for k in range(5):  # CPU time, best of 5: robust to other jobs on a shared machine
        plan = Plan(default=CommConfig(channels=2 + k, chunk_bytes=(512 << 10) << (k % 3)))
        t0 = time.process_time()
        sim.evaluate(w, plan)
        best = min(best, time.process_time() - t0)
    assert best < 0.050


def test_host_side_collective_takes_no_gpu_resources():
    sim = Simulator(load_cluster("low-bw"), noise=0.0)
    op = ffn_gemm()
    sig = Signature("g", CollectiveType.ALLREDUCE, 32 << 20, 8, 1)
    wl = tiny_overlap_workload(op, sig)
    on_gpu = sim.evaluate(wl, Plan(default=CommConfig(channels=32)))
    wl_host = tiny_overlap_workload(op, sig)
    wl_host.collectives[0].on_gpu = False
    host = sim.evaluate(wl_host, Plan(default=CommConfig(channels=32)))
    assert host.ops[0].duration_us == pytest.approx(sim.compute_time_us(op))
    assert on_gpu.ops[0].duration_us > 1.1 * host.ops[0].duration_us


@pytest.mark.parametrize("name", ["low-bw", "a100-nvswitch", "h100-nvswitch"])
def test_kernel_time_grows_with_channels_and_chunk(name):
    sim = Simulator(load_cluster(name), noise=0.0)
    op = ffn_gemm()
    alone = sim.compute_time_us(op)
    for chunk in (256 << 10, 2 << 20):
        times = [sim.compute_time_us(op, nc, chunk) for nc in (1, 2, 4, 8, 16, 32, 64)]
        assert times[0] >= alone and all(b >= a for a, b in zip(times, times[1:]))
    for nc in (2, 8):
        times = [sim.compute_time_us(op, nc, 1 << k) for k in range(15, 24)]
        assert all(b >= a for a, b in zip(times, times[1:]))
    # a collective's DRAM traffic slows a memory-bound kernel
    norm = next(o for o in generate_workload("fsdp:phi2:gpus=8").compute_ops if "norm1 fwd" in o.name)
    assert sim.compute_time_us(norm, comm_dram_bytes_per_us=sim._bw / 2) > 1.5 * sim.compute_time_us(norm) - 4.0


def test_alltoall_follows_nccls_p2p_path_in_both_evaluators():
    """NCCL runs point-to-point with its own thread count (NCCL_NTHREADS is not read) and a
    default step of 128 KiB over PCIe or the network, 512 KiB inside an NVSwitch node."""
    from costmodel.analytic.evaluator import AnalyticEvaluator
    from costmodel.nccl_defaults import nccl_default_config

    a2a = Signature("ep", CollectiveType.ALLTOALL, 64 << 20, 8, 1)
    assert nccl_default_config(load_cluster("low-bw"), a2a).chunk_bytes == 128 << 10  # PCIe
    assert nccl_default_config(load_cluster("high-bw"), a2a).chunk_bytes == 128 << 10  # A40 pairs: not all-NVLink
    assert nccl_default_config(load_cluster("a100-nvswitch"), a2a).chunk_bytes == 512 << 10
    across = Signature("ep", CollectiveType.ALLTOALL, 64 << 20, 16, 2)
    assert nccl_default_config(load_cluster("a100-nvswitch"), across).chunk_bytes == 128 << 10
    cluster = load_cluster("low-bw")
    for evaluator in (Simulator(cluster), AnalyticEvaluator(cluster)):
        few = evaluator.collective_time_us(a2a, CommConfig(threads=64))
        assert few == evaluator.collective_time_us(a2a, CommConfig()) == \
            evaluator.collective_time_us(a2a, CommConfig(threads=512, algorithm=None))
        assert evaluator.collective_time_us(a2a, CommConfig(chunk_bytes=1 << 20)) != few  # the step still counts
    ag = Signature("0", CollectiveType.ALLGATHER, 64 << 20, 8, 1)
    sim = Simulator(cluster)
    assert sim.collective_time_us(ag, CommConfig(threads=64)) > sim.collective_time_us(ag, CommConfig(threads=512))


def test_a_hop_costs_nccls_latency_for_its_algorithm_and_protocol_over_the_presets_ring_ll_figure():
    """A preset's latency_us is NCCL's Ring/LL hwLat; a step of another protocol or algorithm costs NCCL's own
    ratio to it (tuning.cc hwLat: NVLink ring LL128 1.9 / 0.6, Simple 3.4 / 0.6; a network tree hop 5.0 / 2.7)."""
    from costmodel.nccl_defaults import protocol_hop_factors
    from nccl_env.knobs import Algorithm, Protocol

    h100, low = load_cluster("h100-nvswitch"), load_cluster("low-bw")
    assert protocol_hop_factors(h100, Algorithm.RING, Protocol.LL) == (1.0, 1.0)
    assert protocol_hop_factors(h100, Algorithm.RING, Protocol.LL128) == pytest.approx((1.9 / 0.6, 4.0 / 2.7))
    assert protocol_hop_factors(h100, Algorithm.RING, Protocol.SIMPLE) == pytest.approx((3.4 / 0.6, 14.0 / 2.7))
    assert protocol_hop_factors(h100, Algorithm.TREE, Protocol.LL) == pytest.approx((1.0, 5.0 / 2.7))
    assert protocol_hop_factors(low, Algorithm.RING, Protocol.SIMPLE) == pytest.approx((5.7 / 1.0, 14.0 / 2.7))
    # the simulator charges it: the same 8 MiB ring AllGather on LL128 pays 7 hops x (1.9 - 0.6) us more than the
    # hop latency of LL would give, whatever else its pipeline costs, and LL128's base latency once beyond the
    # launch figure's (tuning.cc baseLat Ring: LL 6.6, LL128 14.0, Simple 8.4 us; the launch stands for LL/Simple)
    from costmodel.nccl_defaults import protocol_base_excess_us

    assert [protocol_base_excess_us(p) for p in (Protocol.LL, Protocol.LL128, Protocol.SIMPLE)] == pytest.approx(
        [0.0, 5.6, 0.0])
    sim = Simulator(h100, noise=0.0)
    sig = Signature("g", CollectiveType.ALLGATHER, 8 << 20, 8, 1)
    config = CommConfig(algorithm=Algorithm.RING, protocol=Protocol.LL128, channels=16, threads=640,
                        chunk_bytes=1 << 17)
    model = sim.collective_model(sig, config)
    share_bytes = (8 << 20) // (8 * 16)  # a channel's share: under the chunk, so one step moves it (LL128 at 36.7 GB/s)
    assert model.fixed_us == pytest.approx(5.0 + (14.0 - 8.4) + 7 * 1.9 + share_bytes / 36.7e3 + 0.4, rel=1e-9)
