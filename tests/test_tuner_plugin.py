"""The compiled tuner plugin, called through NCCL's ABI (v2-v7) with ctypes."""

from __future__ import annotations

import random
import threading
import time

import pytest

from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol
from nccl_env.plugin_abi import LOGGER, TunerLibrary
from nccl_env.plugin_build import build_plugin
from nccl_env.plugin_table import PluginEntry, format_table, lookup, parse_line, parse_table

BCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLREDUCE = range(5)
TREE, RING, CN_DIRECT, CN_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)
X = -1.0  # NCCL_ALGO_PROTO_IGNORE


def costs(num_algo: int, coll: int = ALLREDUCE) -> list[list[float]]:
    """Cost tables shaped like NCCL's on one 8-GPU NVLink node (us; -1 = unusable)."""
    rows = [
        [40.1, 30.2, 35.5],  # tree
        [50.3, 25.7, 28.9],  # ring
        [X, X, X],  # collnet direct: no CollNet here
        [X, X, X],  # collnet chain
        [X, X, 22.0] if coll == ALLREDUCE else [X, X, X],  # NVLS: Simple only
        [X, X, X],  # NVLS tree: single node
        [X, X, 31.0] if coll in (ALLGATHER, REDUCESCATTER) else [X, X, X],  # PAT
    ]
    return [list(r) for r in rows[:num_algo]]


def flat(table: list[list[float]]) -> list[float]:
    return [c for row in table for c in row]


@pytest.fixture(scope="module")
def lib() -> TunerLibrary:
    return TunerLibrary(build_plugin(strict=True))  # warnings fail the tests, never a user's build


@pytest.fixture
def log():
    messages: list[tuple[int, str]] = []

    def record(level, flags, file, line, fmt, msg):
        messages.append((level, msg.decode()))

    callback = LOGGER(record)
    callback.messages = messages
    return callback


def warnings(log) -> list[str]:
    return [m for level, m in log.messages if level == 2]


TABLE = """\
# realistic Lagom table: exact sizes, wildcards, -1 channels, chunk
allgather,1048576,1048576,ring,simple,2,1,8,-1,-1,chunk_bytes=700416
reducescatter,4194304,4194304,ring,simple,4,1,8,-1,-1,chunk_bytes=1398784
allreduce,0,65535,tree,ll,-1,-1,-1
allreduce,65536,-1,ring,ll128,6,1,-1
-1,0,-1,-1,simple,3,2,16
"""


@pytest.mark.parametrize("abi", [3, 4, 5, 6, 7])
@pytest.mark.parametrize("num_algo", [6, 7])
def test_match_zeroes_pair_sets_channels_and_leaves_the_rest(lib, log, abi, num_algo):
    assert lib.set_table(TABLE) == 5
    with lib.open(abi, 8, 1, log) as comm:
        table = costs(num_algo, ALLGATHER)
        r = comm.get_coll_info(ALLGATHER, 1 << 20, table)
        assert r.rc == 0 and r.n_channels == 2
        assert r.costs[RING][SIMPLE] == 0.0 and r.chosen() == (RING, SIMPLE)
        for a in range(num_algo):  # nothing else touched, no -1 revived
            for p in range(3):
                if (a, p) != (RING, SIMPLE):
                    assert r.costs[a][p] == pytest.approx(table[a][p])
        # byte range + wildcard ranks; -1 channels leaves NCCL's count
        r = comm.get_coll_info(ALLREDUCE, 4096, costs(num_algo))
        assert r.chosen() == (TREE, LL) and r.n_channels == 0
        r = comm.get_coll_info(ALLREDUCE, 1 << 30, costs(num_algo))
        assert r.chosen() == (RING, LL128) and r.n_channels == 6


