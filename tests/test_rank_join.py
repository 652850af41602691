"""Matching collectives across ranks and aligning the ranks' clocks (traces.rank_join, issue 26).

Judged on tests/kineto_ranks.py's jobs, whose hosts' clocks are off by known amounts and
whose every wait is known from the simulation, and on the two shared ranks of a 128-rank job.
"""

from __future__ import annotations

import json
import shutil
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
    true_offsets = {r: p.offsets_us[0] - p.offsets_us[r] for r in range(p.ranks)}
    for r, off in joined.alignment.offsets_us.items():
        assert off == pytest.approx(true_offsets[r], abs=0.5), (r, joined.alignment)
    assert joined.alignment.residual_us < 0.5
    assert joined.modelled_members == 0
    for w in workloads:
        # the reader's collectives in start order are the simulation's, in the window
        true = sorted(((s, key) for key, s in _starts(runs[w.rank]).items()))
        first_in = next(i for i, (s, _) in enumerate(true) if s >= runs[w.rank].schedule.window[0] - 1e-6)
        ops = sorted(w.collectives, key=lambda c: c.start_us)
        found = [joined.wait_us[w.rank][c.op_id] for c in ops]
        expected = [runs[w.rank].waits_us[key] for _, key in true[first_in:first_in + len(ops)]]
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
