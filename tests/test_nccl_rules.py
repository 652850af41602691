"""NCCL version rules and the delivery of a plan over env / process groups / plugin table."""

from __future__ import annotations

import pytest

from nccl_env import Algorithm, CollectiveType, CommConfig, LagomError, Plan, Protocol, Signature
from nccl_env.delivery import deliver
from nccl_env.plugin_abi import TunerLibrary
from nccl_env.plugin_build import build_plugin
from nccl_env.plugin_table import PluginEntry, format_table, parse_table
from nccl_env.rules import (
    NcclVersion,
    algorithms_available,
    max_channels,
    per_collective_knobs,
    process_wide_knobs,
    tuner_symbols,
    validate_config,
)

V = NcclVersion.parse
AG, RS, AR = CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE


def test_versions_parse_decode_and_order():
    assert NcclVersion.from_code(21803) == V("2.18.3") == NcclVersion(2, 18, 3)
    assert NcclVersion.from_code(23203) == V("v2.32.3-1")
    assert NcclVersion.from_code(2708) == V("2.7.8")  # pre-2.9 encoding
    assert V("2.18.3") < V("2.21") < V("2.21.5") < V("2.30.0") and str(V("2.24")) == "2.24.0"
    assert V("2.30").code == 23000
    with pytest.raises(LagomError, match="'two.18'"):
        V("two.18")


def test_algorithms_channels_and_plugin_abi_by_version():
    assert Algorithm.PAT not in algorithms_available(V("2.22.3"))
    assert algorithms_available(V("2.23.4"))[-1] is Algorithm.PAT
    assert Algorithm.NVLS_TREE not in algorithms_available(V("2.17.1"))
    assert (max_channels(V("2.24.3")), max_channels(V("2.25.1"))) == (32, 64)
    assert tuner_symbols(V("2.18.3")) == ()
    assert tuner_symbols(V("2.24.3")) == ("ncclTunerPlugin_v4", "ncclTunerPlugin_v3", "ncclTunerPlugin_v2")
    assert tuner_symbols(V("2.32.3"))[0] == "ncclTunerPlugin_v6"


def test_per_collective_and_process_wide_knobs_partition_commconfig():
    assert per_collective_knobs(V("2.18.3")) == frozenset()
    assert per_collective_knobs(V("2.21.5")) == {"algorithm", "protocol", "channels"}
    assert per_collective_knobs(V("2.30.0")) == {"algorithm", "protocol", "channels", "chunk_bytes"}
    for v in ("2.18.3", "2.21.5", "2.29.2", "2.32.3"):
        assert "threads" in process_wide_knobs(V(v))
        assert per_collective_knobs(V(v)) | process_wide_knobs(V(v)) == {
            "algorithm", "protocol", "channels", "threads", "chunk_bytes"}
        assert not per_collective_knobs(V(v)) & process_wide_knobs(V(v))


@pytest.mark.parametrize("config, version, message", [
    (CommConfig(threads=100), "2.18.3", r"threads=100 .*multiple of 32 in 64-512"),
    (CommConfig(threads=640), "2.18.3", r"threads=640 .*64-512"),
    (CommConfig(protocol=Protocol.LL128, threads=128), "2.18.3", r"threads=128 .*160-640 \(LL128\)"),
    (CommConfig(channels=33), "2.24.3", r"channels=33 .*1-32"),
    (CommConfig(channels=0), "2.25.1", r"channels=0 .*1-64"),
    (CommConfig(algorithm=Algorithm.PAT), "2.22.3", r"algorithm=pat .*NCCL 2\.22\.3.*from 2\.23"),
    (CommConfig(chunk_bytes=1000), "2.30.0", r"chunk_bytes=1000 .*multiple of 512"),
])
def test_invalid_values_name_knob_value_and_range(config, version, message):
    with pytest.raises(LagomError, match=message):
        validate_config(config, V(version), CollectiveType.ALLGATHER)


def test_chunk_against_the_buffer():
    ring = CommConfig(algorithm=Algorithm.RING, chunk_bytes=2 << 20)
    validate_config(ring, V("2.30.0"), buffsize_bytes=4 << 20)  # ring/simple ceiling: 4 MiB / 8 x 4 = 2 MiB
    with pytest.raises(LagomError, match=r"chunk_bytes=2097152 .*at most 524288 with NCCL_BUFFSIZE=4194304"):
        validate_config(CommConfig(algorithm=Algorithm.TREE, chunk_bytes=2 << 20), V("2.30.0"),
                        buffsize_bytes=4 << 20)