@pytest.mark.parametrize("abi", [3, 4, 5, 6, 7])
def test_no_match_leaves_cost_table_and_channels(lib, log, abi):
    lib.set_table(TABLE)
    with lib.open(abi, 8, 1, log) as comm:
        table = costs(7, ALLGATHER)
        for coll, nbytes in ((ALLGATHER, (1 << 20) + 1), (BCAST, 1 << 20), (REDUCESCATTER, 1 << 20), (9, 100)):
            r = comm.get_coll_info(coll, nbytes, table)
            assert r.rc == 0 and r.n_channels == 0 and flat(r.costs) == pytest.approx(flat(table))
    # other topology: the exact (nodes=1, ranks=8) lines do not match 2 nodes x 16 ranks ...
    with lib.open(abi, 16, 2, log) as comm:
        r = comm.get_coll_info(ALLGATHER, 1 << 20, costs(7, ALLGATHER))
        # ... but the any-collective line for 2 nodes / 16 ranks does: protocol only -> cheapest Simple
        assert r.chosen() == (RING, SIMPLE) and r.n_channels == 3
        assert r.costs[TREE][SIMPLE] == pytest.approx(35.5)


def test_unusable_pair_keeps_nccl_choice_and_warns_once(lib, log):
    lib.set_table("allreduce,0,-1,nvls_tree,simple,4,-1,-1\nallgather,0,-1,pat,simple,-1,-1,-1\n")
    with lib.open(4, 8, 1, log) as comm:
        table = costs(7)
        for _ in range(3):
            r = comm.get_coll_info(ALLREDUCE, 1 << 20, table)
            assert flat(r.costs) == pytest.approx(flat(table))  # the -1 entry is not revived
            assert r.chosen() == (NVLS, SIMPLE)  # NCCL's own cheapest stays
            assert r.n_channels == 4  # channels still apply
        assert len([w for w in warnings(log) if "nvls_tree/simple is not usable" in w]) == 1
        # PAT exists only in a 7-row table: with NCCL's 6 algorithms it is unusable
        r = comm.get_coll_info(ALLGATHER, 1 << 20, costs(6, ALLGATHER))
        assert r.chosen() == (RING, LL128)
        r = comm.get_coll_info(ALLGATHER, 1 << 20, costs(7, ALLGATHER))
        assert r.chosen() == (PAT, SIMPLE)


def test_algorithm_only_picks_cheapest_usable_protocol_and_first_match_wins(lib, log):
    lib.set_table("allreduce,0,-1,tree,-1,-1,-1,-1\nallreduce,0,-1,ring,simple,8,-1,-1\n")
    with lib.open(5, 8, 1, log) as comm:
        r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7))
        assert r.chosen() == (TREE, LL128) and r.n_channels == 0


@pytest.mark.parametrize("abi", [3, 4, 5, 6, 7])
def test_pipe_ops_and_reg_buff(lib, log, abi):
    lib.set_table("allreduce,0,-1,tree,simple,2,-1,-1,2,1\nallreduce,0,-1,ring,simple,5,-1,-1,1\n")
    with lib.open(abi, 8, 1, log) as comm:
        r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7), num_pipe_ops=2, reg_buff=1)
        assert r.chosen() == (TREE, SIMPLE) and r.n_channels == 2
        r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7), num_pipe_ops=1, reg_buff=1)
        assert r.chosen() == (RING, SIMPLE) and r.n_channels == 5
        r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7), num_pipe_ops=2, reg_buff=0)
        if abi == 3:  # v3 has no regBuff argument: the field is not matched on
            assert r.n_channels == 2
        else:
            assert r.n_channels == 0 and r.chosen() == (NVLS, SIMPLE)


def test_v2_sets_algorithm_and_protocol_when_supported(lib, log):
    lib.set_table("allreduce,0,1000,collnet_direct,simple,4,-1,-1\nallreduce,1001,-1,ring,ll128,-1,-1,-1\n"
                  "allgather,0,-1,pat,simple,2,-1,-1\nbroadcast,0,-1,tree,-1,3,-1,-1\n")
    with lib.open(2, 8, 1, log) as comm:
        r = comm.get_coll_info(ALLREDUCE, 100, coll_net_support=1)
        assert (r.algo, r.proto, r.n_channels) == (CN_DIRECT, SIMPLE, 4)
        r = comm.get_coll_info(ALLREDUCE, 100, coll_net_support=0)
        assert (r.algo, r.proto, r.n_channels) == (-1, -1, 4)
        r = comm.get_coll_info(ALLREDUCE, 1 << 20)
        assert (r.algo, r.proto, r.n_channels) == (RING, LL128, 0)
        r = comm.get_coll_info(ALLGATHER, 100)  # NCCL 2.21 has no PAT
        assert (r.algo, r.proto, r.n_channels) == (-1, -1, 2)
        r = comm.get_coll_info(BCAST, 100)  # v2 cannot set an algorithm alone
        assert (r.algo, r.proto, r.n_channels) == (-1, -1, 3)
        r = comm.get_coll_info(REDUCE, 100)
        assert (r.algo, r.proto, r.n_channels) == (-1, -1, 0)
    assert any("together only" in w for w in warnings(log))


