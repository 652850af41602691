"""NVLS, NVLSTree and PAT in both evaluators (issue 30 item 2): each with its own mechanism and
footprint, allowed in a plan where NCCL would run it, offered by the tuner space there.

The NVLS cluster is the h100-nvswitch preset with ``intra_node.nvls`` set here (the preset's own
flag is another change's); published figures: nccl-tests #212 (a maintainer: ~480 GB/s bus
bandwidth on 8 x H100) and NCCL 2.26.2's nccl-tests curve in ../shared/fidelity/nccl_model.json
(466.96 GB/s at 1 GiB, 476.45 at 4 GiB)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.calibration.calibrate import gemm_op
from costmodel.cluster import ClusterSpec, load_cluster
from costmodel.evaluator import check_plan
from costmodel.sim.simulator import Simulator, tiny_overlap_workload
from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Plan, Protocol, Signature
from nccl_env.rules import NcclVersion
from traces.generate import generate_workload
from tuner.space import build_space

V = NcclVersion.parse
MIB = 1 << 20
GIB = 1 << 30
EVALUATORS: dict[str, Callable[[ClusterSpec], Simulator | AnalyticEvaluator]] = {
    "sim": lambda cluster: Simulator(cluster, noise=0.0),
    "analytic": AnalyticEvaluator,
}


def _nvls(cluster: ClusterSpec, version: str = "2.26.2") -> ClusterSpec:
    return replace(cluster, intra_node=replace(cluster.intra_node, nvls=True), nccl_version=V(version))


@pytest.fixture(scope="module")
def h100() -> ClusterSpec:
    return load_cluster("h100-nvswitch")


@pytest.fixture(scope="module")
def h100_nvls(h100) -> ClusterSpec:
    return _nvls(h100)


@pytest.fixture(params=sorted(EVALUATORS))
def make(request) -> Callable[[ClusterSpec], Simulator | AnalyticEvaluator]:
    return EVALUATORS[request.param]


def _busbw_gb_per_s(collective: CollectiveType, size: int, ranks: int, time_us: float) -> float:
    factor = 2 * (ranks - 1) / ranks if collective is CollectiveType.ALLREDUCE else (ranks - 1) / ranks
    return size / time_us / 1e3 * factor


def test_nvls_allreduce_reaches_the_published_bus_bandwidth(make, h100_nvls):
    """8 x H100 NVLS AllReduce at 1 GiB: within 15% of the published 467-479 GB/s, above the ring's."""
    ev = make(h100_nvls)
    sig = Signature("g", CollectiveType.ALLREDUCE, GIB, 8, 1)
    nvls = _busbw_gb_per_s(sig.collective, GIB, 8, ev.collective_time_us(sig, CommConfig(Algorithm.NVLS)))
    ring = _busbw_gb_per_s(sig.collective, GIB, 8,
                           ev.collective_time_us(sig, CommConfig(Algorithm.RING, Protocol.SIMPLE)))
    assert 467 * 0.85 <= nvls <= 479 * 1.15
    assert nvls > ring * 1.15  # the switch reduces: each GPU's link carries its buffer ~once


def test_nvls_holds_fewer_sms_and_costs_compute_less_than_a_ring_of_its_channels(make, h100_nvls):
    """NVLS holds NCCL's 16 NVLS channels (the ring's default on H100 is 32) and, with no FIFO of
    2 MiB chunks, costs a large GEMM beside it less than a Simple ring of the same 16 channels."""
    sim = Simulator(h100_nvls, noise=0.0)
    sig = Signature("g", CollectiveType.ALLREDUCE, 256 * MIB, 8, 1)
    nvls_model = sim.collective_model(sig, CommConfig(Algorithm.NVLS))
    ring_model = sim.collective_model(sig, CommConfig())
    assert nvls_model.ctas == 16 < ring_model.ctas
    assert nvls_model.footprint_bytes < ring_model.footprint_bytes / 8
    ev = make(h100_nvls)
    gemm = gemm_op(8192, 8192, 8192)
    beside = {name: ev.overlap_us(gemm, sig, config)[0] for name, config in (
        ("nvls", CommConfig(Algorithm.NVLS)), ("ring16", CommConfig(Algorithm.RING, Protocol.SIMPLE, 16)),
        ("default", CommConfig()))}
    alone = ev.compute_time_us(gemm)
    assert alone < beside["nvls"] < beside["ring16"] < beside["default"]


