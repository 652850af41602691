"""Any GPU: a trace's deviceProperties matched to Lagom's GPU table, and the cluster derived
from the table and the trace's own collectives where no preset models that GPU."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import all_test_traces, run_cli
from kineto_builder import TraceBuilder

from costmodel.cluster import load_cluster
from costmodel.gpu_specs import AMD, NVIDIA, REACH_NONE, ROWS, DeviceFacts, gpu_spec, match_gpu, row_by_key
from costmodel.trace_cluster import PCIE_ACHIEVED_GB_PER_S, bus_bandwidths, derive_cluster
from lagom.files.tuned_config import load_tuned_config
from lagom.orchestration.trace_context import resolve_cluster
from nccl_env.knobs import CollectiveType
from traces.kineto import read_trace

GIB = 1 << 30
MIB = 1 << 20

# (device name as CUDA / HIP report it, numSms, totalGlobalMem, compute capability) -> the row it is
DEVICES = [
    ("NVIDIA A100-PG509-200", 108, 42297524224, (8, 0), "A100-SXM4-40GB"),  # the shared A100 traces' board
    ("NVIDIA A100-SXM4-40GB", 108, 42505273344, (8, 0), "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", 108, 84990623744, (8, 0), "A100-SXM4-80GB"),
    ("NVIDIA A100-PCIE-40GB", 108, 42505273344, (8, 0), "A100-PCIE-40GB"),
    ("NVIDIA A100 80GB PCIe", 108, 85198045184, (8, 0), "A100-PCIE-80GB"),
    ("Tesla V100-SXM2-16GB", 80, 16945512448, (7, 0), "V100-SXM2-16GB"),
    ("Tesla V100-SXM2-32GB", 80, 34089730048, (7, 0), "V100-SXM2-32GB"),
    ("Tesla V100-PCIE-32GB", 80, 34089730048, (7, 0), "V100-PCIE-32GB"),
    ("NVIDIA H100 80GB HBM3", 132, 85031714816, (9, 0), "H100-SXM5-80GB"),
    ("NVIDIA H100 PCIe", 114, 85520809984, (9, 0), "H100-PCIE-80GB"),
    ("NVIDIA H200", 132, 150754820096, (9, 0), "H200-SXM-141GB"),
    ("NVIDIA B200", 148, 191514247168, (10, 0), "B200-SXM-180GB"),
    ("NVIDIA GB200", 152, 199421984768, (10, 0), "GB200"),
    ("NVIDIA L40S", 142, 47697362944, (8, 9), "L40S"),
    ("NVIDIA A40", 84, 47697362944, (8, 6), "A40"),
    ("NVIDIA A10G", 80, 23836033024, (8, 6), "A10G"),
    ("AMD Instinct MI300X", 304, 205822885888, (9, 4), "MI300X"),
    ("AMD Instinct MI250X", 110, 68702699520, (9, 0), "MI250X-GCD"),
    ("AMD Instinct MI250X / MI250", 104, 68702699520, (9, 0), "MI250-GCD"),  # rocm-smi's name; 104 CUs: an MI250
    ("AMD Radeon Graphics", 104, 68702699520, (9, 0), "MI250-GCD"),  # the shared MI250 trace: by CUs alone
    ("NVIDIA GH200 480GB", 132, 102005473280, (9, 0), "H100-SXM5-80GB"),  # a Hopper die the table has no row for
    ("A100-SXM4-80GB", None, None, None, "A100-SXM4-80GB"),  # the a100-nvswitch preset's name: memory from the name
]


@pytest.mark.parametrize("name, sms, mem, cc, key", DEVICES)
def test_device_names_match_their_rows(name, sms, mem, cc, key):
    match = match_gpu(DeviceFacts(name, sms, mem, cc))
    assert match is not None and match.row.key == key


@pytest.mark.parametrize("name, sms, mem, cc", [
    ("NVIDIA A10", 72, 23836033024, (8, 6)),  # not in the table; no row has 72 SMs
    ("Tesla T4", 40, 15835660288, (7, 5)),
    (None, 132, None, None),  # 132 SMs: an H100 SXM or an H200, and nothing says which
    (None, None, None, None),
])
def test_a_device_the_table_cannot_tell_matches_nothing(name, sms, mem, cc):
    assert match_gpu(DeviceFacts(name, sms, mem, cc)) is None


def test_without_a_memory_size_every_variant_fits():
    match = match_gpu(DeviceFacts(None, 108))  # launch shapes only: some A100
    assert match is not None
    assert {r.key for r in match.fits} == {"A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100-PCIE-80GB"}


def test_the_presets_gpus_are_the_tables():
    """Two sources of the same public numbers agree: each preset's GPU section and its table row."""
    for name in ("a100-nvswitch", "h100-nvswitch", "high-bw", "low-bw"):
        gpu = load_cluster(name).gpu
        match = match_gpu(DeviceFacts(gpu.name, gpu.sm_count))
        assert match is not None
        assert gpu_spec(match.row) == replace(gpu, name=match.row.key), name


