"""traces.kineto.read_trace on the real shared traces and on constructed ones."""

from __future__ import annotations

import gzip
import shutil

import orjson
import pytest
from conftest import trace_path
from kineto_builder import TraceBuilder

from nccl_env import CollectiveType, CommPath
from traces import DependencyKind, StreamKind, Workload
from traces.comm_names import is_symmetric_kernel
from traces.kineto import read_trace

DTYPE_BYTES = {"Float": 4, "Long": 8}  # PyTorch: float32, int64


def _raw(name: str) -> list[dict]:
    return orjson.loads(gzip.decompress(trace_path(name).read_bytes()))["traceEvents"]


def test_a100_trace_collectives_come_from_kernel_metadata():
    (w,) = read_trace(trace_path("a100_w2_allreduce_broadcast.json.gz"))
    assert (w.rank, w.world_size, w.device_name, w.sm_count) == (0, 2, "NVIDIA A100-PG509-200", 108)
    raw_nccl = sorted(
        (e for e in _raw("a100_w2_allreduce_broadcast.json.gz") if e.get("cat") == "kernel"
         and e["name"].startswith("nccl")),
        key=lambda e: e["ts"],
    )
    assert [c.collective for c in w.collectives].count(CollectiveType.ALLREDUCE) == 15
    assert [c.collective for c in w.collectives].count(CollectiveType.BROADCAST) == 6
    for c, e in zip(w.collectives, raw_nccl):
        a = e["args"]
        assert c.name == e["name"]
        assert c.message_bytes == max(a["In msg nelems"], a["Out msg nelems"]) * DTYPE_BYTES[a["dtype"]]
        assert c.group == a["Process Group Name"] and c.dtype == a["dtype"] and c.on_gpu
        assert c.duration_us == pytest.approx(e["dur"])
    assert w.groups["0"].ranks == (0, 1)
    assert {s.stream_id: s.kind for s in w.streams} == {7: StreamKind.COMPUTE, 40: StreamKind.COMMUNICATION}
    assert len(w.profiler_steps) == 3


