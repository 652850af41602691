"""A trace's own metadata decides the cluster and NCCL version of `lagom tune` and
`lagom simulate`."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli, trace_dir
from kineto_builder import TraceBuilder

from lagom.files.tuned_config import load_tuned_config
from lagom.orchestration.trace_context import gpu_model, presets_for_gpu, resolve_cluster
from nccl_env.rules import NcclVersion
from traces.kineto import read_trace

TRACES = trace_dir()
needs_traces = pytest.mark.skipif(not (TRACES / "w128_sendrecv_rank0.json.gz").is_file(),
                                  reason="a trace of tests/data or traces/examples is missing")
W2 = TRACES / "a100_w2_allreduce_broadcast.json.gz"  # NVIDIA A100-PG509-200, NCCL 2.17.1, world 2
MI250 = TRACES / "mi250_rocm_minitoy.json.gz"  # AMD Radeon Graphics (an MI250), ROCm 6.2


@pytest.mark.parametrize("name, model", [
    ("NVIDIA A100-PG509-200", "A100"), ("NVIDIA A100-SXM4-80GB", "A100"), ("A100-SXM4-80GB", "A100"),
    ("NVIDIA H100 80GB HBM3", "H100"), ("H100-SXM5-80GB", "H100"), ("NVIDIA A40", "A40"), ("A40", "A40"),
    ("Tesla V100-SXM2-32GB", "V100"), ("NVIDIA B200", "B200"), ("NVIDIA GH200 480GB", "GH200"),
    ("AMD Instinct MI250X", "MI250X"), ("AMD Radeon Graphics", None), (None, None),
])
def test_gpu_model_of_device_names(name, model):
    assert gpu_model(name) == model


def test_presets_by_gpu_model():
    assert presets_for_gpu("NVIDIA A100-PG509-200") == ["a100-nvswitch"]
    assert presets_for_gpu("NVIDIA H100 80GB HBM3") == ["h100-nvswitch"]
    assert presets_for_gpu("NVIDIA A40") == ["high-bw", "low-bw"]
    assert presets_for_gpu("Tesla V100-SXM2-32GB") == []


@needs_traces
def test_tune_without_cluster_takes_gpu_and_nccl_from_the_trace(tmp_path, capsys):
    out_file = tmp_path / "lagom.yaml"
    code, out, err = run_cli(capsys, "tune", str(W2), "--evaluator", "sim", "--budget", "2", "--no-autoccl",
                             "-o", str(out_file), "--json")
    assert code == 0, err
    assert json.loads(out)["cluster"] == "a100-nvswitch"
    config = load_tuned_config(out_file)
    assert (config.cluster, str(config.nccl_version)) == ("a100-nvswitch", "2.17.1")
    assert ("note: cluster a100-nvswitch: the preset for the trace's GPU (NVIDIA A100-PG509-200); "
            "1 node for the job's 2 ranks; its GPU is the table's A100-SXM4-40GB (matched by name A100, 42.3 GB), "
            "not the preset's A100-SXM4-80GB: memory GB/s 2039 -> 1555") in err
    assert "note: NCCL 2.17.1 from the trace's distributedInfo (a100-nvswitch says 2.30.7)" in err
    assert "warning" not in err


@needs_traces
def test_simulate_without_cluster_uses_the_traces_gpu(capsys):
    code, out, err = run_cli(capsys, "simulate", str(W2), "--json", "--noise", "0")
    assert code == 0, err
    auto = json.loads(out)
    assert auto["cluster"] == "a100-nvswitch" and auto["collectives"] == 21
    code, out, _ = run_cli(capsys, "simulate", str(W2), "--cluster", "a100-nvswitch", "--json", "--noise", "0")
    assert code == 0 and json.loads(out)["iteration_us"] == auto["iteration_us"]


@needs_traces
def test_a_cluster_or_nccl_that_disagrees_with_the_trace_gets_one_warning(tmp_path, capsys):
    code, _, err = run_cli(capsys, "tune", str(W2), "--cluster", "high-bw", "--nccl-version", "2.18.5",
                           "--evaluator", "sim", "--budget", "2", "--no-autoccl", "-o", str(tmp_path / "x.yaml"))
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        ("warning: the trace ran on NVIDIA A100-PG509-200 but --cluster high-bw models A40: predictions are "
         "for that GPU, not the trace's"),
        ("warning: the trace ran NCCL 2.17.1 but --nccl-version is 2.18.5: tuning for 2.18.5, whose knobs and "
         "defaults may differ"),
    ]
    assert str(load_tuned_config(tmp_path / "x.yaml").nccl_version) == "2.18.5"


def _trace(tmp_path, device: str, **distributed):
    b = TraceBuilder(rank=0, world_size=8, device=device, **distributed)
    b.kernel("gemm", 7, 100, 50)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, 110, 30,
             **{"Collective name": "allreduce", "dtype": "Float", "In msg nelems": 1 << 20,
                "Out msg nelems": 1 << 20, "Process Group Name": "0", "Group size": 8})
    return b.write(tmp_path / f"{device.replace(' ', '_')}.json")


def test_a_v100_trace_gets_a_derived_cluster_and_warns_on_an_a100_preset(tmp_path, capsys):
    trace = _trace(tmp_path, "Tesla V100-SXM2-32GB", nccl_version="2.18.3")
    code, _, err = run_cli(capsys, "tune", str(trace), "-o", str(tmp_path / "x.yaml"))
    assert code == 0, err
    assert "note: cluster derived from the trace (no preset models Tesla V100-SXM2-32GB)" in err
    assert load_tuned_config(tmp_path / "x.yaml").cluster.endswith(".yaml")  # the derived cluster's file
    code, _, err = run_cli(capsys, "simulate", str(trace), "--cluster", "a100-nvswitch", "--json")
    assert code == 0
    assert err.count("warning:") == 1
    assert "the trace ran on Tesla V100-SXM2-32GB but --cluster a100-nvswitch models A100-SXM4-80GB" in err


def test_an_a40_trace_is_derived_and_names_both_a40_presets(tmp_path, capsys):
    trace = _trace(tmp_path, "NVIDIA A40")
    code, _, err = run_cli(capsys, "simulate", str(trace))
    assert code == 0, err
    (note,) = [line for line in err.splitlines() if line.startswith("note: cluster")]
    assert "the presets high-bw and low-bw both model NVIDIA A40" in note and "--cluster picks one" in note
    (w,) = read_trace(trace)
    choice = resolve_cluster(w, True, "low-bw")
    assert (choice.cluster.name, str(choice.cluster.nccl_version), choice.warnings) == ("low-bw", "2.18.3", [])


def test_an_nccl_227_trace_is_tuned_as_227_unless_told_otherwise(tmp_path):
    (w,) = read_trace(_trace(tmp_path, "NVIDIA H100 80GB HBM3", nccl_version="2.27.3"))
    choice = resolve_cluster(w, True, None)
    assert (choice.cluster_arg, str(choice.cluster.nccl_version), choice.cluster.nodes) == \
        ("h100-nvswitch", "2.27.3", 1)
    choice = resolve_cluster(w, True, "h100-nvswitch", NcclVersion(2, 18, 3))
    assert str(choice.cluster.nccl_version) == "2.18.3"
    assert choice.warnings == [("the trace ran NCCL 2.27.3 but --nccl-version is 2.18.3: tuning for 2.18.3, "
                                "whose knobs and defaults may differ")]


@pytest.mark.parametrize("command", ["tune", "simulate"])
def test_spec_and_workload_file_still_need_a_cluster(command, capsys, tmp_path):
    code, _, err = run_cli(capsys, command, "tp:phi2:tp=8", "-o", str(tmp_path / "x.yaml")) if command == "tune" \
        else run_cli(capsys, command, "tp:phi2:tp=8")
    assert code == 2 and err.count("\n") == 1
    assert "--cluster is required for a generator spec or a workload file" in err


@needs_traces
def test_a_trace_without_device_properties_is_read_by_its_launch_shapes(capsys):
    code, out, err = run_cli(capsys, "simulate", str(TRACES / "w128_sendrecv_rank0.json.gz"), "--json")
    assert code == 0, err
    assert json.loads(out)["cluster"] == "a100-nvswitch"
    assert ("note: cluster a100-nvswitch: the preset for the trace's GPU (an A100 by its kernels' launch shapes, "
            "108 SMs: the trace records no deviceProperties); 16 nodes for the job's 128 ranks") in err


@needs_traces
def test_a_cpu_only_trace_asks_for_a_cluster(capsys):
    code, _, err = run_cli(capsys, "simulate", str(TRACES / "cpu_only_rank34.json.gz"))
    assert code == 2 and err.count("\n") == 1
    assert "it records no GPU (no deviceProperties, no GPU kernel launch shapes); give --cluster NAME|FILE" in err


@needs_traces
def test_rccl_trace_is_analysed_and_simulated_but_not_tuned(tmp_path, capsys):
    code, out, err = run_cli(capsys, "analyze", str(MI250), "--json")
    assert code == 0, err
    (report,) = json.loads(out)["ranks"]
    assert report["device"] == "AMD Radeon Graphics" and report["compute_pct"] > 0
    code, out, err = run_cli(capsys, "simulate", str(MI250), "--cluster", "a100-nvswitch", "--json")
    assert code == 0 and json.loads(out)["ops"] == 16
    assert "the trace ran on AMD Radeon Graphics but --cluster a100-nvswitch models A100-SXM4-80GB" in err
    code, out, err = run_cli(capsys, "simulate", str(MI250), "--json")  # an MI250 GCD: 104 CUs, 64 GiB
    assert code == 0 and json.loads(out)["cluster"] == "derived-MI250-GCD", err
    for extra in ([], ["--cluster", "a100-nvswitch"]):
        code, _, err = run_cli(capsys, "tune", str(MI250), *extra, "-o", str(tmp_path / "x.yaml"))
        assert code == 2 and err.count("\n") == 1, err
        assert "an AMD GPU, whose collectives are RCCL's: Lagom's knobs and tuner plugin are NCCL's" in err


def test_a_config_files_nccl_version_is_named_as_the_files_when_it_differs_from_the_trace(tmp_path, capsys):
    trace = _trace(tmp_path, "NVIDIA H100 80GB HBM3", nccl_version="2.27.3")
    tuned = tmp_path / "x.yaml"
    code, _, err = run_cli(capsys, "tune", str(trace), "--nccl-version", "2.18.3", "-o", str(tuned))
    assert code == 0, err
    assert "but --nccl-version is 2.18.3: tuning for 2.18.3" in err
    code, _, err = run_cli(capsys, "simulate", str(trace), "--config", str(tuned), "--json")
    assert code == 0, err
    (warning,) = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning == (f"warning: the trace ran NCCL 2.27.3 but {tuned}'s nccl_version is 2.18.3: modelling "
                       "2.18.3, whose knobs and defaults may differ")