@pytest.mark.parametrize("abi", [6, 7])
def test_v6_chunk_size(lib, log, abi):
    lib.set_table(TABLE + "allreduce,0,-1,-1,-1,-1,-1,-1,-1,-1,chunk_bytes=131072\n")
    with lib.open(abi, 8, 1, log) as comm:
        assert comm.get_chunk_size(ALLGATHER, 1 << 20, RING, SIMPLE, 2, 2 << 20) == 700416
        assert comm.get_chunk_size(REDUCESCATTER, 4 << 20, RING, SIMPLE, 4, 2 << 20) == 1398784
        # the entry's algorithm is not the one NCCL runs: its chunk does not apply
        assert comm.get_chunk_size(ALLGATHER, 1 << 20, TREE, SIMPLE, 2, 2 << 20) == 2 << 20
        # matched line without chunk_bytes: NCCL's chunk stays
        assert comm.get_chunk_size(ALLREDUCE, 100, TREE, LL, 2, 65536) == 65536
        assert comm.get_chunk_size(BCAST, 100, RING, SIMPLE, 2, 65536) == 65536
    with lib.open(abi, 4, 1, log) as comm:  # other topology: only the wildcard chunk line
        assert comm.get_chunk_size(ALLGATHER, 1 << 20, RING, SIMPLE, 2, 2 << 20) == 2 << 20


def test_live_update_and_back_to_the_file(lib, log, tmp_path, monkeypatch):
    path = tmp_path / "t.csv"
    path.write_text("allreduce,0,-1,ring,simple,4,-1,-1\n")
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
    assert lib.reload() == 1
    comm = lib.open(5, 8, 1, log)
    assert comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7)).n_channels == 4
    assert lib.set_table("allreduce,0,-1,tree,ll,9,-1,-1\nallgather,0,-1,ring,simple,1,-1,-1\n") == 2
    assert lib.entry_count() == 2
    r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7))  # same context sees the new table
    assert (r.n_channels, r.chosen()) == (9, (TREE, LL))
    with lib.open(5, 8, 1, log) as other:  # a new communicator keeps the live table
        assert other.get_coll_info(ALLREDUCE, 1 << 20, costs(7)).n_channels == 9
    assert lib.set_table(None) == 0 and lib.entry_count() == 0
    assert comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7)).n_channels == 0
    assert lib.reload() == 1
    assert comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7)).n_channels == 4
    comm.close()


def test_nvidia_example_format_unchanged(lib, log, tmp_path, monkeypatch):
    # NVIDIA's example-plugin lines: 8, 9 and 10 fields, 4294967295 as "all sizes".
    text = (
        "# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff\n"
        "allreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
        "allreduce,65537,1048576,ring,simple,4,4,32,1,0\n"
        "allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4,-1\n"
        "broadcast,0,32768,tree,simple,-1,1,-1\n"
        "allgather,0,4294967295,ring,simple,4,2,-1\n"
        "reduce,0,4294967295,tree,simple,-1,-1,-1\n"
    )
    path = tmp_path / "nccl_tuner.conf"
    path.write_text(text)
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
    lib.reload()
    entries, warns = parse_table(text)
    assert warns == [] and len(entries) == 6
    with lib.open(4, 32, 4, log) as comm:
        assert lib.entry_count() == 6 and lib.rejected_count() == 0
        r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7), num_pipe_ops=1, reg_buff=0)
        assert r.chosen() == (RING, SIMPLE) and r.n_channels == 4
        r = comm.get_coll_info(ALLREDUCE, 1 << 21, costs(7), num_pipe_ops=4, reg_buff=1)
        assert r.chosen() == (RING, LL128) and r.n_channels == 0
        r = comm.get_coll_info(ALLREDUCE, 1 << 21, costs(7), num_pipe_ops=1)
        assert r.n_channels == 0 and r.chosen() == (NVLS, SIMPLE)  # no line matches: NCCL decides
        assert comm.get_coll_info(ALLGATHER, 1 << 20, costs(7, ALLGATHER)).n_channels == 0  # nNodes 2 only
        r = comm.get_coll_info(REDUCE, 1 << 20, costs(7, REDUCE))
        assert r.chosen() == (TREE, SIMPLE) and r.n_channels == 0


