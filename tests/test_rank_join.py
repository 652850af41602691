"""Matching collectives across ranks and aligning the ranks' clocks (traces.rank_join, issue 26).

Judged on tests/kineto_ranks.py's jobs, whose hosts' clocks are off by known amounts and
whose every wait is known from the simulation, and on the two shared ranks of a 128-rank job.
"""

from __future__ import annotations

import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path

import kineto_ranks as kr
import pytest
from conftest import trace_path

from lagom.cli import main
from traces.comm_split import UNRECORDED, rank_comm
from traces.kineto import read_trace
from traces.rank_join import join_ranks
from traces.workload_io import load_workload, save_workload


def read_job(folder: Path):
    workloads = read_trace(folder)
    return workloads, join_ranks([rank_comm(w) for w in workloads])


@pytest.mark.parametrize("name", list(kr.PROGRAMS))
def test_offsets_and_waits_are_the_true_ones(name: str, tmp_path: Path) -> None:
    p = kr.PROGRAMS[name]
    runs = kr.simulate(p)
    workloads, joined = read_job(kr.write_ranks(p, runs, tmp_path / name))
    stage = {p.global_rank(i): i for i in range(p.ranks)}  # a file's rank -> the generator's index
    true_offsets = {r: p.offsets_us[0] - p.offsets_us[i] for r, i in stage.items()}
    assert set(joined.alignment.offsets_us) == set(stage)
    for r, off in joined.alignment.offsets_us.items():
        assert off == pytest.approx(true_offsets[r], abs=0.5), (r, joined.alignment)
    assert joined.alignment.residual_us < 0.5
    assert joined.modelled_members == 0
    for w in workloads:
        # the reader's collectives in start order are the simulation's, in the window
        run = runs[stage[w.rank]]
        true = sorted(((s, key) for key, s in _starts(run).items()))
        first_in = next(i for i, (s, _) in enumerate(true) if s >= run.schedule.window[0] - 1e-6)
        # (kernels of two streams that start at once, after one compute kernel: by group and Seq, as true)
        ops = sorted(w.collectives, key=lambda c: (c.start_us, c.group, c.p2p.seq if c.p2p and c.p2p.seq else 0))
        found = [joined.wait_us[w.rank][c.op_id] for c in ops]
        expected = [run.waits_us[key] for _, key in true[first_in:first_in + len(ops)]]
        assert len(found) == len(expected)
        assert max(abs(a - b) for a, b in zip(found, expected)) < 1.0, w.rank


def _starts(run: kr.RankRun) -> dict[tuple[str, int], float]:
    out = {}
    for op in run.schedule.ops:
        if op.work.comm_args is not None:
            out[(str(op.work.comm_args["Process Group Name"]), int(op.work.comm_args["Seq"]))] = op.start_us
    return out


