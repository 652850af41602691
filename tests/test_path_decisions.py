"""Communication paths (symmetric kernels, copy engines): NCCL's rules, and when the search takes one.

The rules are NCCL's (nccl_env.rules, read from NVIDIA/nccl's source at the release tags);
the decisions run the real search on the real evaluators: a path is taken where the
compute it overlaps is short of SMs, and NCCL's kernels are kept where nothing overlaps
(the "when not to" cases of issue 18: a copy-engine collective alone is slower than the ring).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import load_cluster
from costmodel.nccl_defaults import symmetric_kernel
from costmodel.sim.simulator import Simulator
from lagom.orchestration import bench_matrix, tuning
from nccl_env import CollectiveType, CommConfig, CommPath, Plan, Signature
from nccl_env.delivery import deliver
from nccl_env.errors import LagomError
from nccl_env.rules import Mechanism, NcclVersion, Topology, collective_mechanism, path_requirements
from tuner import LagomSearch

V = NcclVersion.parse
NVLINK = Topology(all_nvlink=True)
PCIE = Topology(all_nvlink=False)
AG, AR, RS, A2A = (CollectiveType.ALLGATHER, CollectiveType.ALLREDUCE, CollectiveType.REDUCESCATTER,
                   CollectiveType.ALLTOALL)


@pytest.fixture(scope="module")
def h100() -> object:
    return replace(load_cluster("h100-nvswitch"), nccl_version=NcclVersion.parse("2.30.7"))


def test_copy_engines_from_2_28_on_one_nvlink_node_and_across_nodes_from_2_30_6():
    ce = CommPath.COPY_ENGINE
    assert collective_mechanism(ce, AG, 1, V("2.27.7"), NVLINK) is Mechanism.SM_KERNEL  # no ZERO policy yet
    assert collective_mechanism(ce, AG, 1, V("2.28.3"), NVLINK) is Mechanism.COPY_ENGINE
    assert collective_mechanism(ce, A2A, 1, V("2.28.3"), NVLINK) is Mechanism.COPY_ENGINE
    assert collective_mechanism(ce, AR, 1, V("2.30.7"), NVLINK) is Mechanism.SM_KERNEL  # no copy-engine reduction
    assert collective_mechanism(ce, AG, 2, V("2.30.4"), NVLINK) is Mechanism.SM_KERNEL
    assert collective_mechanism(ce, AG, 2, V("2.30.6"), NVLINK) is Mechanism.COPY_ENGINE  # hierarchical CE
    assert collective_mechanism(ce, AG, 1, V("2.30.7"), PCIE) is Mechanism.SM_KERNEL  # no NVLink domain


def test_symmetric_kernels_from_2_27_for_allgather_allreduce_reducescatter_in_one_node():
    sym = CommPath.SYMMETRIC
    assert collective_mechanism(sym, AR, 1, V("2.26.6"), NVLINK) is Mechanism.SM_KERNEL
    for collective in (AG, AR, RS):
        assert collective_mechanism(sym, collective, 1, V("2.27.3"), NVLINK) is Mechanism.SYMMETRIC_KERNEL
    assert collective_mechanism(sym, A2A, 1, V("2.30.7"), NVLINK) is Mechanism.SM_KERNEL
    assert collective_mechanism(sym, AR, 2, V("2.30.7"), NVLINK) is Mechanism.SM_KERNEL  # two nodes: no NVLink domain
    # EFFICIENCY only re-selects NVLS, which no modelled cluster has
    assert collective_mechanism(CommPath.EFFICIENCY, AG, 1, V("2.30.7"), NVLINK) is Mechanism.SM_KERNEL


def test_nccl_picks_few_ctas_for_its_symmetric_kernels():
    """NCCL's own model (sym_kernels.cc): the fewest CTAs within 2.5% of its best; a large
    AllGather takes the store kernel on a handful of CTAs, far below the ring's 24-32 channels."""
    large = symmetric_kernel(Signature("g", AG, 512 << 20, 8, 1))
    small = symmetric_kernel(Signature("g", AG, 64 << 10, 8, 1))
    assert large is not None and small is not None
    assert large.name == "AllGather_ST" and 2 <= large.ctas <= 12
    assert small.name == "AllGather_LL"  # small messages: the LL kernel's lower latency wins
    assert symmetric_kernel(Signature("g", A2A, 64 << 20, 8, 1)) is None
    # min/max CTAs bound NCCL's pick (ncclConfig_t minCTAs/maxCTAs)
    bounded = symmetric_kernel(Signature("g", AG, 512 << 20, 8, 1), min_ctas=16)
    assert bounded is not None and bounded.ctas >= 16