def test_malformed_and_missing_files_mean_nccl_decides_with_one_warning_each(lib, log, tmp_path, monkeypatch):
    path = tmp_path / "bad.csv"
    path.write_bytes(
        b"allreduce,0,-1,ring,simple,4,-1,-1\n"
        b"allreduce,0,-1,ring,simple,4\n"  # line 2: too few fields
        b"allredux,0,-1,ring,simple,4,-1,-1\n"  # line 3: unknown collective
        b"allgather,0,-1,ring,simple,65,-1,-1\n"  # line 4: channels out of range
        b"allgather,0,-1,ring,simple,4,-1,-1,-1,-1,chunk_kb=4\n"  # line 5: unknown field
        b"reduce,0,-1,ri\x00ng,simple,4,-1,-1\n"  # line 6: NUL byte
        b"broadcast,0,-1,tree,ll,1,-1,-1\n"
    )
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(path))
    lib.reload()
    with lib.open(5, 8, 1, log) as comm:
        assert lib.entry_count() == 2 and lib.rejected_count() == 5
        bad_lines = sorted(int(w.split(":")[2]) for w in warnings(log) if "line ignored" in w)
        assert bad_lines == [2, 3, 4, 5, 6]
        assert comm.get_coll_info(ALLREDUCE, 10, costs(7)).n_channels == 4
        assert comm.get_coll_info(ALLGATHER, 10, costs(7, ALLGATHER)).n_channels == 0
        assert comm.get_coll_info(BCAST, 10, costs(7, BCAST)).n_channels == 1
    log.messages.clear()
    monkeypatch.setenv("NCCL_TUNER_CONFIG_FILE", str(tmp_path / "missing.csv"))
    with lib.open(6, 8, 1, log) as comm:
        assert lib.entry_count() == 0
        assert len([w for w in warnings(log) if "missing.csv" in w]) == 1
        r = comm.get_coll_info(ALLREDUCE, 10, costs(7))
        assert r.rc == 0 and r.n_channels == 0 and flat(r.costs) == pytest.approx(flat(costs(7)))
        assert comm.get_chunk_size(ALLREDUCE, 10, RING, SIMPLE, 4, 4096) == 4096


def _random_line(rng: random.Random) -> str:
    pools = [  # (valid, invalid) tokens per positional field
        (["allreduce", "AllGather", "reduce_scatter", "broadcast", "reduce", "-1", "any"], ["alltoall", "", "x"]),
        (["0", "-1", "1", "65536", "+3"], ["18446744073709551616", "-0", "1e3", "-2"]),
        (["-1", "1048576", "4294967295", "18446744073709551615"], ["99999999999999999999999", "12a", ""]),
        (["tree", "Ring", "collnet_direct", "collnetchain", "nvls", "nvls-tree", "PAT", "-1", "any"], ["bogus", ""]),
        (["ll", "LL128", "simple", "-1", "Simple"], ["ll64", "2"]),
        (["-1", "1", "64", "+4"], ["0", "65", "-2", "4.0"]),
        (["-1", "1", "2", "2147483647"], ["0", "-3", "2147483648"]),
        (["-1", "8"], ["0", "x"]),
        (["-1", "1", "4"], ["0", "-5"]),
        (["-1", "0", "1"], ["2", "-2"]),
    ]
    n = rng.choice([8, 8, 9, 10, 10, 10, 7, 11, rng.randrange(0, 14)])
    tokens = [rng.choice(pools[min(i, 9)][rng.random() < 0.04]) for i in range(n)]
    for _ in range(rng.choice([0, 0, 1, 1, 2])):
        tokens.append(rng.choice(["chunk_bytes=65536", "chunk_bytes = -1", "chunk_bytes=0", "chunk_bytes=1073741825",
                                  "foo=1", "="]))
    line = ",".join(tokens)
    if rng.random() < 0.1:
        line += " # trailing comment"
    return line


