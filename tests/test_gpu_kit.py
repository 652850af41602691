"""The one-GPU kit (bench/gpu_kit.py) through its seams, on a machine without a GPU.

Without CUDA the kit says so in one line and exits 2. On the simulator's GPU (the
``SimDevice`` seam) it measures, fits and writes a cluster file that ``load_cluster`` and
``lagom calibrate`` read back, and the fit gives back the simulator's own constants. Its
reading of NCCL's log runs on lines worded as NVIDIA/nccl writes them (src/plugin/tuner.cc,
src/plugin/tuner/tuner_v5.cc and tuner_v6.cc, src/enqueue.cc, src/debug.cc; 2.28-2.30)
and as the compiled plugin itself logs through NCCL's logger.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_cli

from costmodel.cluster import load_cluster
from costmodel.sim.params import sim_params
from nccl_env.plugin_abi import LOGGER, TunerLibrary
from nccl_env.plugin_build import build_plugin
from nccl_env.plugin_table import format_table

sys.path.insert(0, str(REPO_ROOT / "bench"))
gpu_kit = importlib.import_module("gpu_kit")
kit_nccl = importlib.import_module("gpu_kit_nccl")
kit_device = importlib.import_module("gpu_kit_device")


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: the kit would measure it")
def test_without_cuda_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(REPO_ROOT / "bench" / "gpu_kit.py"), "--out", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "Traceback" not in done.stderr
    assert done.stdout == "" and not (tmp_path / "k").exists()


@pytest.mark.parametrize("preset", ["h100-nvswitch", "a100-nvswitch"])
def test_a_run_on_the_simulated_gpu_gives_back_its_constants(tmp_path, capsys, preset):
    assert gpu_kit.main(["--out", str(tmp_path), "--simulate", preset]) == 0
    base = load_cluster(preset)
    truth = sim_params(base)
    written = load_cluster(tmp_path / "cluster.yaml")
    fitted = sim_params(written)
    # the GEMM's share of the peak, less the last wave's idle SMs (an 8192^3 GEMM runs 15.5 waves in 16 on H100)
    assert fitted.gemm_efficiency == pytest.approx(truth.gemm_efficiency, rel=0.05)
    assert fitted.mem_efficiency == pytest.approx(truth.mem_efficiency, rel=0.01)
    assert written.gpu.sm_count == base.gpu.sm_count and written.gpu.l2_bytes == base.gpu.l2_bytes
    assert written.intra_node == base.intra_node and written.nodes == base.nodes  # the topology stands
    report = json.loads((tmp_path / "kit.json").read_text())
    fit = report["fit"]
    assert fit["stream_per_cta_gb_per_s"] == pytest.approx(truth.simple_bw_per_channel_gb_per_s, rel=1e-6)
    dram_half = base.gpu.mem_bw_gb_per_s * truth.mem_efficiency / 2
    assert fit["copy_gb_per_s"] == pytest.approx(min(base.intra_node.copy_engine_bw, dram_half), rel=1e-6)
    assert fit["clock_host_minus_event_us"] == pytest.approx(truth.launch_us + 1.5, abs=1.0)
    # k from 1 to the ceiling; the SMs the streaming CTAs take slow the GEMM more as k grows
    ks = sorted(int(k) for k in fit["slowdowns"])
    assert ks[0] == 1 and ks[-1] == min(64, base.gpu.sm_count)
    assert fit["slowdowns"][str(ks[-1])][0] > fit["slowdowns"][str(ks[0])][0] >= 1.0
    assert report["model_worst_miss"] < 0.01  # the simulator of the written file agrees with its own GPU
    out = capsys.readouterr().out
    assert "model's worst miss" in out and f"stream k={ks[-1]}" in out


def test_lagom_calibrate_reads_the_written_cluster(tmp_path, capsys):
    assert gpu_kit.main(["--out", str(tmp_path), "--simulate", "h100-nvswitch", "--no-nccl"]) == 0
    capsys.readouterr()
    code, out, err = run_cli(capsys, "calibrate", "--backend", f"sim:{tmp_path / 'cluster.yaml'}",
                             "--measurements", "20", "-o", str(tmp_path / "calibrated.yaml"))
    assert code == 0, err
    calibrated = load_cluster(tmp_path / "calibrated.yaml")
    assert calibrated.model and calibrated.sim == load_cluster(tmp_path / "cluster.yaml").sim


def test_sweep_reaches_the_ceiling():
    assert gpu_kit.sweep_ctas(64) == [1, 2, 4, 8, 16, 32, 64]
    assert gpu_kit.sweep_ctas(24) == [1, 2, 4, 8, 16, 24]
    assert gpu_kit.sweep_ctas(1) == [1]


# ---- NCCL's log ----------------------------------------------------------------------------
PREFIX = "gpu-node-3:48213:48213 [0] NCCL INFO "  # src/debug.cc: "%s:%d:%d [%d] NCCL INFO %s"
PLUGIN = "/root/.cache/lagom/plugin/liblagom_tuner.6f1c0e.so"
REAL_LOG = [
    PREFIX + "NCCL version 2.21.5+cuda12.4",
    PREFIX + f"NCCL_TUNER_PLUGIN set by environment to {PLUGIN}",  # tuner.cc, NCCL_ENV | NCCL_TUNING
    PREFIX + "TUNER/Plugin: Using Lagom (v4)",  # tuner_v4.cc: "TUNER/Plugin: Using %s (v4)", the struct's name
    PREFIX + f"Successfully loaded external tuner plugin {PLUGIN}",  # tuner.cc
    PREFIX + "TUNER/Lagom: /tmp/kit/probe_table.csv: 1 entries, 0 lines rejected",  # the plugin, via NCCL's logger
    "gpu-node-3:48213:48230 [0] NCCL INFO AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}",
    "gpu-node-3:48213:48230 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}",
    "gpu-node-3:48213:48213 [0] init.cc:1234 NCCL WARN Cuda failure 'out of memory'",
    PREFIX + "TUNER/Plugin: Closing tuner: 'Lagom'",  # tuner.cc, at ncclTunerPluginUnload
]


def test_the_log_of_a_loaded_plugin():
    log = kit_nccl.parse_log("\n".join(REAL_LOG))
    assert log.loaded and (log.plugin_name, log.abi_version) == ("Lagom", 4)
    assert log.nccl_version == "2.21.5+cuda12.4" and log.requested == PLUGIN and log.loaded_from == PLUGIN
    assert (log.table_entries, log.table_rejected, log.closed) == (1, 0, "Lagom")
    assert [(c.bytes, c.ctas, c.kernel) for c in log.collectives] == [(1048576, 2, "RING/SIMPLE"), (4096, 1, "RING/LL")]
    assert [c.bytes for c in log.served(kit_nccl.PROBE_ENTRY)] == [1048576]
    assert log.warnings == ["Cuda failure 'out of memory'"]
    assert log.to_dict()["served"] == 1


def test_the_log_of_a_plugin_nccl_refused():
    text = "\n".join([
        PREFIX + f"NCCL_TUNER_PLUGIN set by environment to {PLUGIN}",
        PREFIX + f"External tuner plugin {PLUGIN} is unsupported",  # tuner.cc, no ncclTunerPlugin_v* symbol
    ])
    log = kit_nccl.parse_log(text)
    assert not log.loaded and log.unsupported == PLUGIN and log.plugin_name is None
    assert not kit_nccl.parse_log("").loaded  # no line at all: not loaded (no plugin, or no INFO log)


def test_the_plugin_serves_the_probe_table_and_logs_what_the_parser_reads(tmp_path, monkeypatch):
    """The compiled plugin, given the probe's table as NCCL's env gives it, answers Ring/Simple on 2
    channels for an AllReduce, and the line it logs through NCCL's logger, printed as NCCL prints
    it, is read as the table's entries."""
    table = tmp_path / "probe_table.csv"
    table.write_text(format_table([kit_nccl.PROBE_ENTRY]))
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(table))
    messages: list[str] = []
    logger = LOGGER(lambda level, flags, file, line, fmt, msg: messages.append(msg.decode()))
    library = TunerLibrary(build_plugin())
    assert library.reload() == 1  # back to the env's table (another test may have set one through the API)
    with library.open(5, 1, 1, logger) as comm:  # init reads the env's table and logs it
        result = comm.get_coll_info(4, 1 << 20, [[5.0, 5.0, 5.0], [5.0, 5.0, 5.0]])
    assert result.n_channels == 2 and result.chosen() == (1, 2)  # Ring, Simple
    log = kit_nccl.parse_log("\n".join(PREFIX + m for m in messages))
    assert (log.table, log.table_entries, log.table_rejected) == (str(table), 1, 0)


def test_the_probe_env_names_the_plugin_the_table_and_the_log(tmp_path):
    env = kit_nccl.probe_env(Path("/p/lib.so"), tmp_path / "t.csv", tmp_path)
    assert env["NCCL_TUNER_PLUGIN"] == "/p/lib.so" and env["NCCL_TUNER_CONFIG_FILE"] == str(tmp_path / "t.csv")
    assert env["NCCL_DEBUG"] == "INFO" and set(env["NCCL_DEBUG_SUBSYS"].split(",")) == {"INIT", "ENV", "TUNING"}
    assert env["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log")
    assert env["PYTHONPATH"].split(":")[0] == str(REPO_ROOT)