def test_the_table_holds_reference_md_section_2():
    # docs/reference.md §2: SMs, memory GB/s, L2 MB, dense BF16 TFLOP/s, threads / blocks per SM
    reference = {"A40": (84, 696, 6, 150, 1536, 16), "A100-SXM4-80GB": (108, 2039, 40, 312, 2048, 32),
                 "H100-SXM5-80GB": (132, 3350, 50, 989, 2048, 32), "H200-SXM-141GB": (132, 4800, 50, 989, 2048, 32)}
    for key, (sms, bw, l2, bf16, threads, blocks) in reference.items():
        row = row_by_key(key)
        assert row is not None
        assert (row.sm_count, row.mem_bw_gb_per_s, row.l2_mib, row.max_threads_per_sm, row.max_blocks_per_sm) \
            == (sms, bw, l2, threads, blocks)
        assert row.bf16_dense_tflops == pytest.approx(bf16, rel=0.01)


def test_every_row_is_consistent():
    for row in ROWS:
        assert row.vendor in (NVIDIA, AMD) and row.form in ("sxm", "pcie", "oam")
        assert row.bf16_dense_tflops > row.fp32_tflops > 0 and row.mem_bw_gb_per_s > 0 and row.l2_mib > 0
        assert row.pcie_gen in PCIE_ACHIEVED_GB_PER_S
        assert (row.link_reach == REACH_NONE) == (row.link_gb_per_s == 0), row.key
        if row.vendor == NVIDIA:
            assert (row.nvlink_gen is None) == (row.link_gb_per_s == 0), row.key
    assert len({r.key for r in ROWS}) == len(ROWS)


# ---- traces -----------------------------------------------------------------------------------
def _nccl(b: TraceBuilder, name: str, ts: float, dur: float, nelems_in: int, nelems_out: int, world: int) -> None:
    args: dict = {"Collective name": name.lower(), "dtype": "Float", "In msg nelems": nelems_in,
                  "Out msg nelems": nelems_out, "Process Group Name": "0", "Group size": world}
    b.kernel(f"ncclDevKernel_{name}_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, ts, dur, **args)


def _trace(path: Path, device: str, sms: int | None, mem: int | None, cc: tuple[int, int], world: int = 16,
           devices: int = 8, ar_us: float = 3000.0) -> Path:
    """Three profiler steps: a GEMM, a 64 MiB AllReduce over the world, a GEMM."""
    b = TraceBuilder(rank=0, world_size=world, device=device, sm_count=sms, devices=devices, nccl_version="2.21.5",
                     device_props={"totalGlobalMem": mem, "computeMajor": cc[0], "computeMinor": cc[1]})
    step_us = ar_us + 2000
    for step in range(3):
        t = step * step_us
        b.step(step, t, step_us)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 7, t + 10, 2000)
        _nccl(b, "AllReduce", t + 100, ar_us + 100 * step, 16 * MIB, 16 * MIB, world)
        b.kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 7, t + 2100, 2000)
    return b.write(path)


