"""The trace-reader interface (traces.reader) on real traces: the reader it picks, its whole read
against its two-round read (what lagom.orchestration.rank_pool runs on workers), and the errors for paths no
reader claims, which stay the one-line errors of the Kineto reader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nccl_env.errors import LagomError
from traces.reader import ReadTrace, job_layout, read_trace, reader_for, readers, scan_trace_file, trace_files

DATA = Path(__file__).resolve().parent / "data"
W128 = [DATA / "w128_sendrecv_rank0.json.gz", DATA / "w128_sendrecv_rank1.json.gz"]


@pytest.fixture
def two_ranks(tmp_path: Path) -> Path:
    for f in W128:
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


def test_kineto_reads_a_file_and_a_folder_and_nothing_else(two_ranks, tmp_path):
    assert [r.name for r in readers()] == ["kineto"]
    assert reader_for(W128[0]).can_read(W128[0]) and reader_for(two_ranks).can_read(two_ranks)
    other = tmp_path / "notes.txt"
    other.write_text("not a trace")
    assert not readers()[0].can_read(other)
    assert not readers()[0].can_read(tmp_path / "missing.json")


def test_a_read_gives_every_rank_with_its_graph_and_metadata(two_ranks):
    read = reader_for(two_ranks).read(two_ranks)
    assert isinstance(read, ReadTrace) and read.reader == "kineto"
    assert [f.name for f in read.files] == [f.name for f in W128]
    assert [w.rank for w in read.workloads] == [0, 1] and read.lowest.rank == 0
    for w in read.workloads:
        assert w.exec_graph is not None and w.collectives and w.world_size >= 2
        assert w.exec_graph.comm_wait_us  # the waits were found across the two ranks


def test_the_two_rounds_give_the_whole_read(two_ranks):
    """scan each file, lay the job out from the headers, build each rank: what rank_pool does."""
    files = trace_files(two_ranks)
    scanned = [scan_trace_file(f) for f in files]
    layout = job_layout([s.header() for s in scanned], two_ranks)
    built = sorted((s.build_rank(layout, i) for i, s in enumerate(scanned)), key=lambda w: w.rank)
    whole = read_trace(two_ranks)
    # the waits are attached by the caller after the second round (rank_pool.read_lowest_rank)
    for w in (*built, *whole):
        assert w.exec_graph is not None
        w.exec_graph.comm_wait_us, w.exec_graph.wait_basis = {}, ""
    assert [repr(w) for w in built] == [repr(w) for w in whole]
    assert sum(len(w.collectives) for w in built) > 10


@pytest.mark.parametrize("make, message", [
    (lambda d: "", "an empty path: give a trace file or a folder of trace files"),
    (lambda d: d / "missing", "no such file or directory"),
    (lambda d: d, "directory holds no .json or .json.gz trace files"),
])
def test_paths_no_reader_claims_get_one_line(tmp_path, make, message):
    with pytest.raises(LagomError, match=message):
        read_trace(make(tmp_path))
    with pytest.raises(LagomError, match=message):
        trace_files(make(tmp_path))


def test_a_file_of_another_kind_is_named_by_the_fallback(tmp_path):
    other = tmp_path / "notes.txt"
    other.write_text("not a trace")
    assert reader_for(other).name == "kineto"
    with pytest.raises(LagomError, match="notes.txt"):
        read_trace(other)