def test_valid_values_pass():
    for cfg, v in ((CommConfig(Algorithm.RING, Protocol.SIMPLE, 64, 512, 700416), "2.25.1"),
                   (CommConfig(protocol=Protocol.LL128, threads=640), "2.18.3"),
                   (CommConfig(algorithm=Algorithm.NVLS_TREE, channels=32, threads=64), "2.18.3")):
        validate_config(cfg, V(v))


def _plan() -> Plan:
    return Plan({
        Signature("0", AG, 1 << 20, 8, 1): CommConfig(Algorithm.RING, Protocol.SIMPLE, 2, 256, 700416),
        Signature("0", RS, 4 << 20, 8, 1): CommConfig(Algorithm.RING, Protocol.SIMPLE, 4, 512, 1398784),
        Signature("1", AR, 64 << 20, 16, 2): CommConfig(Algorithm.TREE, Protocol.LL128, 8, None, None),
    })


def test_old_nccl_everything_through_env_and_process_groups():
    d = deliver(_plan(), V("2.18.3"))
    assert d.plugin_entries == []
    assert d.group_configs == {"0": {"min_ctas": 4, "max_ctas": 4}, "1": {"min_ctas": 8, "max_ctas": 8}}
    assert d.env["NCCL_NTHREADS"] == "512"  # from the 4 MiB reducescatter, the largest with threads
    assert d.env["NCCL_BUFFSIZE"] == str(1398784 * 2)  # ring/simple chunk = BUFFSIZE / 8 steps x 4
    assert d.env["NCCL_ALGO"] == "tree,ring" and d.env["NCCL_PROTO"] == "LL128,Simple"
    assert "NCCL_MIN_CTAS" not in d.env  # it would override every communicator's minCTAs
    text = " | ".join(d.compromises)
    for piece in ("threads: the plan asks for 256, 512", "chunk_bytes: the plan asks for 1398784, 700416",
                  "channels: the plan asks for 2, 4 in process group '0'", "NCCL_ALGO=tree,ring"):
        assert piece in text


def test_plugin_era_per_collective_and_chunk_from_2_30():
    d = deliver(_plan(), V("2.24.3"))
    assert [e.settings.channels for e in d.plugin_entries] == [2, 4, 8]
    assert all(e.settings.chunk_bytes is None for e in d.plugin_entries)
    assert d.env == {"NCCL_NTHREADS": "512", "NCCL_BUFFSIZE": str(1398784 * 2)}
    # NCCL caps a plugin's channels at the communicator's: minCTAs lets the plugin ask for the most.
    assert d.group_configs == {"0": {"min_ctas": 4}, "1": {"min_ctas": 8}}
    d = deliver(_plan(), V("2.30.3"))
    assert [e.settings.chunk_bytes for e in d.plugin_entries] == [700416, 1398784, None]
    assert "NCCL_BUFFSIZE" not in d.env  # 1398784 fits NCCL's default 4 MiB buffer (ceiling 2 MiB)
    assert d.plugin_entries[2] == PluginEntry(AR, 64 << 20, 64 << 20, 2, 16,
                                              settings=CommConfig(Algorithm.TREE, Protocol.LL128, 8))
    big = Plan({Signature("0", AG, 1 << 30, 8, 1): CommConfig(chunk_bytes=8 << 20)})
    assert deliver(big, V("2.30.3")).env["NCCL_BUFFSIZE"] == str(16 << 20)


def test_without_plugin_per_function_env_syntax_from_2_24():
    d = deliver(_plan(), V("2.24.3"), use_plugin=False)
    assert d.env["NCCL_ALGO"] == "allgather:ring;reducescatter:ring;allreduce:tree"
    assert d.env["NCCL_PROTO"] == "allgather:Simple;reducescatter:Simple;allreduce:LL128"


def test_groups_the_plugin_cannot_tell_apart_and_p2p():
    plan = Plan({
        Signature("dp", AG, 1 << 20, 8, 1): CommConfig(channels=2),
        Signature("tp", AG, 1 << 20, 8, 1): CommConfig(channels=6),
        Signature("ep", CollectiveType.ALLTOALL, 1 << 20, 8, 1): CommConfig(channels=3),
    })
    d = deliver(plan, V("2.25.1"))
    assert [e.settings.channels for e in d.plugin_entries] == [2]
    assert any("cannot tell process groups apart" in c and "'tp'" in c for c in d.compromises)
    assert any("alltoall[ep]" in c and "point-to-point" in c for c in d.compromises)


