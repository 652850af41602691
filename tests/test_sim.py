"""The simulator as an Evaluator: protocol, schedule, noise, tiny workloads."""

from __future__ import annotations

import pytest

from costmodel.cluster import load_cluster
from costmodel.evaluator import Evaluator
from costmodel.sim import Simulator, tiny_overlap_workload
from nccl_env import CollectiveType, CommConfig, Plan, Signature
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