def test_bus_bandwidth_follows_nccl_tests_at_the_fast_instance(tmp_path):
    world = 16
    b = TraceBuilder(rank=0, world_size=world, device="NVIDIA H200", sm_count=132, devices=8)
    t = 0.0
    for i in range(11):  # AllReduce of 64 MiB: 1000, 1100, ... 2000 us; the 10th percentile of 11 is the 2nd
        _nccl(b, "AllReduce", t, 2000 - 100 * i, 16 * MIB, 16 * MIB, world)
        t += 3000
    _nccl(b, "AllGather", t, 500, MIB, 16 * MIB, world)  # 4 MiB in, 64 MiB out
    _nccl(b, "Broadcast", t + 1000, 300, MIB, MIB, world)
    _nccl(b, "Broadcast", t + 2000, 100, MIB, MIB, world)  # of two, the faster
    _nccl(b, "SendRecv", t + 3000, 10, MIB, MIB, world)  # the peer's node is unknown: left out
    (w,) = read_trace(b.write(tmp_path / "t.json"))
    got = {(x.collective, x.message_bytes): x for x in bus_bandwidths(w, 8)}
    assert set(got) == {(CollectiveType.ALLREDUCE, 64 * MIB), (CollectiveType.ALLGATHER, 64 * MIB),
                        (CollectiveType.BROADCAST, 4 * MIB)}
    ar, ag, bc = (got[(CollectiveType.ALLREDUCE, 64 * MIB)], got[(CollectiveType.ALLGATHER, 64 * MIB)],
                  got[(CollectiveType.BROADCAST, 4 * MIB)])
    assert (ar.time_us, ar.instances, ar.ranks, ar.nodes) == (1100, 11, 16, 2)
    assert ar.busbw_gb_per_s == pytest.approx(64 * MIB / 1100e-6 / 1e9 * 2 * 15 / 16)
    assert ag.busbw_gb_per_s == pytest.approx(64 * MIB / 500e-6 / 1e9 * 15 / 16)
    assert (bc.time_us, bc.busbw_gb_per_s) == (100, pytest.approx(4 * MIB / 100e-6 / 1e9))


def test_an_h200_trace_gets_the_tables_gpu_and_its_own_network(tmp_path):
    (w,) = read_trace(_trace(tmp_path / "h200.json", "NVIDIA H200", 132, 150754820096, (9, 0)))
    match = match_gpu(DeviceFacts("NVIDIA H200", 132, 150754820096, (9, 0)))
    assert match is not None
    c = derive_cluster(w, match).cluster
    assert (c.nodes, c.gpus_per_node) == (2, 8)  # 16 ranks, 8 devices listed
    assert (c.gpu.sm_count, c.gpu.mem_bw_gb_per_s, c.gpu.l2_bytes, c.gpu.peak_tflops) == (132, 4800, 50 * MIB, 989)
    assert (c.intra_node.kind, c.intra_node.bw_gb_per_s) == ("nvswitch", pytest.approx(900 / 2 * 0.8))
    # the AllReduce crosses the 2 nodes; its fast instance (3000 us of 3000, 3100, 3200) gives the network
    assert c.inter_node.nics_per_node * c.inter_node.nic_bw_gb_per_s == pytest.approx(
        64 * MIB / 3000e-6 / 1e9 * 2 * 15 / 16, rel=1e-3)


def test_an_h200_trace_gets_its_preset(tmp_path):
    (w,) = read_trace(_trace(tmp_path / "h200.json", "NVIDIA H200", 132, 150754820096, (9, 0), world=8, devices=8))
    choice = resolve_cluster(w, True, None)
    assert not choice.derived and choice.cluster_arg == "h200-nvswitch"
    c = choice.cluster
    assert (c.gpu.name, c.gpu.sm_count, c.gpu.mem_bw_gb_per_s, c.nodes) == ("H200-SXM-141GB", 132, 4800, 1)
    assert c.intra_node.nvls and c.gpu == gpu_spec(row_by_key("H200-SXM-141GB"))  # the preset is the table's GPU