def test_point_to_point_takes_its_step_from_the_p2p_env_never_buffsize_or_threads():
    """NCCL's p2p path (enqueue.cc, init.cc): step from NCCL_P2P_{NET,NVL,PCI}_CHUNKSIZE, threads fixed;
    from 2.19 the step is kept within NCCL_BUFFSIZE / 8."""
    A2A = CollectiveType.ALLTOALL
    plan = Plan({
        Signature("ep", A2A, 1 << 24, 8, 1): CommConfig(threads=128, chunk_bytes=1 << 20),
        Signature("ep2", A2A, 1 << 24, 16, 2): CommConfig(chunk_bytes=1 << 18),
        Signature("0", AG, 1 << 26, 8, 1): CommConfig(threads=256, chunk_bytes=1 << 17),
    })
    old = deliver(plan, V("2.18.3"))
    assert old.env["NCCL_NTHREADS"] == "256" and old.env["NCCL_BUFFSIZE"] == str(1 << 18)  # the allgather's alone
    assert old.env["NCCL_P2P_NET_CHUNKSIZE"] == str(1 << 18)
    assert old.env["NCCL_P2P_NVL_CHUNKSIZE"] == old.env["NCCL_P2P_PCI_CHUNKSIZE"] == str(1 << 20)
    assert any("alltoall[ep]" in c and "threads not delivered" in c for c in old.compromises)
    capped = deliver(plan, V("2.21.5"))  # BUFFSIZE 256 KiB sets the allgather's chunk: steps cut to 32 KiB
    assert capped.env["NCCL_P2P_NET_CHUNKSIZE"] == capped.env["NCCL_P2P_PCI_CHUNKSIZE"] == str(1 << 15)
    assert sum("cut to 32768" in c for c in capped.compromises) == 2
    free = deliver(plan, V("2.30.3"))  # the plugin carries the allgather's chunk: BUFFSIZE grows to fit 1 MiB
    assert free.env["NCCL_BUFFSIZE"] == str(8 << 20) and free.env["NCCL_P2P_NVL_CHUNKSIZE"] == str(1 << 20)
    assert not any("cut to" in c for c in free.compromises)


def test_invalid_plan_names_the_signature():
    plan = Plan({Signature("0", AG, 1 << 20, 8, 1): CommConfig(channels=48)})
    with pytest.raises(LagomError, match=r"allgather\[0\] 1048576B.*channels=48.*1-32"):
        deliver(plan, V("2.24.3"))


def test_delivered_table_makes_the_real_plugin_apply_the_plan():
    plan = _plan()
    d = deliver(plan, V("2.30.3"))
    text = format_table(d.plugin_entries)
    assert parse_table(text) == (d.plugin_entries, [])
    lib = TunerLibrary(build_plugin())
    assert lib.set_table(text) == 3
    for sig, cfg in plan.entries.items():
        with lib.open(6, sig.ranks, sig.nodes) as comm:
            table = [[40.0, 30.0, 35.0], [50.0, 25.0, 28.0], [-1.0] * 3, [-1.0] * 3, [-1.0] * 3, [-1.0] * 3,
                     [-1.0, -1.0, 31.0]]
            r = comm.get_coll_info(sig.collective.nccl_func, sig.message_bytes, table)
            assert r.chosen() == (int(cfg.algorithm), int(cfg.protocol))
            assert r.n_channels == cfg.channels
            chunk = comm.get_chunk_size(sig.collective.nccl_func, sig.message_bytes, int(cfg.algorithm),
                                        int(cfg.protocol), r.n_channels, 2 << 20)
            assert chunk == (cfg.chunk_bytes or 2 << 20)
            # one byte more is another signature: NCCL decides
            assert comm.get_coll_info(sig.collective.nccl_func, sig.message_bytes + 1, table).n_channels == 0
    lib.set_table(None)


def test_format_table_refuses_what_the_plugin_would_reject():
    with pytest.raises(LagomError, match="channels=65"):
        format_table([PluginEntry(AG, settings=CommConfig(channels=65))])
    with pytest.raises(LagomError, match="sendrecv never reaches a tuner plugin"):
        format_table([PluginEntry(CollectiveType.SENDRECV, settings=CommConfig(channels=2))])
    with pytest.raises(LagomError, match="min_bytes=10 is larger than max_bytes=5"):
        format_table([PluginEntry(AG, 10, 5)])