def test_python_parser_accepts_exactly_what_the_c_plugin_accepts(lib):
    rng = random.Random(1234)
    accepted = 0
    for _ in range(3000):
        line = _random_line(rng)
        try:
            parse_line(line.split("#", 1)[0].strip(" \t\r"))
            py_ok = True
        except ValueError:
            py_ok = False
        c_count = lib.set_table(line)
        assert c_count == int(py_ok), line
        accepted += py_ok
    assert 300 < accepted < 2700  # both outcomes well exercised


def test_table_written_by_python_drives_the_c_plugin_like_python_lookup(lib, log):
    """Random overlapping tables: the C plugin picks what first-match in Python picks."""
    rng = random.Random(7)
    colls = [CollectiveType.ALLREDUCE, CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER]
    entries = []
    for _ in range(300):
        size = 1 << rng.randrange(10, 30)
        collective, min_bytes = rng.choice(colls + [None]), rng.choice([size, None])
        max_bytes = rng.choice([size, size * 4, None])
        algo = rng.choice([Algorithm.RING, Algorithm.TREE, None])
        proto = rng.choice([Protocol.SIMPLE, Protocol.LL128, None])
        channels, nodes = rng.choice([None, 1, 2, 4, 8, 16]), rng.choice([None, 1, 2])
        ranks, pipe_ops = rng.choice([None, 8, 16]), rng.choice([None, None, 1, 2])
        reg_buff, chunk = rng.choice([None, None, 0, 1]), rng.choice([None, 262144, 700416])
        entries.append(PluginEntry(collective, min_bytes, max_bytes, nodes, ranks, pipe_ops, reg_buff,
                                   CommConfig(algo, proto, channels, chunk_bytes=chunk)))
    text = format_table(entries)
    assert parse_table(text) == (entries, [])
    assert lib.set_table(text) == 300
    for abi in (3, 4, 6):
        for ranks, nodes in ((8, 1), (16, 2)):
            with lib.open(abi, ranks, nodes, log) as comm:
                for _ in range(300):
                    coll = rng.choice(colls)
                    nbytes = 1 << rng.randrange(10, 32)
                    pipe, reg = rng.choice([1, 2, 3]), rng.choice([0, 1])
                    want = lookup(entries, coll, nbytes, nodes, ranks, pipe, None if abi == 3 else reg)
                    r = comm.get_coll_info(coll.nccl_func, nbytes, costs(7, coll.nccl_func), num_pipe_ops=pipe,
                                           reg_buff=reg)
                    assert r.n_channels == ((want.settings.channels or 0) if want else 0)
                    if abi < 6:
                        continue
                    chunk = comm.get_chunk_size(coll.nccl_func, nbytes, RING, SIMPLE, 4, 12345)
                    first = lookup(entries, coll, nbytes, nodes, ranks)  # pipeOps/regBuff not passed here
                    expect = 12345
                    s = first.settings if first else None
                    if s and s.chunk_bytes and s.algorithm in (None, Algorithm.RING) and \
                            s.protocol in (None, Protocol.SIMPLE):
                        expect = s.chunk_bytes
                    assert chunk == expect