@pytest.mark.parametrize("device, sms, mem, cc, key, intra", [
    ("Tesla V100-SXM2-32GB", 80, 34089730048, (7, 0), "V100-SXM2-32GB", ("nvlink", 120.0)),  # NVLink2 150 x 0.8
    # (a B200 trace now gets the b200-nvswitch preset: test_simulate_and_tune_a_b200_trace_end_to_end)
    # (an H200 trace now gets the h200-nvswitch preset: test_an_h200_trace_gets_its_preset)
    ("AMD Instinct MI300X", 304, 205822885888, (9, 4), "MI300X", ("nvlink", 358.4)),  # Infinity Fabric 448 x 0.8
    ("NVIDIA A100 80GB PCIe", 108, 85198045184, (8, 0), "A100-PCIE-80GB", ("pcie", 25.0)),  # bridges: pairs only
    ("NVIDIA L40S", 142, 47697362944, (8, 9), "L40S", ("pcie", 25.0)),
])
def test_derived_clusters_take_the_tables_numbers(tmp_path, device, sms, mem, cc, key, intra):
    # 64 MiB in 20 ms inside a node: a busbw of 5.9 GB/s, below every table link: the table's figure holds
    (w,) = read_trace(_trace(tmp_path / "t.json", device, sms, mem, cc, world=8, devices=1, ar_us=20000))
    choice = resolve_cluster(w, True, None)
    row = row_by_key(key)
    assert choice.derived and row is not None
    c = choice.cluster
    assert c.gpu == gpu_spec(row)
    assert (c.intra_node.kind, c.intra_node.bw_gb_per_s) == (intra[0], pytest.approx(intra[1]))
    assert (c.nodes, c.gpus_per_node) == (1, 8)  # one device listed: 8 per node assumed
    assert c.inter_node.nic_bw_gb_per_s == 48.0  # one node: the network is assumed, and the note says so
    assert "8 per node assumed" in choice.notes[0] and "48 GB/s per node assumed (not measured: one node)" \
        in choice.notes[0]
    assert load_cluster(choice.cluster_arg).to_dict() == c.to_dict()  # the file a tuned config names


def test_a_faster_collective_inside_a_node_raises_the_tables_link(tmp_path):
    (w,) = read_trace(_trace(tmp_path / "l40s.json", "NVIDIA L40S", 142, 47697362944, (8, 9), world=8, devices=8,
                             ar_us=2000))
    choice = resolve_cluster(w, True, None)
    busbw = 64 * MIB / 2000e-6 / 1e9 * 2 * 7 / 8  # 58.7 GB/s: more than PCIe 4.0's 25 (it runs on something faster)
    assert choice.cluster.intra_node.bw_gb_per_s == pytest.approx(busbw, abs=0.05)
    assert f"raised to {round(busbw, 1):g} GB/s: the bus bandwidth of the trace's AllReduce of 64 MiB" \
        in choice.notes[0]


def test_the_traces_sm_count_wins_over_the_tables(tmp_path):
    (w,) = read_trace(_trace(tmp_path / "gb200.json", "NVIDIA GB200", 152, 199421984768, (10, 0)))
    choice = resolve_cluster(w, True, None)
    assert choice.cluster.gpu.sm_count == 152
    # the gb200-nvl72 preset models a GB200 (issue 23); the trace's SM count wins over the preset's
    assert choice.cluster_arg == "gb200-nvl72"
    assert "152 SMs: the trace's (the preset says 148)" in choice.notes[0]
    (w,) = read_trace(_trace(tmp_path / "a100.json", "NVIDIA A100-SXM4-80GB", 98, 84990623744, (8, 0)))
    choice = resolve_cluster(w, True, None)  # the preset, with the trace's SMs (a GPU with 10 SMs held back)
    assert (choice.cluster_arg, choice.cluster.gpu.sm_count) == ("a100-nvswitch", 98)
    assert "98 SMs: the trace's (the preset says 108)" in choice.notes[0]


