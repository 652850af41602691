"""Input that real traces bring: mixed jobs, unknown sizes, sizes that vary by step,
communication kernels that are not NCCL's, one-rank jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli, trace_dir
from kineto_builder import TraceBuilder

from costmodel.cluster import load_cluster
from costmodel.replay.trace_evaluator import ReplayEvaluator
from costmodel.sim.simulator import Simulator
from lagom.files.tuned_config import load_tuned_config
from lagom.orchestration import tuning
from nccl_env.knobs import CollectiveType, CommConfig
from nccl_env.plan import Plan
from nccl_env.rules import NcclVersion
from traces.comm_names import (
    collective_from_kernel_name,
    is_comm_kernel,
    is_nccl_kernel,
)
from traces.kineto import read_trace
from traces.size_ranges import power_of_two_range, varying_families
from traces.workload import StreamKind
from traces.workload_io import load_workload, save_workload
from tuner.result import TuneOutcome, TuningResult
from tuner.space import build_space

TRACES = trace_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "w128_sendrecv_rank0.json.gz").is_file(),
                                  reason="a trace of tests/data or traces/examples is missing")
W16 = TRACES / "a100_w16_sendrecv_3streams_rank0.json.gz"
needs_w16 = pytest.mark.skipif(not W16.is_file(), reason=f"{W16.name} is only in ../shared/traces, absent here")


# ---- a directory mixing jobs -------------------------------------------------------------

@needs_traces
def test_directory_of_two_jobs_names_both_files(tmp_path, capsys):
    for name in ("a100_w2_allreduce_broadcast.json.gz", "w128_sendrecv_rank1.json.gz"):
        shutil.copy(TRACES / name, tmp_path / name)
    code, _, err = run_cli(capsys, "analyze", str(tmp_path))
    assert code == 2 and err.count("\n") == 1, err
    assert ("a100_w2_allreduce_broadcast.json.gz and w128_sendrecv_rank1.json.gz are traces of different jobs "
            "(world size 2 and 128)") in err


EXAMPLES = Path(__file__).resolve().parents[1] / "traces" / "examples"


def test_the_example_folder_is_refused_as_two_jobs_not_as_one_rank_twice(capsys):
    """Issue 32: ``lagom analyze traces/examples/`` said "both rank 0" of two unrelated traces (each
    its own job's rank 0): the folder is refused for what it is, two jobs, and the line says how
    to analyse them; named one by one, each is analysed."""
    code, _, err = run_cli(capsys, "analyze", str(EXAMPLES))
    assert code == 2 and err.count("\n") == 1 and "both rank" not in err, err
    assert ("a100_w2_allreduce_broadcast.json.gz and fsdp8_a100_2ch_synthetic.json.gz are traces of different "
            "jobs (world size 2 and 8); a folder is one job's ranks: name the files to analyse each on its own") in err
    code, out, _ = run_cli(capsys, "analyze", *sorted(str(f) for f in EXAMPLES.glob("*.json.gz")), "--json")
    assert code == 0 and [r["world_size"] for r in json.loads(out)["ranks"]] == [2, 8]


def _one_kernel_trace(path: Path, rank: int, device: str = "Test GPU", base_s: int | None = None,
                      ts: float = 100.0) -> Path:
    b = TraceBuilder(rank=rank, world_size=2, device=device)
    if base_s is not None:
        b.metadata["baseTimeNanoseconds"] = str(base_s * 1_000_000_000)
    b.kernel("gemm", 7, ts, 10)
    return b.write(path)


def test_directory_mixing_devices_or_times_is_refused(tmp_path):
    mixed = tmp_path / "devices"
    mixed.mkdir()
    _one_kernel_trace(mixed / "rank0.json", 0, "NVIDIA A100-SXM4-80GB")
    _one_kernel_trace(mixed / "rank1.json", 1, "NVIDIA H100 80GB HBM3")
    with pytest.raises(Exception, match=r"rank0.json and rank1.json are traces of different jobs "
                                        r"\(device NVIDIA A100-SXM4-80GB and NVIDIA H100 80GB HBM3\)"):
        read_trace(mixed)
    days = tmp_path / "days"
    days.mkdir()
    _one_kernel_trace(days / "rank0.json", 0, base_s=1_711_964_646)
    _one_kernel_trace(days / "rank1.json", 1, base_s=1_711_964_646 + 86_400)  # the next day
    with pytest.raises(Exception, match=r"different jobs \(recorded more than a minute apart: "
                                        r"from 2024-04-01 09:44:06 UTC and from 2024-04-02 09:44:06 UTC\)"):
        read_trace(days)


def test_ranks_with_their_own_base_time_share_one_clock(tmp_path):
    # PyTorch writes times relative to each process's baseTimeNanoseconds: rank 1's base is
    # 3 s later, so its kernel at ts=100 ran 3 s after rank 0's kernel at ts=100 + 3e6 - 50.
    _one_kernel_trace(tmp_path / "rank0.json", 0, base_s=1_711_964_646, ts=100.0 + 3e6 - 50)
    _one_kernel_trace(tmp_path / "rank1.json", 1, base_s=1_711_964_649, ts=100.0)
    r0, r1 = read_trace(tmp_path)
    assert r1.compute_ops[0].start_us - r0.compute_ops[0].start_us == pytest.approx(50.0)


# ---- collectives without a recorded size ---------------------------------------------------

SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)"


@needs_w16
def test_kernels_launched_outside_any_sized_call_have_no_size():
    """a100_w16: five SendRecv kernels ran with no comm call around their launch (their launch
    precedes the trace), so nothing records their size."""
    (w,) = read_trace(W16)
    unsized = [c for c in w.collectives if c.message_bytes is None]
    assert len(unsized) == 5 and {c.collective for c in unsized} == {CollectiveType.SENDRECV}
    assert all(c.launch_us is None for c in unsized)
    assert all(c.message_bytes > 0 for c in w.collectives if c.message_bytes is not None)


def test_unknown_size_is_unknown_in_analyze(tmp_path, capsys):
    """The same kernel (a100_w16's name and launch shape) beside one whose size its metadata gives."""
    b = TraceBuilder(rank=0, world_size=16)
    b.kernel("gemm", 7, 100, 500)
    b.kernel(SENDRECV, 285, 150, 71, grid=(24, 1, 1), block=(544, 1, 1))
    b.kernel(SENDRECV, 285, 700, 403, grid=(24, 1, 1), block=(544, 1, 1))
    b.kernel(SENDRECV, 363, 1200, 224, grid=(24, 1, 1), block=(544, 1, 1), **{
        "Collective name": "all_to_all", "dtype": "Float", "In msg nelems": 96, "Out msg nelems": 96,
        "Process Group Name": "0", "Group size": 16})
    trace = b.write(tmp_path / "w16.json")
    code, out, err = run_cli(capsys, "analyze", str(trace), "--json")
    assert code == 0, err
    rows = {r["message_bytes"]: r for r in json.loads(out)["ranks"][0]["collectives"]}
    assert set(rows) == {None, 384}
    assert (rows[None]["collective"], rows[None]["count"], rows[None]["total_us"]) == ("sendrecv", 2, 474.0)
    assert rows[None]["exposed_us"] == pytest.approx(403.0)  # the GEMM (100..600) hides the first one
    code, out, _ = run_cli(capsys, "analyze", str(trace))
    line = next(ln for ln in out.splitlines() if "sendrecv" in ln)
    assert "unknown" in line and " 0 B" not in line


@needs_w16
def test_tune_warns_once_about_unsized_collectives(tmp_path, capsys):
    code, _, err = run_cli(capsys, "tune", str(W16), "--evaluator", "sim", "--budget", "2", "--no-autoccl",
                           "-o", str(tmp_path / "x.yaml"), "--json")
    assert code == 0, err
    assert err.count("no recorded message size") == 1
    assert "5 collectives have no recorded message size (sendrecv x5): left out of tuning" in err


@needs_w16
def test_varying_sizes_get_power_of_two_ranges_and_unknown_sizes_no_entry():
    """a100_w16's all-to-alls: one size changes every step (2,621,684 .. 2,809,424 B), the
    rest repeat; the five unsized SendRecv kernels are in no signature and no entry."""
    (w,) = read_trace(W16)
    assert varying_families(w) == {("0", CollectiveType.ALLTOALL)}
    cluster = load_cluster("a100-nvswitch")
    space = tuning.space_for(w, cluster)
    assert not any(s.collective is CollectiveType.SENDRECV for s in space.signatures)
    ids = {i for group in space.collective_ids.values() for i in group}
    assert {c.op_id for c in w.collectives if c.message_bytes is None}.isdisjoint(ids)
    plan = space.plan(space.minimum_point())  # a plan that sets every signature
    timing = ReplayEvaluator(Simulator(cluster, noise=0.0), cluster.gpus_per_node).evaluate(w, plan)
    outcome = TuneOutcome(space, TuningResult("test", plan, timing, 1), timing, None)
    config = tuning.tuned_config(outcome, cluster, "a100-nvswitch", str(W16), min_gain=0.0)
    assert not any(e.match.collective is CollectiveType.SENDRECV or e.match.max_bytes == 0
                   for e in config.collectives)
    sizes = sorted({c.message_bytes for c in w.collectives if c.collective is CollectiveType.ALLTOALL})
    alltoall = [e.match for e in config.collectives if e.match.collective is CollectiveType.ALLTOALL]
    assert len(sizes) == 13
    assert sorted((m.min_bytes, m.max_bytes) for m in alltoall) == sorted({power_of_two_range(s) for s in sizes})
    assert len(alltoall) == 6
    for size in (*sizes, 2_700_000):  # every size seen, and one the next step may bring
        hits = [m for m in alltoall if m.min_bytes <= size <= m.max_bytes]
        assert len(hits) == 1 and hits[0].max_bytes == 2 * hits[0].min_bytes - 1
    # the fixed-size families keep one exact size per entry, and the file gives back the plan
    assert all(e.match.min_bytes == e.match.max_bytes for e in config.collectives
               if e.match.collective is not CollectiveType.ALLTOALL)
    assert config.to_plan(space.signatures).entries == plan.entries


@needs_traces
def test_sizes_of_one_range_share_their_per_collective_settings():
    """w128 rank 0: its all-reduces change size between the two steps; on NCCL 2.21 (plugin:
    per-collective channels) the three sizes in [64 MiB, 128 MiB) form one unit."""
    (w,) = read_trace(TRACES / "w128_sendrecv_rank0.json.gz")
    assert ("0", CollectiveType.ALLREDUCE) in varying_families(w)
    cluster = load_cluster("a100-nvswitch")
    cluster.nccl_version = NcclVersion.parse("2.21.5")
    space = build_space(w, cluster)
    sizes = sorted(s.message_bytes for s in space.signatures if s.collective is CollectiveType.ALLREDUCE)
    in_range = [s for s in sizes if 1 << 26 <= s < 1 << 27]
    assert in_range == [78_473_228, 105_033_720, 107_822_144]  # step 0 has the first and last, step 1 the middle
    units = [u for u in space.resource_units if "channels" in u.axes
             and {s.message_bytes for s in u.signatures} & set(in_range)]
    assert len(units) == 1 and {s.message_bytes for s in units[0].signatures} == set(in_range)
    assert units[0].key == f"allreduce {1 << 26}-{(1 << 27) - 1}B x128r/16n"


def _alltoall_steps(path: Path, steps: list[list[int]]) -> Path:
    """One profiler step per list, one all-to-all per element count in it (bf16)."""
    b = TraceBuilder(rank=0, world_size=2)
    for n, counts in enumerate(steps):
        b.step(n, n * 1000.0, 900.0)
        for k, nelems in enumerate(counts):
            b.kernel("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", 20, n * 1000.0 + 100 + 200 * k,
                     50, **{"Collective name": "all_to_all", "dtype": "BFloat16", "In msg nelems": nelems,
                            "Out msg nelems": nelems, "Process Group Name": "0", "Group size": 2})
    return b.write(path)


def test_a_trace_cut_inside_its_last_step_does_not_vary(tmp_path):
    (w,) = read_trace(_alltoall_steps(tmp_path / "cut.json", [[1000, 3000], [1000, 3000], [1000]]))
    assert varying_families(w) == set()  # the last step only lost a size: the trace ends inside it
    (w,) = read_trace(_alltoall_steps(tmp_path / "moe.json", [[1000, 3000], [1000, 3000], [1000, 3100]]))
    assert varying_families(w) == {("0", CollectiveType.ALLTOALL)}


# ---- communication kernels that are not NCCL's ---------------------------------------------

MULTIMEM = ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, "
            "unsigned long, unsigned int**, unsigned long, unsigned long)")
NCCL_AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.mark.parametrize("name, collective", [
    (MULTIMEM, CollectiveType.ALLREDUCE),  # PyTorch symmetric memory (NVLink SHARP)
    (("void (anonymous namespace)::multimem_all_gather_kernel<16>(char*, char*, unsigned long, unsigned int**, "
      "unsigned long, unsigned long)"), CollectiveType.ALLGATHER),
    (("void (anonymous namespace)::one_shot_all_reduce_kernel<float, 16, 8>(float**, float*, float*, unsigned long, "
      "unsigned long, unsigned int**, unsigned long, unsigned long)"), CollectiveType.ALLREDUCE),
    (("void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 8>(c10::BFloat16**, "
      "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)"), CollectiveType.ALLREDUCE),
    (("void c10d::intra_node_comm::oneShotAllReduceKernel<8u, true>(c10::BFloat16*, unsigned long, unsigned long, "
      "c10d::intra_node_comm::P2pState**, c10::BFloat16**, unsigned long)"), CollectiveType.ALLREDUCE),
    (("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
      "__nv_bfloat16*, int, int)"), CollectiveType.ALLREDUCE),
    (("void vllm::cross_device_reduce_2stage<float, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, float*, "
      "int, int)"), CollectiveType.ALLREDUCE),
    (("void tensorrt_llm::kernels::twoShotAllReduceKernel<half, 8, false, false>(tensorrt_llm::kernels::"
      "AllReduceParams)"), CollectiveType.ALLREDUCE),
])
def test_other_communication_kernels_are_recognised(name, collective):
    assert is_comm_kernel(name) and not is_nccl_kernel(name)
    assert collective_from_kernel_name(name) is collective


@pytest.mark.parametrize("name", [
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, "
     "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, "
     "float, 4>)"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"),
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(cutlass_80_tensorop_s1688gemm::Params)",
    "Memcpy DtoD (Device -> Device)",
])
def test_compute_kernels_stay_compute(name):
    assert not is_comm_kernel(name)


def _symmetric_memory_trace(path: Path, steps: int = 3) -> Path:
    """A B200-style step (shapes from PyTorch's symmetric-memory ops: multimem all-reduce,
    8 blocks x 1024 threads, on the compute stream): GEMM, multimem all-reduce, GEMM, with
    an NCCL all-reduce on its own stream beside the second GEMM."""
    b = TraceBuilder(rank=0, world_size=8, device="NVIDIA B200", sm_count=148, nccl_version="2.26.2")
    for n in range(steps):
        t = n * 1000.0
        b.step(n, t, 900.0)
        b.kernel("sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64", 7, t + 10, 100)
        b.cpu("record_param_comms", t + 95, 10, **{"Collective name": "symm_mem::multimem_all_reduce",
              "dtype": "BFloat16", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20, "Group size": 8,
              "Process Group Name": "0"})
        b.kernel(MULTIMEM, 7, t + 110, 30, launch_ts=t + 96, grid=(8, 1, 1), block=(1024, 1, 1))
        b.kernel("sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64", 7, t + 140, 100)
        b.kernel(NCCL_AR, 20, t + 160, 50, grid=(16, 1, 1), block=(512, 1, 1),
                 **{"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1 << 22,
                    "Out msg nelems": 1 << 22, "Group size": 8, "Process Group Name": "0"})
    return b.write(path)


def test_symmetric_memory_kernels_are_communication_not_compute(tmp_path, capsys):
    trace = _symmetric_memory_trace(tmp_path / "b200.json")
    (w,) = read_trace(trace)
    multimem = [c for c in w.collectives if not c.nccl_tunable]
    assert len(multimem) == 3 and not any(o.name == MULTIMEM for o in w.compute_ops)
    assert {(c.collective, c.message_bytes, c.group) for c in multimem} == {(CollectiveType.ALLREDUCE, 2 << 20, "0")}
    assert w.stream_kind(7) is StreamKind.COMPUTE and w.stream_kind(20) is StreamKind.COMMUNICATION
    code, out, err = run_cli(capsys, "analyze", str(trace), "--json", "--include-last-step")
    assert code == 0, err
    (report,) = json.loads(out)["ranks"]
    rows = {r["nccl_tunable"]: r for r in report["collectives"]}
    assert (rows[False]["count"], rows[False]["total_us"], rows[False]["exposed_us"]) == (3, 90.0, 90.0)
    assert (rows[True]["count"], rows[True]["total_us"], rows[True]["exposed_us"]) == (3, 150.0, 0.0)
    # per step: communication 30 + 50 us, of which the NCCL kernel's 50 overlap the second GEMM
    assert report["comm_comp_overlap_pct"] == pytest.approx(100.0 * 50 / 80)
    span = 2 * 1000.0 + 240 - 10
    assert report["compute_pct"] == pytest.approx(100.0 * 3 * 200 / span, abs=0.01)
    code, out, _ = run_cli(capsys, "analyze", str(trace), "--include-last-step")
    assert "allreduce (not NCCL)" in out


def test_tuning_leaves_other_communication_kernels_to_themselves(tmp_path, capsys):
    trace = _symmetric_memory_trace(tmp_path / "b200.json")
    code, _, err = run_cli(capsys, "tune", str(trace), "--evaluator", "sim", "--budget", "6", "--no-autoccl",
                           "-o", str(tmp_path / "x.yaml"))
    assert code == 0 and "note: cluster b200-nvswitch: the preset for the trace's GPU (NVIDIA B200)" in err, err
    out_file = tmp_path / "lagom.yaml"
    code, out, err = run_cli(capsys, "tune", str(trace), "--cluster", "h100-nvswitch", "--evaluator", "sim",
                             "--budget", "6", "--no-autoccl", "-o", str(out_file), "--json")
    assert code == 0, err
    assert err.count("not NCCL's") == 1
    assert "3 communication kernels are not NCCL's (multimem_all_reduce_kernel x3): NCCL's knobs do not reach" in err
    assert [r["signature"] for r in json.loads(out)["rows"]] == [f"allreduce[0] {8 << 20}B x8r/1n"]
    assert {(e.match.min_bytes, e.match.max_bytes) for e in load_tuned_config(out_file).collectives} <= {(8 << 20,) * 2}


# ---- one rank ------------------------------------------------------------------------------

def test_one_rank_job_has_nothing_to_tune(tmp_path, capsys):
    b = TraceBuilder(rank=0, world_size=1)
    b.kernel("gemm", 7, 100, 50)
    b.kernel(NCCL_AR, 20, 120, 20, **{"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1024,
                                      "Out msg nelems": 1024, "Process Group Name": "0"})
    trace = b.write(tmp_path / "one.json")
    code, _, err = run_cli(capsys, "tune", str(trace), "--cluster", "a100-nvswitch", "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and err.count("\n") == 1
    assert "one rank: nothing to tune" in err and "distributedInfo" not in err
    code, _, err = run_cli(capsys, "simulate", str(trace), "--cluster", "a100-nvswitch", "--json")
    assert code == 0 and "the job has one rank" in err and "distributedInfo" not in err


@needs_w16
def test_workload_files_keep_unknown_sizes_and_other_kernels(tmp_path):
    (w16,) = read_trace(W16)
    (b200,) = read_trace(_symmetric_memory_trace(tmp_path / "b200.json"))
    for w in (w16, b200):
        save_workload(w, tmp_path / "w.json")
        again = load_workload(tmp_path / "w.json")
        assert again.to_dict() == w.to_dict()
        assert [(c.message_bytes, c.nccl_tunable) for c in again.collectives] == \
            [(c.message_bytes, c.nccl_tunable) for c in w.collectives]
    assert sum(c.message_bytes is None for c in load_workload(tmp_path / "w.json").collectives) == 0
    assert load_workload(tmp_path / "w.json").nccl_version == "2.26.2"


@pytest.mark.parametrize("evaluator", ["sim", "analytic"])
def test_the_replay_keeps_other_kernels_at_their_measured_time(tmp_path, evaluator):
    """Under a plan that changes every NCCL collective, the multimem all-reduces keep their
    measured 30 us, and still count as communication."""
    (w,) = read_trace(_symmetric_memory_trace(tmp_path / "b200.json"))
    cluster = load_cluster("h100-nvswitch")
    ev = tuning.make_evaluator(evaluator, cluster, workload=w)
    as_traced = ev.evaluate(w, Plan())
    lean = ev.evaluate(w, Plan(default=CommConfig(channels=2)))
    multimem = [c for c in w.collectives if not c.nccl_tunable]
    nccl = [c for c in w.collectives if c.nccl_tunable]
    for timing in (as_traced, lean):
        assert [timing.ops[c.op_id].duration_us for c in multimem] == pytest.approx([30.0] * 3)
    assert all(lean.ops[c.op_id].duration_us != pytest.approx(c.duration_us) for c in nccl)
    assert as_traced.comm_us == pytest.approx(30.0 + 50.0)  # per profiler step: both kinds are communication