def test_blackwell_symmetric_kernels_run_on_nccls_sm100_constants():
    """From compute capability 10.0 NCCL's model has its own constants (600 GiB/s peak, 55 GiB/s per CTA,
    13 us base latency for the store kernel): a large AllGather is about twice as fast as on Hopper and takes
    more CTAs to get there."""
    sig = Signature("g", AG, 512 << 20, 8, 1)
    hopper = symmetric_kernel(sig)
    blackwell = symmetric_kernel(sig, compute_capability=100)
    assert hopper is not None and blackwell is not None
    assert blackwell.name == "AllGather_ST" and blackwell.base_latency_us == 13.0
    assert blackwell.peak_bw_bytes_per_us == pytest.approx(600 * (1 << 30) / 1e6)
    assert 1.7 < hopper.time_us / blackwell.time_us < 2.0 and blackwell.ctas > hopper.ctas
    # the simulator on the b200-nvswitch preset uses them
    sim = Simulator(replace(load_cluster("b200-nvswitch"), nccl_version=V("2.28.9")), noise=0.0)
    model = sim.collective_model(sig, CommConfig(comm_path=CommPath.SYMMETRIC))
    assert model.ctas == blackwell.ctas


def test_delivery_sets_the_cta_policy_per_group_and_refuses_it_where_nccl_has_none():
    ag = Signature("fsdp", AG, 64 << 20, 8, 1)
    rs = Signature("fsdp", RS, 64 << 20, 8, 1)
    tp = Signature("tp", AR, 16 << 20, 8, 1)
    plan = Plan({ag: CommConfig(comm_path=CommPath.COPY_ENGINE), rs: CommConfig(comm_path=CommPath.COPY_ENGINE),
                 tp: CommConfig(comm_path=CommPath.SYMMETRIC, channels=4)})
    out = deliver(plan, V("2.30.7"))
    assert out.group_configs["fsdp"] == {"cta_policy": "zero"}
    assert "cta_policy" not in out.group_configs.get("tp", {})  # symmetric kernels need no policy
    assert "NCCL_CTA_POLICY" not in out.env  # it would override the symmetric group's too
    # copy engines alone: the process-wide twin as well (ZERO moves only registered buffers,
    # which only the copy-engine groups have), for torch builds without the config binding
    alone = deliver(Plan({ag: CommConfig(comm_path=CommPath.COPY_ENGINE), tp: CommConfig(channels=4)}), V("2.28.3"))
    assert alone.env["NCCL_CTA_POLICY"] == "2" and alone.group_configs["fsdp"] == {"cta_policy": "zero"}
    with pytest.raises(LagomError, match="path=copy_engine .* from NCCL 2.28"):
        deliver(plan, V("2.27.7"))
    # a symmetric group's minCTAs is left alone: NCCL gives its symmetric kernels at least that many
    fsdp_channels = Plan({ag: CommConfig(channels=24), tp: CommConfig(comm_path=CommPath.SYMMETRIC),
                          replace(tp, message_bytes=1 << 30): CommConfig(channels=24)})
    out = deliver(fsdp_channels, V("2.30.7"))
    assert out.group_configs["fsdp"] == {"min_ctas": 24}
    assert "min_ctas" not in out.group_configs.get("tp", {})
    assert any("symmetric kernels" in line for line in out.compromises)
    lines = " ".join(path_requirements(CommPath.COPY_ENGINE, [AG], V("2.30.7")))
    assert "set_symm_mem_for_comm" in lines and "NCCL_CTA_POLICY_ZERO" in lines and "2.30.6" in lines


def _tune(spec: str, cluster, evaluator) -> tuple:
    workload = tuning.load_workload_arg(spec)
    space = tuning.space_for(workload, cluster)
    return workload, space, LagomSearch().tune(workload, evaluator, space)


def test_when_nothing_overlaps_the_search_keeps_nccls_kernels(h100):
    """An FSDP job's collectives with no compute beside them: the copy engines alone are
    slower than NCCL's ring (two barriers of one copy per peer; the ring's bandwidth at best),
    so the search leaves every group on NCCL's kernels."""
    workload = bench_matrix.comm_only(tuning.load_workload_arg("fsdp:phi2:gpus=8"))
    space = tuning.space_for(workload, h100)
    assert space.path_units  # the paths were on offer
    result = LagomSearch().tune(workload, AnalyticEvaluator(h100), space)
    assert all(cfg.comm_path is None for cfg in result.plan.entries.values())
    sim = Simulator(h100, noise=0.0)
    for sig in space.signatures:
        if sig.collective is AG:  # the copy engines move all-gathers only
            assert sim.collective_time_us(sig, CommConfig(comm_path=CommPath.COPY_ENGINE)) > sim.collective_time_us(sig)


def test_where_compute_is_short_of_sms_the_search_takes_the_copy_engines(h100):
    """FSDP Llama-3-8B on one H100 node: the all-gathers overlap GEMMs that fill the GPU, so the
    copy engines (no SM) beat any channel count, and the judge agrees."""
    model = AnalyticEvaluator(h100)
    workload, space, result = _tune("fsdp:llama3-8b:gpus=8", h100, model)
    knobs = LagomSearch(probe_paths=False).tune(workload, model, space)
    paths = {cfg.comm_path for sig, cfg in result.plan.entries.items() if sig.collective is AG}
    assert paths == {CommPath.COPY_ENGINE}
    sim = Simulator(h100, noise=0.0)
    assert sim.evaluate(workload, result.plan).iteration_us < sim.evaluate(workload, knobs.plan).iteration_us * 0.97