def test_simulate_and_tune_a_b200_trace_end_to_end(tmp_path, capsys):
    # a small synthetic trace whose deviceProperties name a B200: the b200-nvswitch preset models it
    trace = _trace(tmp_path / "b200.json", "NVIDIA B200", 148, 191514247168, (10, 0))
    code, out, err = run_cli(capsys, "simulate", str(trace))
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: cluster b200-nvswitch")]
    assert len(notes) == 1 and "the preset for the trace's GPU (NVIDIA B200)" in notes[0], err
    assert "cluster derived from the trace" not in err
    assert "the model reproduces 2 steps of this trace within 0.0%" in out
    code, out, err = run_cli(capsys, "tune", str(trace), "-o", str(tmp_path / "b200.yaml"))
    assert code == 0, err
    assert "note: cluster b200-nvswitch" in err and "the model reproduces 2 steps" in out
    config = load_tuned_config(tmp_path / "b200.yaml")
    assert config.cluster == "b200-nvswitch" and str(config.nccl_version) == "2.21.5"
    assert load_cluster(config.cluster).gpu.name == "B200-SXM-180GB"
    code, out, err = run_cli(capsys, "simulate", str(trace), "--cluster", config.cluster, "--json", "--noise", "0")
    assert code == 0 and json.loads(out)["cluster"] == "b200-nvswitch" and "warning" not in err


def test_an_mi300x_trace_is_simulated_but_not_tuned(tmp_path, capsys):
    trace = _trace(tmp_path / "mi300x.json", "AMD Instinct MI300X", 304, 205822885888, (9, 4))
    code, out, err = run_cli(capsys, "simulate", str(trace), "--json")
    assert code == 0, err
    assert json.loads(out)["cluster"] == "derived-MI300X" and "304 CUs" in err
    code, _, err = run_cli(capsys, "tune", str(trace), "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and err.count("\n") == 1 and "an AMD GPU, whose collectives are RCCL's" in err
    unnamed = _trace(tmp_path / "unnamed.json", "", 304, 205822885888, (9, 4))  # an MI300X by its CUs alone
    code, _, err = run_cli(capsys, "tune", str(unnamed), "-o", str(tmp_path / "x.yaml"))
    assert code == 2 and err.count("\n") == 1 and "ran on an MI300X, an AMD GPU" in err


# what `lagom tune` must refuse, in one line, per trace of the suite (the others it tunes)
REFUSED = {
    "cpu_only_rank34.json.gz": "CPU-side calls without their GPU kernels",
    "no_distributed_info.json.gz": "CPU-side calls without their GPU kernels",  # CPU comm calls only
    "mi250_rocm_minitoy.json.gz": "an AMD GPU, whose collectives are RCCL's",
    "a100_alexnet_cuda_sync.json.gz": "nothing to tune (it has no collectives)",
    "a100_cuda_sync_multi_stream.json.gz": "nothing to tune (it has no collectives)",
}


@pytest.mark.slow
def test_every_test_trace_replays_and_tunes_without_a_cluster(tmp_path, capsys):
    for trace in all_test_traces():
        code, out, err = run_cli(capsys, "simulate", str(trace), "--noise", "0")
        if trace.name == "cpu_only_rank34.json.gz":  # CPU events only: nothing tells the GPU
            assert code == 2 and err.count("\n") == 1 and "give --cluster" in err
        else:
            assert code == 0, (trace.name, err)
            assert err.startswith("note: cluster "), trace.name
        code, out, err = run_cli(capsys, "tune", str(trace), "--evaluator", "sim", "--budget", "3", "--no-autoccl",
                                 "-o", str(tmp_path / "x.yaml"))
        if trace.name in REFUSED:
            assert code == 2 and REFUSED[trace.name] in err.splitlines()[-1], (trace.name, err)
        else:
            assert code == 0, (trace.name, err)