def test_nvls_channels_follow_the_plan_up_to_nccls_nvls_channels(h100_nvls):
    sim = Simulator(h100_nvls, noise=0.0)
    sig = Signature("g", CollectiveType.ALLREDUCE, 256 * MIB, 8, 1)
    assert sim.collective_model(sig, CommConfig(Algorithm.NVLS, channels=8)).ctas == 8
    assert sim.collective_model(sig, CommConfig(Algorithm.NVLS, channels=32)).ctas == 16  # buffers for 16 only
    fewer = sim.collective_time_us(sig, CommConfig(Algorithm.NVLS, channels=8))
    assert fewer > sim.collective_time_us(sig, CommConfig(Algorithm.NVLS)) * 1.5  # the channels are the limit


def test_nvls_tree_crosses_nodes_and_shares_the_network(make, h100_nvls):
    """Across two nodes NVLSTree's time at 1 GiB is set by the slower of the switch and the NICs;
    it beats the 16-rank ring, which crosses the network 2(n-1)/n x per rank."""
    ev = make(h100_nvls)
    sig = Signature("g", CollectiveType.ALLREDUCE, GIB, 16, 2)
    tree = ev.collective_time_us(sig, CommConfig(Algorithm.NVLS_TREE))
    ring = ev.collective_time_us(sig, CommConfig(Algorithm.RING, Protocol.SIMPLE))
    one_node = ev.collective_time_us(Signature("g", CollectiveType.ALLREDUCE, GIB, 8, 1), CommConfig(Algorithm.NVLS))
    assert one_node <= tree < ring


def test_pat_latency_grows_with_log_steps_and_the_ring_linearly(make, h100):
    """One GPU per node, 1 KiB per rank: PAT's time grows by about a network round per doubling
    of the nodes, the Simple ring's by about a hop per node."""
    ev = make(replace(h100, nccl_version=V("2.23.4")))

    def time(algo: Algorithm, nodes: int) -> float:
        sig = Signature("g", CollectiveType.ALLGATHER, 1024 * nodes, nodes, nodes)
        return ev.collective_time_us(sig, CommConfig(algo, Protocol.SIMPLE))

    pat = {n: time(Algorithm.PAT, n) for n in (4, 8, 16, 32, 64)}
    ring = {n: time(Algorithm.RING, n) for n in (4, 8, 16, 32, 64)}
    steps = [pat[2 * n] - pat[n] for n in (4, 8, 16, 32)]
    assert max(steps) < 1.5 * min(steps)  # a constant step per doubling: log2(n)
    assert ring[64] - ring[32] > 1.8 * (ring[32] - ring[16])  # linear in n
    assert pat[64] < ring[64] / 3


def test_collnet_direct_crosses_the_network_once_where_the_network_reduces(make, h100):
    """Where a cluster declares in-network reduction, CollNetDirect's AllReduce puts the node's
    buffer on its NICs once: with one GPU per node (4 nodes) 1 GiB takes about 2/3 of the Simple
    ring's time (which crosses them 2(n-1)/n = 1.5 times); refused where it is not declared."""
    cluster = replace(h100, inter_node=replace(h100.inter_node, collnet=True))
    ev = make(cluster)
    sig = Signature("g", CollectiveType.ALLREDUCE, GIB, 4, 4)
    collnet = ev.collective_time_us(sig, CommConfig(Algorithm.COLLNET_DIRECT))
    ring = ev.collective_time_us(sig, CommConfig(Algorithm.RING, Protocol.SIMPLE))
    assert collnet == pytest.approx(ring / 1.5, rel=0.1)
    with pytest.raises(LagomError, match="inter_node.collnet"):
        check_plan(Plan({sig: CommConfig(Algorithm.COLLNET_DIRECT)}), h100)
    with pytest.raises(LagomError, match="CollNetChain is not modelled"):
        check_plan(Plan({sig: CommConfig(Algorithm.COLLNET_CHAIN)}), cluster)