def test_the_straggler_is_named_and_waits_for_nobody(tmp_path: Path, capsys) -> None:
    p = kr.PROGRAMS["straggler"]
    folder = kr.write_ranks(p, kr.simulate(p), tmp_path / "s")
    assert main(["analyze", str(folder), "--json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["ranks"]
    slow = p.slow.index(max(p.slow))
    for r in ranks:
        row = r["wait_transfer"][0]
        if r["rank"] == slow:
            assert row["wait_us"] == pytest.approx(0.0, abs=1.0) and row["waited_for"] == "-"
        else:
            assert row["wait_us"] > 0.2 * row["total_us"]
            assert row["waited_for"].startswith(f"rank {slow} ")
        assert row["transfer_per_call_us"] == pytest.approx(p.comm_us, rel=0.1)
        assert r["clock"]["offset_us"] == pytest.approx(p.offsets_us[0] - p.offsets_us[r["rank"]], abs=0.5)


def test_two_of_128_ranks_model_the_rest(tmp_path: Path) -> None:
    for r in (0, 1):
        shutil.copy(trace_path(f"w128_sendrecv_rank{r}.json.gz"), tmp_path)
    workloads, joined = read_job(tmp_path)
    assert joined.alignment.matched >= 3  # the collectives both ranks kept (the traces were sampled)
    assert abs(joined.alignment.offsets_us[1]) < 1000.0  # hosts of one job: within a millisecond
    assert joined.modelled_members >= 126 * len(joined.matches)
    assert any(who == UNRECORDED for r in (0, 1) for who in joined.waited_for[r].values())
    for w in workloads:
        for c in w.collectives:
            assert 0.0 <= joined.wait_us[w.rank][c.op_id] <= c.duration_us


def _neighbours(p: kr.RankProgram, stage: int) -> set[tuple[int, int]]:
    """A pipeline stage's send/recv ends as global ranks: to and from each neighbour stage."""
    g = p.global_rank
    out = set()
    for other in (stage - 1, stage + 1):
        if 0 <= other < p.ranks:
            out |= {(g(stage), g(other)), (g(other), g(stage))}
    return out


@pytest.mark.parametrize("stage_ranks, world, listed", [
    ((), 0, "[0, 1]"), ((0, 8, 16, 24), 32, "[0, 8, 16, 24]"), ((0, 2, 4, 6), 8, "[0, 2, 4, 6]"),
    ((0, 1, 3, 7), 8, "[]")], ids=["pairs", "stride8-of-32", "stride2-of-8", "uneven-of-8"])
def test_send_recv_peers_as_pytorch_writes_them(stage_ranks, world, listed, tmp_path: Path) -> None:
    """Issue 32: PyTorch 2.5+ writes a send's Dst Rank / a recv's Src Rank as the peer's GLOBAL
    rank, for evenly spaced groups only; ``Rank`` is the peer's rank in its group; a group not
    evenly spaced lists no ranks ("[]") and names no global peer: its peer is ``Rank`` through
    pg_config's ranks. Read as ranks in the group, [0, 8, 16, 24]'s send 0 -> 8 was out of range
    and [0, 2, 4, 6]'s send 0 -> 2 read as 0 -> 4."""
    p = replace(kr.PROGRAMS["pipeline_1f1b"], stage_ranks=stage_ranks, world=world)
    folder = kr.write_ranks(p, kr.simulate(p), tmp_path / "p")
    first = json.loads(gzip.decompress(sorted(folder.glob("*.json.gz"))[0].read_bytes()))  # rank 0
    written = [e["args"] for e in first["traceEvents"] if e.get("cat") == "kernel" and "Seq" in e["args"]]
    assert {a["Process Group Ranks"] for a in written} == {listed}
    assert all(("Dst Rank" in a or "Src Rank" in a) == (listed != "[]") for a in written)
    workloads, joined = read_job(folder)
    assert [w.rank for w in workloads] == [p.global_rank(i) for i in range(p.ranks)]
    for i, w in enumerate(workloads):
        assert w.input_warnings == []
        assert {(c.p2p.src, c.p2p.dst) for c in w.collectives if c.p2p} == _neighbours(p, i)
        assert all(c.p2p is not None for c in w.collectives)
    assert joined.modelled_members == 0 and all(len(m.members) == 2 for m in joined.matches)


def test_a_group_list_cut_short_is_no_list() -> None:
    """PyTorch writes a group of more than 30 ranks as its first 30 and "..." (util.cpp
    format_list): not the group's members (a 30-rank group), so the reader takes pg_config's."""
    from traces.kineto_comm import parse_ranks

    cut = "[" + ", ".join(str(8 * i) for i in range(30)) + ", ...]"
    assert parse_ranks(cut) == () and parse_ranks("[]") == () and parse_ranks("[0, 8, 16, 24]") == (0, 8, 16, 24)


def _rewrite(path: Path, change) -> None:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        if "Seq" in e.get("args", {}):
            change(e["args"])
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize("change, named", [
    (lambda a: a.update({"Dst Rank": 9}) if "Dst Rank" in a else None, "peer Dst Rank 9: outside the world of 4"),
    (lambda a: a.update({"Dst Rank": 3}) if "Dst Rank" in a else None, "peer Dst Rank 3: not a peer of rank 1"),
    (lambda a: a.update({"Rank": 5, "Process Group Ranks": "[]"}) if a.pop("Dst Rank", None) is not None else None,
     "peer Rank 5: not a rank of its 2-rank group"),
], ids=["outside-the-world", "outside-the-group", "outside-the-group-rank"])
def test_a_peer_that_cannot_be_is_one_warning_naming_it(change, named: str, tmp_path: Path, capsys) -> None:
    """A send whose peer is outside the world or its group: one warning line naming the peer
    (each analysed rank's, on stderr), the op left unpaired; before, silently "0 matched"."""
    p = kr.PROGRAMS["pipeline_1f1b"]
    folder = kr.write_ranks(p, kr.simulate(p), tmp_path / "p")
    _rewrite(folder / "pipeline_1f1b_rank1.json.gz", change)
    workloads = read_trace(folder)
    lines = workloads[1].input_warnings
    assert len(lines) == 1 and named in lines[0] and "'pp01' [0, 1], 'pp12' [1, 2]" in lines[0], lines
    assert [w.input_warnings for w in workloads if w.rank != 1] == [[], [], []]
    assert sum(c.p2p is None for c in workloads[1].collectives) == int(lines[0].split(": ")[1].split()[0])
    assert main(["analyze", str(folder)]) == 0
    assert named in capsys.readouterr().err


@pytest.mark.slow
def test_simulate_a_folder_names_a_peer_outside_the_world(tmp_path: Path, capsys) -> None:
    """The joint replay of a folder whose rank 1 names a peer outside the world: the warning of
    that rank's file is printed too (not only the lowest rank's)."""
    p = kr.PROGRAMS["pipeline_1f1b"]
    folder = kr.write_ranks(p, kr.simulate(p), tmp_path / "p")
    _rewrite(folder / "pipeline_1f1b_rank1.json.gz", lambda a: a.update({"Dst Rank": 9}) if "Dst Rank" in a else None)
    assert main(["simulate", str(folder), "--json"]) == 0
    err = capsys.readouterr().err
    assert "pipeline_1f1b_rank1.json.gz: 48 send/recv name peer Dst Rank 9: outside the world of 4 ranks" in err


GLOO_DDP = Path(__file__).parent / "data" / "gloo_ddp_w2"


def test_a_gloo_jobs_collectives_are_matched_by_order() -> None:
    """A gloo job's all-reduces are CPU-side ops whose ends do not line up across ranks: the
    joint replay's view (``cpu_job``) matches each rank's k-th all-reduce with the other's,
    sizes agreeing; the wait/transfer split's view keeps NCCL's kernels only (none here)."""
    workloads = read_trace(GLOO_DDP)
    assert all(not c.on_gpu for w in workloads for c in w.collectives)
    assert join_ranks([rank_comm(w) for w in workloads]).matches == []
    joined = join_ranks([rank_comm(w, cpu_job=True) for w in workloads])
    by_rank = {w.rank: {c.op_id: c for c in w.collectives} for w in workloads}
    assert len(joined.matches) == len(workloads[0].collectives) == 10
    for k, m in enumerate(sorted(joined.matches, key=lambda m: m.members[0][1])):
        assert [r for r, _ in m.members] == [0, 1] and m.modelled == 0
        sizes = {by_rank[r][op].message_bytes for r, op in m.members}
        assert len(sizes) == 1 and [op for _, op in m.members] == [k, k]
    assert joined.alignment.matched == 10


def test_a_send_meets_the_recv_from_its_sender_in_a_group_of_four(tmp_path: Path) -> None:
    """The pipeline's send/recv in the global group: the reader keeps each one's ends (Kineto's
    Dst Rank on a send, Src Rank on a recv, ranks in the group) and its Seq, through the
    workload file too; every match is one send and the recv of the same (src, dst) on the peer."""
    p = kr.PROGRAMS["pipeline_world"]
    workloads, joined = read_job(kr.write_ranks(p, kr.simulate(p), tmp_path / "p"))
    by_op = {(w.rank, c.op_id): c for w in workloads for c in w.collectives}
    for w in workloads:
        path = tmp_path / f"w{w.rank}.json"
        save_workload(w, path)
        assert [c.p2p for c in load_workload(path).collectives] == [c.p2p for c in w.collectives]
        assert all(c.p2p is not None and c.p2p.seq is not None for c in w.collectives)
    pairs = [m for m in joined.matches if len(m.members) == 2]
    assert len(pairs) > 20 and all(m.group_size == 2 and m.modelled == 0 for m in joined.matches)
    for m in pairs:
        (ra, a), (rb, b) = m.members
        ends, other = by_op[(ra, a)].p2p, by_op[(rb, b)].p2p
        assert ends is not None and other is not None
        assert (ends.src, ends.dst) == (other.src, other.dst) and {ra, rb} == {ends.src, ends.dst}


def test_the_cluster_bounds_the_transfer_only_where_the_pattern_is_thin(tmp_path: Path) -> None:
    """With members of a group unrecorded, their arrival is read from a key's instances on a
    rank; with fewer than MIN_PATTERN_INSTANCES (one, on the w128 pair) the read calls the whole
    time transfer. A transfer floor (the cluster's least time) bounds those, and only those."""
    from traces.rank_join import MIN_PATTERN_INSTANCES

    p = kr.PROGRAMS["straggler"]
    whole = kr.write_ranks(p, kr.simulate(p), tmp_path / "s")
    half = tmp_path / "half"
    half.mkdir()
    for r in (0, 1):  # two of four ranks: every all-reduce partly recorded, 15 instances a rank
        shutil.copy(whole / f"{p.name}_rank{r}.json.gz", half)
    workloads = read_trace(half)
    comms = [rank_comm(w) for w in workloads]
    assert min(len(i.op_ids) for c in comms for i in c.keys.values()) >= MIN_PATTERN_INSTANCES
    floor_us = 1.0
    plain, bounded = join_ranks(comms, 4), join_ranks(comms, 4, lambda key, size: floor_us)
    assert plain.modelled_members > 0 and bounded.bounded_members == 0 and bounded.wait_us == plain.wait_us

    for r in (0, 1):
        shutil.copy(trace_path(f"w128_sendrecv_rank{r}.json.gz"), tmp_path)
    workloads = read_trace(tmp_path)
    comms = [rank_comm(w) for w in workloads]
    plain = join_ranks(comms, 128)
    asked: list[tuple] = []

    def floor(key, size: int) -> float:
        asked.append((key, size))
        return 100.0

    bounded = join_ranks(comms, 128, floor)
    assert all(size == 128 for _, size in asked) and len(asked) == len({k for k, _ in asked})  # once per key
    small = next(c for c in workloads[0].collectives if c.message_bytes == 3072)
    assert plain.wait_us[0][small.op_id] == 0.0  # the whole 30.7 ms was "transfer"
    assert bounded.wait_us[0][small.op_id] == pytest.approx(small.duration_us - 100.0)
    assert bounded.waited_for[0][small.op_id] == UNRECORDED
    assert bounded.bounded_members == sum(len(c.collectives) for c in workloads) == 20
    for w in workloads:
        for c in w.collectives:  # the bound only ever moves time from transfer to wait
            assert plain.wait_us[w.rank][c.op_id] <= bounded.wait_us[w.rank][c.op_id] <= c.duration_us