def test_compute_ops_carry_launch_shape_and_memory_ops_are_flagged():
    (w,) = read_trace(trace_path("a100_w2_allreduce_broadcast.json.gz"))
    raw = _raw("a100_w2_allreduce_broadcast.json.gz")
    kernels = [e for e in raw if e.get("cat") == "kernel" and not e["name"].startswith("nccl")]
    memory = [e for e in raw if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    # gpu_user_annotation spans are not kernels.
    assert len(w.compute_ops) == len(kernels) + len(memory)
    assert sum(o.is_memory_op for o in w.compute_ops) == len(memory)
    raw_ops = sorted(kernels + memory, key=lambda e: (e["ts"], e["args"]["stream"]))
    for op, e in zip(w.compute_ops, raw_ops):
        a = e["args"]
        assert op.name == e["name"]
        if e["cat"] == "kernel":
            assert (list(op.grid), list(op.block)) == (a["grid"], a["block"])
            assert (op.registers_per_thread, op.shared_memory_bytes) == (a["registers per thread"], a["shared memory"])
            assert op.blocks_per_sm == a["blocks per SM"] and op.occupancy_pct == a["est. achieved occupancy %"]
    assert all(o.launch_us is not None and o.launch_us <= o.start_us for o in w.compute_ops)
    starts = [o.start_us for o in w.compute_ops]
    assert starts == sorted(starts)
    ids = [o.op_id for o in (*w.compute_ops, *w.collectives)]
    assert len(set(ids)) == len(ids)


def test_sendrecv_kernels_take_their_type_from_the_cpu_comm_call():
    # w128: every NCCL kernel is a SendRecv kernel; the launching nccl:all_to_all /
    # record_param_comms / c10d:: calls say what the collective really was.
    (w,) = read_trace(trace_path("w128_sendrecv_rank0.json.gz"))
    assert (w.rank, w.world_size) == (0, 128)
    assert all("SendRecv" in c.name for c in w.collectives)
    types = {c.collective for c in w.collectives}
    assert {CollectiveType.ALLTOALL, CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER} <= types
    # nccl:all_to_all with Input Dims [[419430400]] of 'unsigned char' (1 byte each).
    assert any(c.collective is CollectiveType.ALLTOALL and c.message_bytes == 419430400 for c in w.collectives)


def test_cpu_only_gloo_trace_yields_cpu_collectives():
    (w,) = read_trace(trace_path("cpu_only_rank34.json.gz"))
    assert (w.rank, w.world_size) == (34, 300)
    assert not w.compute_ops
    # 11 gloo:all_reduce events, one an exact duplicate.
    assert len(w.collectives) == 10
    assert all(not c.on_gpu and c.collective is CollectiveType.ALLREDUCE for c in w.collectives)
    assert sorted({c.message_bytes for c in w.collectives}) == [321271 * 4, 2082411 * 4]
    assert all(w.stream_kind(c.stream) is StreamKind.COMMUNICATION and c.stream < 0 for c in w.collectives)
    assert len(w.groups["0"].ranks) == 300


def test_trace_without_distributed_info_still_reads():
    (w,) = read_trace(trace_path("no_distributed_info.json.gz"))
    assert w.rank == 0 and w.world_size >= 1
    assert w.collectives and all(c.collective is CollectiveType.ALLTOALL for c in w.collectives)


def test_workload_json_round_trip_of_a_real_trace():
    (w,) = read_trace(trace_path("w128_sendrecv_rank1.json.gz"))
    again = Workload.from_dict(orjson.loads(orjson.dumps(w.to_dict())))
    assert again.to_dict() == w.to_dict()
    assert again.compute_ops[5].launch_us == w.compute_ops[5].launch_us


def test_directory_of_ranks_shares_one_clock(tmp_path):
    for name in ("w128_sendrecv_rank0.json.gz", "w128_sendrecv_rank1.json.gz"):
        shutil.copy(trace_path(name), tmp_path / name)
    ws = read_trace(tmp_path)
    assert [w.rank for w in ws] == [0, 1]
    raw0 = min(e["ts"] for e in _raw("w128_sendrecv_rank0.json.gz") if e.get("cat") == "kernel")
    raw1 = min(e["ts"] for e in _raw("w128_sendrecv_rank1.json.gz") if e.get("cat") == "kernel")
    first0 = min(o.start_us for o in ws[0].compute_ops + ws[0].collectives)
    first1 = min(o.start_us for o in ws[1].compute_ops + ws[1].collectives)
    assert first1 - first0 == pytest.approx(raw1 - raw0)


def test_rank_from_file_name_when_no_distributed_info(tmp_path):
    b = TraceBuilder(rank=None)
    b.kernel("gemm", 7, 100, 10)
    b.write(tmp_path / "job_rank3.json")
    b.write(tmp_path / "job-rank-5.json.gz")
    assert [w.rank for w in read_trace(tmp_path)] == [3, 5]
    with pytest.raises(Exception, match="both rank 3"):
        b.write(tmp_path / "other_rank3.json")
        read_trace(tmp_path)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", CollectiveType.ALLREDUCE),  # NCCL <= 2.8
        ("ncclKernel_ReduceScatter_RING_SIMPLE_Sum_bf16(ncclDevComm*, unsigned long, ncclWork*)",
         CollectiveType.REDUCESCATTER),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
         CollectiveType.ALLGATHER),  # >= 2.19
        ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", CollectiveType.SENDRECV),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", CollectiveType.BROADCAST),
    ],
)
def test_every_generation_of_nccl_kernel_name(tmp_path, name, expected):
    b = TraceBuilder()
    b.kernel("gemm", 7, 100, 10)
    b.kernel(name, 20, 100, 50)
    (w,) = read_trace(b.write(tmp_path / "t.json"))
    assert [c.collective for c in w.collectives] == [expected]
    assert w.stream_kind(20) is StreamKind.COMMUNICATION