class TestPlans:
    def test_nvls_is_refused_in_one_line_on_a_cluster_without_nvls(self, make, h100):
        sig = Signature("g", CollectiveType.ALLREDUCE, 64 * MIB, 8, 1)
        w = tiny_overlap_workload(gemm_op(1024, 1024, 1024), sig)
        with pytest.raises(LagomError) as info:
            make(h100).evaluate(w, Plan({sig: CommConfig(Algorithm.NVLS)}))
        text = str(info.value)
        assert "\n" not in text and "algorithm=nvls" in text and "intra_node.nvls" in text

    def test_nccls_own_doors_are_the_plans(self, h100_nvls, h100):
        ok = [(h100_nvls, Signature("g", CollectiveType.ALLREDUCE, MIB, 8, 1), Algorithm.NVLS),
              (h100_nvls, Signature("g", CollectiveType.REDUCESCATTER, MIB, 8, 1), Algorithm.NVLS),
              (h100_nvls, Signature("g", CollectiveType.ALLREDUCE, MIB, 16, 2), Algorithm.NVLS_TREE),
              (replace(h100, nccl_version=V("2.23.4")), Signature("g", CollectiveType.ALLGATHER, MIB, 4, 4),
               Algorithm.PAT)]
        for cluster, sig, algo in ok:
            check_plan(Plan({sig: CommConfig(algo)}), cluster)
        refused = [
            (h100_nvls, Signature("g", CollectiveType.ALLREDUCE, MIB, 16, 2), Algorithm.NVLS, "CollNet"),
            (h100_nvls, Signature("g", CollectiveType.ALLREDUCE, MIB, 8, 1), Algorithm.NVLS_TREE, "one node"),
            (h100_nvls, Signature("g", CollectiveType.ALLTOALL, MIB, 8, 1), Algorithm.NVLS, "alltoall"),
            (_nvls(h100, "2.18.3"), Signature("g", CollectiveType.ALLGATHER, MIB, 8, 1), Algorithm.NVLS, "from 2.19"),
            (replace(h100, nccl_version=V("2.23.4")), Signature("g", CollectiveType.ALLGATHER, MIB, 16, 2),
             Algorithm.PAT, "one GPU per node"),
            (replace(h100, nccl_version=V("2.22.3")), Signature("g", CollectiveType.ALLGATHER, MIB, 4, 4),
             Algorithm.PAT, "from 2.23"),
            (h100_nvls, Signature("g", CollectiveType.ALLREDUCE, MIB, 8, 1), Algorithm.COLLNET_DIRECT, "CollNet"),
            (_nvls(load_cluster("a100-nvswitch")), Signature("g", CollectiveType.ALLREDUCE, MIB, 8, 1), Algorithm.NVLS,
             "compute capability 9.0"),
        ]
        for cluster, sig, algo, why in refused:
            with pytest.raises(LagomError, match=why):
                check_plan(Plan({sig: CommConfig(algo)}), cluster)

    def test_a_default_nvls_leaves_to_nccl_what_it_would_not_run_on_nvls(self, make, h100_nvls):
        """FSDP on two nodes: NCCL runs no NVLS for AllGather / ReduceScatter across nodes, so a
        plan's default NVLS changes nothing there (NCCL's own choice stands, as with the plugin)."""
        w = generate_workload("fsdp:hidden=1024,layers=2,ffn=4096,heads=16,vocab=8000:gpus=16")
        ev = make(h100_nvls)
        assert all(w.signature(op, 8).nodes == 2 for op in w.collectives)
        default_nvls = ev.evaluate(w, Plan(default=CommConfig(Algorithm.NVLS)))
        assert default_nvls.iteration_us == pytest.approx(ev.evaluate(w, Plan()).iteration_us, rel=1e-12)

    def test_the_space_offers_them_where_nccl_runs_them(self, h100_nvls, h100):
        w = generate_workload("fsdp:hidden=1024,layers=2,ffn=4096,heads=16,vocab=8000:gpus=8")
        with_nvls = build_space(w, h100_nvls)
        without = build_space(w, h100)
        for sig in with_nvls.signatures:
            assert (Algorithm.NVLS, Protocol.SIMPLE) in with_nvls.pairs[sig]
            assert (Algorithm.NVLS, Protocol.SIMPLE) not in without.pairs[sig]
        # a plan from the space is one both evaluators run
        unit = with_nvls.subspace_units[0]
        point = with_nvls.minimum_point().with_pair(unit.index, (Algorithm.NVLS, Protocol.SIMPLE))
        plan = with_nvls.plan(point)
        for make in EVALUATORS.values():
            assert make(h100_nvls).evaluate(w, plan).iteration_us > 0
