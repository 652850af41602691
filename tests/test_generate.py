"""Workload generators: spec parsing, shapes, message sizes and the schedule's dependencies."""

from __future__ import annotations

import pytest

from nccl_env import CollectiveType, LagomError
from traces.generate import MODELS, PAPER_WORKLOADS, generate_workload, parse_spec
from traces.workload import DependencyKind, Op, Workload
from traces.workload_io import load_workload, save_workload


def by_label(w: Workload, text: str):
    ops: list[Op] = [*w.compute_ops, *w.collectives]
    return [o for o in ops if text in o.name]


def test_parse_spec_examples_and_aliases():
    s = parse_spec("fsdp:llama3-8b:gpus=16")
    assert (s.kind, s.model.name, s.gpus, s.micro_batch, s.steps) == ("fsdp", "llama3-8b", 16, 1, 2)
    s = parse_spec("tp:phi2:tp=8,dp=2")
    assert (s.tp, s.dp, s.gpus, s.micro_batch) == (8, 2, 16, 8)
    assert parse_spec("tp:phi2:tp=8,gpus=16").dp == 2
    assert parse_spec("ep:olmoe:ep=8").model.name == "olmoe-1b-7b"
    assert parse_spec("ep:deepseek-moe:ep=8").model.name == "deepseek-moe-16b"
    s = parse_spec("fsdp:hidden=5120,layers=40,ffn=13824,heads=40,vocab=32000:gpus=16")
    assert (s.model.hidden, s.model.layers, s.model.ffn, s.gpus) == (5120, 40, 13824, 16)
    assert len(PAPER_WORKLOADS) == 16 and all(parse_spec(p) for p in PAPER_WORKLOADS)


@pytest.mark.parametrize("bad", ["", "fsdp", "xyz:phi2", "fsdp:gpt5", "fsdp:phi2:gpus=0", "fsdp:phi2:tp=8",
                                 "tp:phi2:tp=3", "tp:phi2:tp=8,gpus=12", "ep:phi2:ep=8", "fsdp:hidden=10:gpus=8",
                                 "fsdp:phi2:gpus=x",
                                 "fsdp:phi2:gpus=8,gpus=16",
                                 "fsdp:hidden=64,hidden=128,layers=1,ffn=8,heads=1,vocab=8:gpus=8"])
def test_bad_specs_are_one_line_lagom_errors(bad):
    with pytest.raises(LagomError) as info:
        parse_spec(bad)
    assert "\n" not in str(info.value) and "spec" in str(info.value)


def test_fsdp_llama_is_large_and_exact():
    w = generate_workload("fsdp:llama3-8b:gpus=16")
    assert len(w.compute_ops) + len(w.collectives) > 1000
    assert w.rank == 0 and w.groups["0"].size == 16 and w.groups["0"].nodes == 2
    m = MODELS["llama3-8b"]
    layer_params = 4096 * (32 + 16) * 128 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert m.layer_params() == layer_params
    ags = [c for c in w.collectives if "L5 allgather fwd" in c.name]
    assert ags[0].message_bytes == -(-layer_params // 16) * 16 * 2
    assert ags[0].collective is CollectiveType.ALLGATHER
    # per step: one forward + one backward gather per layer, one ReduceScatter per layer
    rs = [c for c in w.collectives if c.collective is CollectiveType.REDUCESCATTER]
    assert len(rs) == 2 * (32 + 1)
    for op in w.compute_ops:
        assert op.flops > 0 and op.dram_bytes > 0 and op.grid and op.block and op.blocks_per_sm


def test_fsdp_schedule_prefetches_and_reduce_scatters_follow_gradients():
    w = generate_workload("fsdp:phi2:gpus=8")
    deps = {(d.before, d.after) for d in w.dependencies}
    assert all(d.kind is DependencyKind.DATA for d in w.dependencies)
    ag5 = by_label(w, "s0 L5 allgather fwd")[0]
    qkv5 = by_label(w, "s0 L5 qkv fwd")[0]
    norm5 = by_label(w, "s0 L5 norm1 fwd")[0]
    assert (ag5.op_id, norm5.op_id) in deps  # layer 5 waits for its parameters
    fc2_3 = by_label(w, "s0 L3 fc2 fwd")[0]
    assert (fc2_3.op_id, ag5.op_id) in deps  # prefetch of L5 waits until L3 is done: it overlaps L4
    assert ag5.start_us < qkv5.start_us
    rs5 = by_label(w, "s0 L5 reducescatter")[0]
    qkv_wgrad5 = by_label(w, "s0 L5 norm1 bwd")[0]
    assert (qkv_wgrad5.op_id, rs5.op_id) in deps
    # GEMM launch shape comes from the tiling
    fc1 = by_label(w, "s0 L0 fc1 fwd")[0]
    assert "256x128" in fc1.name and fc1.grid == (10240 // 128, 4096 // 256, 1) and fc1.block == (256, 1, 1)
    assert fc1.flops == 2.0 * 4096 * 10240 * 2560


def test_tp_domino_and_ep_two_batch_overlap():
    w = generate_workload("tp:phi2:tp=8,dp=2")
    assert w.groups["tp"].nodes == 1 and w.groups["dp"].nodes == 2 and w.groups["dp"].ranks == (0, 8)
    ar = [c for c in w.collectives if c.group == "tp"]
    assert all(c.message_bytes == 4 * 2048 * 2560 * 2 for c in ar)  # half of micro-batch 8
    # half 0's AllReduce is issued before half 1's attention: they can overlap
    ar0 = by_label(w, "s0 L0 h0 attn allreduce fwd")[0]
    attn1 = by_label(w, "s0 L0 h1 attn fwd")[0]
    deps = {(d.before, d.after) for d in w.dependencies}
    assert (ar0.op_id, attn1.op_id) not in deps and ar0.start_us < attn1.start_us + attn1.duration_us
    assert len([c for c in w.collectives if c.group == "dp"]) == 32
    e = generate_workload("ep:olmoe:ep=8")
    a2a = [c for c in e.collectives if c.collective is CollectiveType.ALLTOALL]
    assert a2a and all(c.message_bytes == 2048 * 8 * 2048 * 2 for c in a2a)


def test_generated_workload_round_trips(tmp_path):
    w = generate_workload("ep:deepseek-moe-16b:ep=8,gpus=16")
    save_workload(w, tmp_path / "w.json.gz")
    assert load_workload(tmp_path / "w.json.gz").to_dict() == w.to_dict()
    starts = {}
    for op in sorted((*w.compute_ops, *w.collectives), key=lambda o: o.start_us):
        assert op.start_us >= starts.get(op.stream, 0.0)
        starts[op.stream] = op.end_us
