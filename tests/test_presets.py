"""Cluster presets and NCCL's modelled default choices (costmodel.nccl_defaults)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from costmodel.cluster import load_cluster, preset_names
from costmodel.nccl_defaults import algo_estimates, comm_channels, nccl_default_config, resolve_config
from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Protocol, Signature

PRESETS = ["a100-nvswitch", "h100-nvswitch", "high-bw", "low-bw"]


def test_four_presets_load_and_every_number_has_a_source():
    assert set(PRESETS) <= set(preset_names())
    for name in PRESETS:
        spec = load_cluster(name)
        assert spec.world_size == 16 and spec.gpus_per_node == 8
        assert spec.nccl_graph and spec.sim
        text = (resources.files("costmodel") / "presets" / f"{name}.yaml").read_text()
        for line in text.splitlines():
            body = line.split("#", 1)[0]
            if re.search(r":\s*-?[0-9][0-9.]*\s*$", body):
                assert "#" in line, f"{name}: number without a source comment: {line.strip()}"


def test_paper_clusters_differ_where_the_paper_says():
    low, high = load_cluster("low-bw"), load_cluster("high-bw")
    assert low.gpu == high.gpu  # both A40
    assert low.intra_node.kind == "pcie" and high.intra_node.kind == "nvlink"
    assert high.inter_node.nics_per_node * high.inter_node.nic_bw_gb_per_s > 7 * low.inter_node.nic_bw_gb_per_s


def sig(coll, nbytes, ranks=8, nodes=1):
    return Signature("0", coll, nbytes, ranks, nodes)


@pytest.mark.parametrize("name", PRESETS)
def test_default_config_fills_every_field(name):
    cluster = load_cluster(name)
    for coll in CollectiveType:
        for nbytes in (1024, 1 << 20, 64 << 20):
            for ranks, nodes in ((8, 1), (16, 2), (2, 2)):
                cfg = nccl_default_config(cluster, sig(coll, nbytes, ranks, nodes))
                assert None not in (cfg.algorithm, cfg.protocol, cfg.channels, cfg.threads, cfg.chunk_bytes)
                assert 1 <= cfg.channels <= 32 and cfg.threads % 32 == 0 and cfg.chunk_bytes > 0


def test_paper_default_on_cluster_a_is_nc8_chunk_2mb():
    # Lagom paper: on cluster A NCCL runs the Phi-2 FSDP AllGather with NC = 8, C = 2 MB.
    cfg = nccl_default_config(load_cluster("high-bw"), sig(CollectiveType.ALLGATHER, 160 << 20))
    assert (cfg.algorithm, cfg.protocol, cfg.channels, cfg.chunk_bytes) == (Algorithm.RING, Protocol.SIMPLE, 8, 2 << 20)


def test_small_messages_pick_ll_and_shed_channels():
    cluster = load_cluster("a100-nvswitch")
    small = nccl_default_config(cluster, sig(CollectiveType.ALLREDUCE, 4096))
    large = nccl_default_config(cluster, sig(CollectiveType.ALLREDUCE, 256 << 20))
    assert small.protocol is Protocol.LL and small.channels < large.channels == comm_channels(cluster)
    assert large.protocol is Protocol.SIMPLE
    # LL128 is NCCL's pick in between on NVLink Ampere, and is never picked over PCIe
    mids = {nccl_default_config(cluster, sig(CollectiveType.ALLREDUCE, 1 << k)).protocol for k in range(12, 29)}
    assert Protocol.LL128 in mids
    low = load_cluster("low-bw")
    assert all(e.protocol is not Protocol.LL128 for e in algo_estimates(low, sig(CollectiveType.ALLREDUCE, 1 << 20)))


def test_nccl_model_time_grows_with_size_and_tree_only_for_allreduce():
    cluster = load_cluster("low-bw")
    est = algo_estimates(cluster, sig(CollectiveType.ALLREDUCE, 1 << 20, 16, 2))
    assert {e.algorithm for e in est} == {Algorithm.RING, Algorithm.TREE}
    wide = algo_estimates(cluster, sig(CollectiveType.ALLGATHER, 1 << 20, 16, 2))
    assert {e.algorithm for e in wide} == {Algorithm.RING}
    t = [min(e.time_us for e in algo_estimates(cluster, sig(CollectiveType.ALLREDUCE, 1 << k)))
         for k in range(10, 30, 2)]
    assert t == sorted(t)


def test_overrides_and_resolve():
    cluster = load_cluster("low-bw")
    cluster.nccl_defaults = {"channels": 4, "by_collective": {"allgather": {"chunk_bytes": 1 << 20}}}
    s = sig(CollectiveType.ALLGATHER, 64 << 20)
    assert nccl_default_config(cluster, s).channels == 4
    assert nccl_default_config(cluster, s).chunk_bytes == 1 << 20
    r = resolve_config(cluster, s, CommConfig(channels=2))
    assert r.channels == 2 and r.chunk_bytes == 1 << 20 and r.algorithm is Algorithm.RING
    forced = resolve_config(load_cluster("low-bw"), s, CommConfig(protocol=Protocol.LL))
    assert forced.protocol is Protocol.LL and forced.chunk_bytes == 65536
    cluster.nccl_defaults = {"protocol": "bogus"}
    with pytest.raises(LagomError, match="nccl_defaults"):
        nccl_default_config(cluster, s)


@pytest.mark.parametrize("old, new, message", [
    ("sm_count: 84 ", "sm_count: 84.5 ", "'gpu.sm_count' must be an integer, got 84.5"),
    ("sm_count: 84 ", "sm_count: true ", "'gpu.sm_count' must be an integer, got True"),
    ("mem_bw_gb_per_s: 696 ", "mem_bw_gb_per_s: .nan ", "'gpu.mem_bw_gb_per_s' must be finite"),
    ("nic_bw_gb_per_s: 12.0 ", "nic_bw_gb_per_s: .inf ", "'inter_node.nic_bw_gb_per_s' must be finite"),
    ('nccl_version: "2.18.3"', 'nccl_version: "banana"', "'nccl_version': NCCL version 'banana' is not of the form"),
    ('nccl_version: "2.18.3"', 'nccl_version: "2.30.1"', "'nccl_version' '2.30.1': NCCL never released 2.30.1"),
    ('nccl_version: "2.18.3"', "nccl_version: 2.20", "'nccl_version' must be a quoted string"),
    ("  gemm_efficiency: 0.70 ", "  gemm_efficiency: 7 ", "'sim.gemm_efficiency' is a fraction"),
    ("  gemm_efficiency: 0.70 ", "  gemm_efficiency: 0 ", "'sim.gemm_efficiency' is a fraction"),
])
def test_bad_cluster_numbers_are_one_line_errors(tmp_path, old, new, message):
    """These used to be truncated (84.5 SMs -> 84, true -> 1 SM), simulated with NaN/inf bandwidth,
    kept as an unparseable NCCL version, or crashed the simulator (efficiency 0: ZeroDivisionError)."""
    from costmodel.sim.simulator import Simulator

    text = (resources.files("costmodel") / "presets" / "low-bw.yaml").read_text()
    assert old in text
    path = tmp_path / "cluster.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(LagomError) as info:
        Simulator(load_cluster(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_presets_say_what_their_fabric_offers_and_name_a_current_nccl():
    """NVLink SHARP on NVSwitch 3 and later (Hopper, Blackwell), not on the A100's NVSwitch 2 nor off
    NVSwitch; every preset names a current NCCL release but the paper's A40 ones (2.18.3, its figures')."""
    from nccl_env.nccl_releases import RELEASED
    from nccl_env.rules import NcclVersion

    clusters = {name: load_cluster(name) for name in preset_names()}
    assert {n for n, c in clusters.items() if c.intra_node.nvls} == {"h100-nvswitch", "h200-nvswitch",
                                                                     "b200-nvswitch", "gb200-nvl72"}
    assert {n: str(c.nccl_version) for n, c in clusters.items() if c.nccl_version < NcclVersion(2, 30)} == {
        "low-bw": "2.18.3", "high-bw": "2.18.3"}
    assert all(c.nccl_version in RELEASED for c in clusters.values())
    h200 = clusters["h200-nvswitch"]
    assert (h200.gpu.sm_count, h200.gpu.mem_bw_gb_per_s, h200.gpu.l2_bytes,
            h200.nccl_graph["compute_capability"]) == (132, 4800, 50 << 20, 90)
    b200 = clusters["b200-nvswitch"].sim  # NCCL's sm_100 rows (tuning.cc, v2.30.7-1)
    assert (b200["ll128_bw_per_channel_gb_per_s"], b200["ll_bw_per_channel_gb_per_s"]) == (40.0, 17.6)