def test_legacy_categories_and_generic_kernel_joined_to_record_param_comms(tmp_path):
    # Legacy spellings (Kernel, Runtime, Operator, Memcpy); an RCCL-style generic kernel
    # whose collective and size come from record_param_comms via External id.
    b = TraceBuilder(categories={"kernel": "Kernel", "runtime": "Runtime", "cpu": "Operator"})
    b.cpu("record_param_comms", 50, 20, **{"Collective name": "reduce_scatter_tensor", "In msg nelems": 4096,
                                          "Out msg nelems": 1024, "dtype": "BFloat16", "Process Group Name": "7",
                                          "Process Group Ranks": "[0, 1, 2, 3]", "Group size": 4})
    b.kernel("ncclDevKernel_Generic_4(ncclDevComm*, unsigned long, ncclWork*)", 30, 100, 40, launch_ts=60)
    b.kernel("Memcpy DtoD (Device -> Device)", 7, 200, 5, cat="Memcpy")
    b.kernel("gemm", 7, 90, 30)
    (w,) = read_trace(b.write(tmp_path / "legacy.json.gz"))
    (c,) = w.collectives
    assert ((c.collective, c.message_bytes, c.dtype, c.group)
            == (CollectiveType.REDUCESCATTER, 4096 * 2, "BFloat16", "7"))
    assert w.groups["7"].ranks == (0, 1, 2, 3)
    assert [o.is_memory_op for o in w.compute_ops] == [False, True]
    assert w.stream_kind(7) is StreamKind.COMPUTE


def test_stream_wait_events_become_dependencies(tmp_path):
    b = TraceBuilder()
    gemm_corr = b.kernel("gemm", 7, 100, 50, launch_ts=10)
    b.corr += 1
    record_corr = b.corr  # cudaEventRecord after the gemm launch
    b.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 1, "tid": 1, "ts": 12,
                     "dur": 1, "args": {"correlation": record_corr}})
    b.corr += 1
    wait_corr = b.corr
    b.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 20, "ts": 150,
                     "dur": 0, "args": {"stream": 20, "correlation": wait_corr, "wait_on_stream": 7,
                                        "wait_on_cuda_event_record_corr_id": record_corr}})
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", 20, 151, 30, launch_ts=14)
    b.kernel("relu", 7, 152, 5, launch_ts=15)
    (w,) = read_trace(b.write(tmp_path / "deps.json"))
    gemm = next(o for o in w.compute_ops if o.name == "gemm")
    (dep,) = w.dependencies
    assert dep.before == gemm.op_id and dep.after == w.collectives[0].op_id and dep.kind is DependencyKind.EVENT
    assert gemm_corr < record_corr < wait_corr


def test_chunked_parsing_reads_the_same_workload(monkeypatch, tmp_path):
    import traces.kineto_json as kj

    monkeypatch.setenv("LAGOM_TRACE_CACHE", "off")  # both reads parse (traces/parse_cache.py would answer the second)
    path = trace_path("a100_w2_allreduce_broadcast.json.gz")
    (whole,) = read_trace(path)
    chunks = []
    real_elements = kj._elements
    monkeypatch.setattr(kj, "CHUNK_BYTES", 64 << 10)  # ~150 chunks instead of one
    monkeypatch.setattr(kj, "_elements", lambda raw, a, b: chunks.append(b - a) or real_elements(raw, a, b))
    (chunked,) = read_trace(path)
    assert len(chunks) > 100
    assert chunked.to_dict() == whole.to_dict()


def test_traceevents_key_inside_a_string_falls_back_to_a_whole_parse(tmp_path):
    b = TraceBuilder()
    b.kernel("gemm", 7, 100, 10)
    doc = b.doc()
    # A metadata string that looks like the key comes first in the file.
    text = orjson.dumps({"note": 'x "traceEvents": [1] y', **doc})
    (tmp_path / "t.json").write_bytes(text)
    (w,) = read_trace(tmp_path / "t.json")
    assert [o.name for o in w.compute_ops] == ["gemm"]
    # Chrome's bare-array format has no traceEvents key at all.
    (tmp_path / "a.json").write_bytes(orjson.dumps(doc["traceEvents"]))
    (w,) = read_trace(tmp_path / "a.json")
    assert [o.name for o in w.compute_ops] == ["gemm"]


@pytest.mark.parametrize("name, expected", [
    ("ncclSymDevKernel_AllGather_ST(ncclSymDevArgs)", CollectiveType.ALLGATHER),  # NCCL 2.27
    ("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_bf16(ncclSymkDevWorkArgs4K)", CollectiveType.ALLREDUCE),  # 2.28+
    ("ncclSymkDevKernel_ReduceScatter_LD_sum_f32(ncclSymkDevWorkArgs4K)", CollectiveType.REDUCESCATTER),
])
def test_nccls_symmetric_kernels_are_collectives_on_their_own_path(tmp_path, name, expected):
    b = TraceBuilder()
    b.kernel("gemm", 7, 100, 10)
    b.kernel(name, 20, 100, 50, grid=(9, 1, 1), block=(512, 1, 1))
    (w,) = read_trace(b.write(tmp_path / "t.json"))
    (c,) = w.collectives
    assert (c.collective, c.recorded_path, c.holds_sms) == (expected, CommPath.SYMMETRIC, True)
    assert is_symmetric_kernel(name) and not is_symmetric_kernel("ncclDevKernel_AllGather_RING_LL(x)")