def test_concurrent_communicators_see_whole_tables_during_live_swaps(lib):
    """Reader threads (ctypes drops the GIL) never see a half-replaced table."""
    a = "allreduce,0,-1,ring,simple,3,-1,-1\n" * 50
    b = "allreduce,0,-1,tree,ll,7,-1,-1\n" + "allgather,0,-1,ring,simple,1,-1,-1\n" * 500
    lib.set_table(a)
    allowed = {(3, (RING, SIMPLE)), (7, (TREE, LL))}
    seen: set = set()
    errors: list = []
    stop = threading.Event()

    def reader(abi: int) -> None:
        with lib.open(abi, 8, 1) as comm:
            while not stop.is_set():
                r = comm.get_coll_info(ALLREDUCE, 1 << 20, costs(7))
                got = (r.n_channels, r.chosen())
                seen.add(got)
                if got not in allowed:
                    errors.append(got)

    threads = [threading.Thread(target=reader, args=(abi,)) for abi in (3, 4, 5, 6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    i = 0
    while (i < 400 or seen != allowed) and time.monotonic() < deadline:  # a loaded machine may start readers late
        assert lib.set_table(b if i % 2 else a) == (501 if i % 2 else 50)
        i += 1
    stop.set()
    for t in threads:
        t.join()
    assert errors == [] and seen == allowed


def test_entry_call_counts_say_which_line_answered_each_call(lib, log, tmp_path):
    """Per-entry counters: getCollInfo and getChunkSize calls each line answered; zero for each new table."""
    text = ("allreduce,0,65535,tree,ll,2,-1,-1\n"  # entry 0
            "# a comment and a rejected line do not take an index\n"
            "allreduce,0,-1,bogus,simple,4,-1,-1\n"
            "allreduce,65536,-1,ring,simple,4,1,8,-1,-1,chunk_bytes=131072\n"  # entry 1
            "allgather,0,-1,ring,simple,1,2,16\n")  # entry 2: another shape, never matched here
    assert lib.set_table(text) == 3
    first = lib.table_generation()
    assert lib.entry_call_counts() == [0, 0, 0]
    rng = random.Random(5)
    want_coll, want_chunk = [0, 0, 0], [0, 0, 0]
    for abi in (2, 3, 4, 5, 6):
        with lib.open(abi, 8, 1, log) as comm:
            for _ in range(40):
                coll = rng.choice([ALLREDUCE, ALLGATHER, BCAST])
                nbytes = rng.choice([100, 65535, 65536, 1 << 24])
                comm.get_coll_info(coll, nbytes, costs(7, coll))
                index = None if coll != ALLREDUCE else (0 if nbytes < 65536 else 1)
                if index is not None:
                    want_coll[index] += 1
                if abi == 6:
                    chunk = comm.get_chunk_size(coll, nbytes, RING, SIMPLE, 4, 4096)
                    assert chunk == (131072 if index == 1 else 4096)
                    if index is not None:  # counted when the line matched, chunk set or not
                        want_chunk[index] += 1
    calls = lib.entry_calls()
    assert calls.coll_info == want_coll and calls.chunk_size == want_chunk and calls.generation == first
    assert lib.entry_call_counts() == want_coll and min(want_coll[:2]) > 10 and min(want_chunk[:2]) > 0
    lib.reset_entry_call_counts()
    assert lib.entry_calls().coll_info == [0, 0, 0] and lib.entry_calls().chunk_size == [0, 0, 0]
    with lib.open(4, 8, 1, log) as comm:
        comm.get_coll_info(ALLREDUCE, 10, costs(7))
    assert lib.entry_call_counts() == [1, 0, 0]
    assert lib.set_table(text) == 3 and lib.entry_call_counts() == [0, 0, 0]  # a new table starts at zero
    assert lib.table_generation() == first + 1
    path = tmp_path / "t.csv"
    path.write_text("allreduce,0,-1,ring,simple,4,-1,-1\n")
    assert lib.load_file(path) == 1 and lib.entry_call_counts() == [0] and lib.table_generation() == first + 2
    assert lib.set_table(None) == 0 and lib.entry_call_counts() == []


def test_a_table_too_long_to_scan_fast_is_said_once_and_still_fully_used(lib, log):
    lines = [f"allreduce,{i},{i},ring,simple,{1 + i % 64},-1,-1" for i in range(2500)]
    lines.append("allgather,0,-1,tree,ll,2,-1,-1")
    with lib.open(4, 8, 1, log):  # the live API warns through the latest communicator's logger
        assert lib.set_table("\n".join(lines)) == 2501
        said = [w for w in warnings(log) if "scans them" in w]
        assert len(said) == 1 and "2500 lines can match allreduce calls" in said[0]
    with lib.open(4, 8, 1, log) as comm:
        assert comm.get_coll_info(ALLREDUCE, 2499, costs(7)).n_channels == 1 + 2499 % 64  # the last line answers
        assert comm.get_coll_info(ALLREDUCE, 2500, costs(7)).n_channels == 0
    assert lib.set_table("\n".join(lines[:1000])) == 1000
    assert len([w for w in warnings(log) if "scans them" in w]) == 1  # a short table says nothing
