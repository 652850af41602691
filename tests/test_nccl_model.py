"""NCCL's tuning model per release (costmodel/nccl_tuning_tables.py, costmodel/nccl_defaults.py) against
NCCL's own printed tables and picks, and the fidelity runner's three NCCL kinds on the committed cases
(tests/data/fidelity/nccl_model.json, a copy of ../shared/fidelity/nccl_model.json)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import EXAMPLES, REPO_ROOT, run_cli

from costmodel.cluster import ClusterSpec, load_cluster
from costmodel.nccl_defaults import (
    algo_estimates,
    disagreement_line,
    nccl_default_config,
    nccl_own_path,
    recorded_pick_disagreements,
    tuning_cells,
)
from costmodel.nccl_tuning_tables import FAMILIES, TABLE_2_18, TABLE_2_30, tuning_table
from costmodel.sim.published_cases import load_cases, parse_cases, run_cases
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.plan import Signature
from nccl_env.rules import NcclVersion
from traces.reader import algorithm_protocol_from_kernel_name, read_trace

NCCL_MODEL = REPO_ROOT / "tests" / "data" / "fidelity" / "nccl_model.json"
_ALGOS = {"Tree": Algorithm.TREE, "Ring": Algorithm.RING, "CollNetDirect": Algorithm.COLLNET_DIRECT,
          "CollNetChain": Algorithm.COLLNET_CHAIN, "NVLS": Algorithm.NVLS, "NVLSTree": Algorithm.NVLS_TREE,
          "PAT": Algorithm.PAT}
MiB = 1 << 20


def h100(version: str, nvls: bool = True) -> ClusterSpec:
    base = load_cluster("h100-nvswitch")
    return replace(base, nccl_version=NcclVersion.parse(version), intra_node=replace(base.intra_node, nvls=nvls))


def allreduce(size: int, ranks: int, nodes: int = 1) -> Signature:
    return Signature("g", CollectiveType.ALLREDUCE, size, ranks, nodes)


def pick(config: CommConfig, fields: int = 3) -> tuple:
    """(algorithm, protocol, channels[, threads, chunk]) of a config."""
    return (config.algorithm, config.protocol, config.channels, config.threads, config.chunk_bytes)[:fields]


def _case(case_id: str) -> dict:
    cases = json.loads(NCCL_MODEL.read_text())["cases"]
    return next(c for c in cases if c["id"] == case_id)


@pytest.mark.parametrize("gpus", [2, 4])
def test_h100_table_matches_nccl_2_29_2_printed_table(gpus):
    """Every cell NCCL 2.29.2 printed for 2 and 4 H100 of an NVSwitch node (NVLS available), latency and
    bandwidth within 5% (NCCL prints one decimal), disabled cells (0.0) disabled."""
    case = _case(f"h100x{gpus}_nvswitch_nccl2.29.2_tuning_table")
    cells = {(c.collective, c.algorithm, c.protocol): c for c in tuning_cells(h100("2.29.2"), gpus, 1)}
    for row in case["rows"]:
        key = (CollectiveType.parse(row["collective"]), _ALGOS[row["algorithm"]], Protocol[row["protocol"].upper()])
        cell = cells[key]
        assert cell.latency_us == pytest.approx(row["latency_us"], rel=0.05, abs=0.05), row
        assert cell.bw_gb_per_s == pytest.approx(row["algbw_GBps"], rel=0.05, abs=0.05), row
    # the cells that decide the flip with the GPU count: NVLS 102 / 160 against the ring's 360 / 240
    nvls = cells[(CollectiveType.ALLREDUCE, Algorithm.NVLS, Protocol.SIMPLE)].bw_gb_per_s
    ring = cells[(CollectiveType.ALLREDUCE, Algorithm.RING, Protocol.SIMPLE)].bw_gb_per_s
    assert (round(nvls), round(ring)) == {2: (102, 360), 4: (160, 240)}[gpus]


def test_nvls_from_2_mib_on_8_h100_and_ring_on_2_and_4():
    """NCCL 2.30.7 on one 8 x H100 node (the blog's selection lines): ring/LL up to 1 MiB, NVLS/Simple on
    16 channels from 2 MiB; on 2 and 4 GPUs of the node the ring (NCCL 2.29.2's logs: 24 channels)."""
    cluster = h100("2.30.7")
    assert pick(nccl_default_config(cluster, allreduce(4096, 8))) == (Algorithm.RING, Protocol.LL, 1)
    assert pick(nccl_default_config(cluster, allreduce(MiB, 8))) == (Algorithm.RING, Protocol.LL, 24)
    for size in (2 * MiB, 64 * MiB, 1 << 30):
        assert pick(nccl_default_config(cluster, allreduce(size, 8))) == (Algorithm.NVLS, Protocol.SIMPLE, 16)
    for gpus in (2, 4):
        assert pick(nccl_default_config(h100("2.29.2"), allreduce(1 << 30, gpus))) == \
            (Algorithm.RING, Protocol.SIMPLE, 24)
    # without NVLink SHARP the same node stays on the ring
    assert nccl_default_config(h100("2.30.7", nvls=False), allreduce(1 << 30, 8)).algorithm is Algorithm.RING


def test_pat_for_one_gpu_per_node_from_2_23():
    """PAT (2.23, NVIDIA/nccl #1473) serves AllGather/ReduceScatter with one GPU per node only."""
    def pat_cells(version: str, ranks: int, nodes: int) -> list:
        return [c for c in tuning_cells(h100(version), ranks, nodes)
                if c.algorithm is Algorithm.PAT and c.bw_gb_per_s > 0]

    assert pat_cells("2.22.3", 4, 4) == []
    enabled = pat_cells("2.23.4", 4, 4)
    assert {c.collective for c in enabled} == {CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER}
    assert pat_cells("2.29.2", 8, 4) == []  # two GPUs per node: no PAT
    # NCCL 2.29.7's printed PAT cells for 2 nodes x 1 GPU: latency 17.6 us = 8 + log2(2) x 14/3.5 + 2 x 2.8
    latency = [c.latency_us for c in pat_cells("2.29.7", 2, 2)]
    assert latency == pytest.approx([17.6, 17.6])
    picks = {nccl_default_config(h100("2.24.3"), Signature("g", CollectiveType.ALLGATHER, size, 16, 16)).algorithm
             for size in (64 << 10, MiB, 16 * MiB, 256 * MiB)}
    assert Algorithm.PAT in picks


def test_2_18_table_unchanged():
    """NCCL 2.18.3's figures as the 2.18-only model gave them (the presets' release)."""
    cluster = load_cluster("h100-nvswitch")
    cluster.nccl_version = NcclVersion(2, 18, 3)  # the presets' release before they named a current one
    cluster.intra_node = replace(cluster.intra_node, nvls=False)  # and before they said the fabric has NVLS
    assert tuning_table(cluster.nccl_version) is TABLE_2_18
    got = {(e.algorithm, e.protocol): (round(e.latency_us, 4), round(e.bw_gb_per_s, 4))
           for e in algo_estimates(cluster, allreduce(16 * MiB, 16, 2))}
    tree, ring = Algorithm.TREE, Algorithm.RING
    ll, ll128, simple = Protocol.LL, Protocol.LL128, Protocol.SIMPLE
    assert got == {(tree, ll): (25.2, 17.55), (tree, ll128): (48.5, 149.04), (tree, simple): (84.0, 123.648),
                   (ring, ll): (43.4, 20.8), (ring, ll128): (79.4, 188.416), (ring, simple): (213.92, 204.8)}
    assert pick(nccl_default_config(cluster, allreduce(256 << 10, 24, 3)), 5) == (tree, ll128, 32, 640, 19200)
    gather = Signature("g", CollectiveType.ALLGATHER, 64 * MiB, 8, 1)
    assert pick(nccl_default_config(cluster, gather), 5) == (Algorithm.RING, Protocol.SIMPLE, 32, 512, 2 << 20)


def test_release_families_and_newer_than_known():
    """Each release reads its family's table; a release newer than the newest known reads the newest."""
    assert [tuning_table(NcclVersion.parse(v)).source for v in ("2.18.5", "2.20.5", "2.22.3", "2.23.4", "2.26.2",
                                                                 "2.27.7", "2.28.9", "2.29.2", "2.29.7")] == \
        ["v2.18.3-1", "v2.19.3-1", "v2.21.5-1", "v2.23.4-1", "v2.25.1-1", "v2.27.3-1", "v2.28.9-1", "v2.29.2-1",
         "v2.29.7-1"]
    assert tuning_table(NcclVersion.parse("2.33.1")) is TABLE_2_30 is FAMILIES[-1]
    assert tuning_cells(h100("2.33.1"), 8, 1) == tuning_cells(h100("2.30.7"), 8, 1)


def test_kernel_names_say_what_nccl_ran():
    assert algorithm_protocol_from_kernel_name("ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(x)") == \
        (Algorithm.RING, Protocol.LL128)
    assert algorithm_protocol_from_kernel_name("ncclDevKernel_AllReduce_Sum_f32_NVLS_TREE_SIMPLE") == \
        (Algorithm.NVLS_TREE, Protocol.SIMPLE)
    assert algorithm_protocol_from_kernel_name("ncclDevKernel_AllGather_PAT_SIMPLE()") == \
        (Algorithm.PAT, Protocol.SIMPLE)
    assert algorithm_protocol_from_kernel_name("ncclAllReduceRingLLKernel_sum_f32(ncclColl)") == \
        (Algorithm.RING, Protocol.LL)
    assert algorithm_protocol_from_kernel_name("ncclDevKernel_Generic(x)") is None
    assert algorithm_protocol_from_kernel_name("ncclSymkDevKernel_AllGather_ST") is None


def test_trace_kernels_against_the_model_pick():
    """The bundled A100 trace (NCCL 2.17.1, 2 ranks) ran its 8-31 MB AllReduces on ring/LL
    (``ncclKernel_AllReduce_RING_LL_Sum_float``): NCCL's model picks ring/Simple there, and says so;
    a cluster whose NCCL defaults are LL agrees with the trace."""
    workload = read_trace(EXAMPLES / "a100_w2_allreduce_broadcast.json.gz")[0]
    cluster = replace(load_cluster("a100-nvswitch"), nccl_version=NcclVersion.parse("2.17.1"))
    found = recorded_pick_disagreements(cluster, workload)
    assert len(found) == 5 and all(d.recorded == (Algorithm.RING, Protocol.LL) for d in found)
    assert all(d.model == (Algorithm.RING, Protocol.SIMPLE) and d.instances == 3 for d in found)
    line = disagreement_line(cluster, found)
    assert line is not None and "ring/ll (3x)" in line and "ring/simple" in line and "4 more" in line
    forced = replace(cluster, nccl_defaults={"protocol": "ll"})
    assert recorded_pick_disagreements(forced, workload) == []


def test_runner_judges_the_three_nccl_kinds():
    """bench/fidelity.py's three kinds on the committed nccl_model.json: the 2.29.2 tables and the ring
    picks hold; every case names its cluster; unknown systems are not judged, with the reason."""
    results = {r.id: r for r in run_cases(load_cases(NCCL_MODEL))}
    assert len(results) == 25
    for case_id in ("h100x2_nvswitch_nccl2.29.2_tuning_table", "h100x4_nvswitch_nccl2.29.2_tuning_table",
                    "h100x2_nvswitch_nccl2.29.2_allreduce_choice", "h100x4_nvswitch_nccl2.29.2_allreduce_choice"):
        assert results[case_id].holds is True, case_id
    assert results["h100x2_nvswitch_nccl2.29.2_tuning_table"].cluster == "h100-nvswitch 1x2, NVLS, NCCL 2.29.2"
    curve = results["h100x8_nccl2.26.2_allreduce_default_k8s_together"]  # NVLS unusable there: the ring
    assert curve.holds is not None and curve.cluster.startswith("h100-nvswitch 1x8")
    assert sum(p["holds"] for p in curve.model) >= 7
    # 3 x 8 H100 at 2.22.3: Tree/LL, then Tree/LL128 at 256 KiB, as NCCL's log (NVLSTree from 512 KiB needs NVLS)
    assert [p["holds"] for p in results["h100_3x8_nccl2.22.3_allreduce_choice_issue1453"].model][:4] == [True] * 4
    rtx = results["rtx5090_2rank_socket_nccl2.29.7_tuning_table"]
    assert rtx.holds is None and "names no GPU" in (rtx.not_judged or "")
    assert results["gb200x4_nccl2.25.1_allreduce_forced_ring_azure"].cluster.startswith("stated-GB200 1x4")
    assert all(r.cluster for r in results.values())


def test_nccl_estimate_ceiling_on_the_curves(capsys):
    """Each busbw curve's points judged again with NCCL's own estimate (tuning.cc latency + bytes /
    bandwidth of its pick) as the model; bench/fidelity.py prints the count beside the simulator's.
    Not one of the nine curves holds on NCCL's own estimate either (the 1-4 MiB per-call cost, the
    NVLS curve 44-51% above the measurement): the ceiling for a re-statement of NCCL's model."""
    import importlib.util

    results = run_cases(load_cases(NCCL_MODEL))
    curves = [r for r in results if r.kind == "busbw_curve" and r.holds is not None]
    assert len(curves) == 9
    for r in curves:
        own = [p["nccl_estimate_holds"] for p in r.model]
        assert r.detail["nccl_estimate_points_held"] == sum(own)
        assert r.detail["nccl_estimate_holds"] is all(own)
    assert not any(r.detail["nccl_estimate_holds"] for r in curves)
    # the simulator holds the 4 x H100 AllReduce curve: its 4 MiB Ring/LL128 point pays LL128's base latency
    four = next(r for r in curves if r.id == "h100x4_nccl2.29.2_allreduce_default_wh")
    assert four.holds is True and four.model[1]["pick"] == "Ring/LL128"
    nvls = next(r for r in curves if r.id == "h100x8_nccl2.26.2_allreduce_default_nvls_together")
    assert nvls.model[-1]["nccl_estimate_busbw_GBps"] > 1.4 * 479.32  # NCCL's NVLS figure against nccl-tests'
    spec = importlib.util.spec_from_file_location("bench_fidelity", REPO_ROOT / "bench" / "fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main([str(NCCL_MODEL)]) == 1
    assert "NCCL's own estimate as the model: 0 of 9 busbw curves hold" in capsys.readouterr().out


def test_other_case_is_built_from_its_statement():
    """An ``other:`` case is judged on a cluster built from what it states (the GPU table's row, its
    nodes and GPUs per node, NVLS), never on a preset whose fabric differs; a statement without its
    network across nodes is not judged, with the reason."""
    curve = {"id": "a100x4-ring", "source": "https://example.org", "note": "made up for the test",
             "kind": "busbw_curve", "cluster": "other:A100-SXM4-80GB", "gpu": "NVIDIA A100-SXM4-80GB",
             "collective": "AllReduce", "nodes": 1, "gpus_per_node": 4, "nccl_version": "2.21.5",
             "forced": None, "points": [{"bytes": 1 << 30, "time_us": None, "busbw_GBps": 200.0}],
             "tolerance": {"relative": 0.5}}
    sockets = {**curve, "id": "a100-sockets", "cluster": "other:A100 (2 nodes, TCP sockets)", "nodes": 2,
               "gpus_per_node": 1}
    cases = {c.id: c for c in parse_cases({"format": "lagom.published-cases", "version": 1,
                                           "cases": [curve, sockets]}, "test")}
    built = cases["a100x4-ring"].cluster
    assert built is not None and built.name == "stated-A100-SXM4-80GB" and built.gpus_per_node == 4
    assert built.intra_node.kind == "nvswitch" and str(built.nccl_version) == "2.21.5"
    assert cases["a100-sockets"].cluster is None
    assert "network" in (cases["a100-sockets"].not_judged or "")
    result = run_cases([cases["a100x4-ring"]])[0]
    assert result.holds is not None and result.cluster == "stated-A100-SXM4-80GB 1x4, NCCL 2.21.5"


def test_path_nccl_takes_by_itself():
    """Buffers in symmetric windows: NCCL 2.29 on Blackwell moves an AllGather above NCCL_SYM_CE_THRESHOLD
    (8 Mi elements per rank) on the copy engines, no SM; below it, and before 2.29, its symmetric
    kernels; on Hopper never the copy engines; outside the windows its SM kernels."""
    b200 = load_cluster("b200-nvswitch")

    def path(version: str, collective: CollectiveType, size: int, cluster: ClusterSpec = b200,
             windows: bool = True) -> CommPath:
        at = replace(cluster, nccl_version=NcclVersion.parse(version))
        return nccl_own_path(at, Signature("g", collective, size, 8, 1), windows)

    big = 256 * MiB  # 32 MiB per rank: 16 Mi bf16 elements
    assert path("2.29.2", CollectiveType.ALLGATHER, big) is CommPath.COPY_ENGINE
    assert path("2.29.2", CollectiveType.ALLGATHER, 64 * MiB) is CommPath.SYMMETRIC  # 4 Mi elements per rank
    assert path("2.28.9", CollectiveType.ALLGATHER, big) is CommPath.SYMMETRIC
    assert path("2.29.2", CollectiveType.REDUCESCATTER, big) is CommPath.SYMMETRIC
    assert path("2.29.2", CollectiveType.ALLGATHER, big, h100("2.29.2")) is CommPath.SYMMETRIC
    assert path("2.26.2", CollectiveType.ALLGATHER, big) is CommPath.SM
    assert path("2.29.2", CollectiveType.ALLGATHER, big, windows=False) is CommPath.SM


def _pick_note(capsys, *command: str) -> str:
    code, _, err = run_cli(capsys, *command)
    notes = [line for line in err.splitlines() if "tuning model disagrees with the trace's kernels" in line]
    assert code == 0 and len(notes) == 1, (command, err)
    return notes[0]


@pytest.mark.slow
def test_simulate_says_where_the_trace_ran_another_pick(capsys):
    """One note line: the bundled trace's kernels ran ring/LL where NCCL's model of the trace's release
    (2.17.1, read with the 2.18 table) picks ring/Simple."""
    note = _pick_note(capsys, "simulate", str(EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"),
                      "--cluster", "a100-nvswitch", "--json")
    assert "NCCL 2.17.1" in note and "ring/ll (3x)" in note


@pytest.mark.slow
def test_tune_says_where_the_trace_ran_another_pick(capsys, tmp_path):
    note = _pick_note(capsys, "tune", str(EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"),
                      "--cluster", "a100-nvswitch", "--json", "--budget", "1", "-o", str(tmp_path / "lagom.yaml"))
    assert "NCCL 2.17.1" in note and "ring/ll (3x)" in note