def test_nccls_copy_engine_path_is_one_collective_of_memory_copies(tmp_path):
    """CTA policy ZERO: NCCL's all-gather is a barrier, a batch of copies to the peers and a barrier,
    all memory copies on the communicator's stream launched inside the collective's CPU call (no
    kernel). They read as one all-gather on the copy engines; a copy outside any collective stays
    a memory op."""
    b = TraceBuilder()
    b.cpu("record_param_comms", 50, 30, **{"Collective name": "all_gather_into_tensor", "In msg nelems": 1024,
                                          "Out msg nelems": 8192, "dtype": "BFloat16", "Process Group Name": "0"})
    for i, (ts, dur) in enumerate([(100, 2), (103, 40), (103, 41), (145, 2)]):  # flags, two peers' copies, flags
        b.kernel("Memcpy PtoP (Device -> Device)", 20, ts, dur, launch_ts=55 + i, cat="gpu_memcpy")
    b.kernel("gemm", 7, 90, 80, launch_ts=40)
    b.kernel("Memcpy DtoD (Device -> Device)", 7, 200, 5, launch_ts=150, cat="gpu_memcpy")
    (w,) = read_trace(b.write(tmp_path / "ce.json"))
    (c,) = w.collectives
    assert (c.collective, c.message_bytes, c.recorded_path, c.holds_sms) == (
        CollectiveType.ALLGATHER, 8192 * 2, CommPath.COPY_ENGINE, False)
    gemm = w.compute_ops[0]
    assert (c.start_us - gemm.start_us, c.duration_us) == (10.0, 47.0)  # first flag copy to the last one
    assert [o.is_memory_op for o in w.compute_ops] == [False, True]  # the gemm and the copy outside
    assert w.stream_kind(20) is StreamKind.COMMUNICATION
    again = Workload.from_dict(w.to_dict())
    assert again.collectives[0].recorded_path is CommPath.COPY_ENGINE



def test_a_trace_off_nccls_sm_kernels_anchors_at_its_own_path(tmp_path):
    """The replay's recorded settings for a symmetric kernel and a copy-engine collective name
    their path, not a channel count (a symmetric kernel's grid is NCCL's CTA pick; the copy
    engines have none), so the trace's own plan replays it as measured and an SM plan is a change."""
    from costmodel.analytic.evaluator import AnalyticEvaluator
    from costmodel.cluster import load_cluster
    from costmodel.replay.anchor import recorded_configs
    from costmodel.replay.trace_evaluator import ReplayEvaluator
    from nccl_env.knobs import CommConfig
    from nccl_env.plan import Plan

    b = TraceBuilder(world_size=8)
    b.step(1, 0, 300)
    b.kernel("gemm", 7, 100, 120, launch_ts=20)
    meta = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "dtype": "Float",
            "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}
    b.kernel("ncclSymkDevKernel_AllReduce_RSxLD_AGxST_sum_f32(ncclSymkDevWorkArgs4K)", 20, 110, 50, launch_ts=30,
             grid=(9, 1, 1), block=(512, 1, 1), **meta)
    b.step(2, 300, 100)
    b.kernel("gemm", 7, 320, 10, launch_ts=305)
    (w,) = read_trace(b.write(tmp_path / "sym.json"))
    (recorded,) = recorded_configs(w, 8).values()
    assert recorded.comm_path is CommPath.SYMMETRIC and recorded.channels is None and recorded.threads == 512
    evaluator = ReplayEvaluator(AnalyticEvaluator(load_cluster("a100-nvswitch")), 8)
    (c,) = w.collectives
    assert evaluator.evaluate(w, Plan()).ops[c.op_id].duration_us == pytest.approx(c.duration_us)
    on_sm = evaluator.evaluate(w, Plan(default=CommConfig(comm_path=CommPath.SM, channels=2)))
    assert on_sm.ops[c.op_id].duration_us != pytest.approx(c.duration_us)
