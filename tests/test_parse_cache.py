"""Traces parsed once (traces/parse_cache.py): the next command reuses a parse while the file is the
same, reads a changed, touched or truncated file again, and never unpickles what another user could
have written."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from kineto_builder import write_rank_copies

from nccl_env.errors import LagomError
from traces import parse_cache
from traces.kineto import parse_trace_file
from traces.reader import read_trace
from traces.trace_job import job_layout

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "traces" / "examples" / "a100_w2_allreduce_broadcast.json.gz"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LAGOM_TRACE_CACHE", raising=False)
    monkeypatch.setattr(parse_cache, "STATS", parse_cache.CacheStats())
    return tmp_path / "cache"


@pytest.fixture
def trace(tmp_path) -> Path:
    out = tmp_path / "t" / "rank0.json.gz"
    out.parent.mkdir()
    shutil.copyfile(EXAMPLE, out)
    return out


def _entries(cache: Path, every: bool = False) -> list[Path]:
    """The cache's parses (``every``: and what is kept beside them)."""
    folder = cache / f"traces-{os.geteuid()}"
    return sorted(folder.glob("*.parse")) + (sorted(folder.glob("*.derived")) if every else [])


def test_second_read_is_the_cached_parse_and_gives_the_same_workload(cache, trace):
    first = read_trace(trace)
    assert (parse_cache.STATS.misses, parse_cache.STATS.hits, parse_cache.STATS.stored) == (1, 0, 1)
    second = read_trace(trace)
    assert parse_cache.STATS.hits == 1
    assert len(first) == len(second) == 1
    a, b = first[0], second[0]
    assert [(o.name, o.start_us, o.duration_us) for o in a.compute_ops] == \
           [(o.name, o.start_us, o.duration_us) for o in b.compute_ops]
    assert [(c.message_bytes, c.duration_us) for c in a.collectives] == \
           [(c.message_bytes, c.duration_us) for c in b.collectives]
    folder = cache / f"traces-{os.geteuid()}"
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert oct((folder / "key").stat().st_mode & 0o777) == oct(0o600)


def test_touched_changed_or_truncated_file_is_read_again(cache, trace):
    read_trace(trace)
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    read_trace(trace)
    assert (parse_cache.STATS.misses, parse_cache.STATS.hits) == (2, 0)
    raw = gzip.decompress(trace.read_bytes())
    trace.write_bytes(gzip.compress(raw[: len(raw) // 2]))  # truncated: the reader's own error, not a stale parse
    with pytest.raises(LagomError):
        read_trace(trace)
    assert parse_cache.STATS.hits == 0


def test_entry_others_could_write_or_tampered_is_never_used(cache, trace):
    read_trace(trace)
    kept = _entries(cache, every=True)  # the parse, its header and the rank built from it
    assert len(kept) == 3
    for entry in kept:
        entry.chmod(0o666)  # writable by others: not trusted
    read_trace(trace)
    assert parse_cache.STATS.hits == 0 and parse_cache.STATS.derived_hits == 0
    for entry in _entries(cache, every=True):
        assert entry.stat().st_mode & 0o022 == 0  # replaced by fresh, private entries
        data = bytearray(entry.read_bytes())
        data[-10] ^= 0xFF  # bytes changed behind the HMAC's back
        entry.write_bytes(bytes(data))
    read_trace(trace)
    assert parse_cache.STATS.hits == 0 and parse_cache.STATS.misses == 3 and parse_cache.STATS.derived_hits == 0


def test_shared_cache_folder_not_private_is_not_used(cache, trace):
    folder = cache / f"traces-{os.geteuid()}"
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    read_trace(trace)
    read_trace(trace)
    assert parse_cache.STATS.hits == 0 and not _entries(cache)


def test_off_and_the_bound(cache, trace, monkeypatch):
    monkeypatch.setenv("LAGOM_TRACE_CACHE", "off")
    read_trace(trace)
    assert not (cache / f"traces-{os.geteuid()}").exists()
    monkeypatch.delenv("LAGOM_TRACE_CACHE")
    monkeypatch.setenv("LAGOM_TRACE_CACHE_BYTES", "1000")  # smaller than one entry: nothing stays
    read_trace(trace)
    assert parse_cache.STATS.stored == 1 and not _entries(cache)


def test_doctor_says_where_and_how_large(cache, trace):
    read_trace(trace)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAGOM_CACHE_DIR": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "lagom", "doctor", "--json"], capture_output=True, text=True,
                          env=env, timeout=120)
    import json

    data = json.loads(proc.stdout)["trace_cache"]
    assert data["folder"] == str(cache / f"traces-{os.geteuid()}") and data["bytes"] > 0
    assert data["entries"] == 3  # the parse, its header, the rank built


def test_built_rank_is_kept_and_built_again_when_the_file_or_the_code_changes(cache, trace, monkeypatch):
    """A rank's Workload built from a kept parse is kept beside it: the next read of the same file
    takes it, the same to the last byte; a touched file, or another builder's code, builds it again."""
    stats = parse_cache.STATS
    first = read_trace(trace)
    assert (stats.derived_misses, stats.derived_hits, stats.derived_stored) == (2, 0, 2)  # its header, the rank
    assert read_trace(trace) == first  # every field, every op, the graph
    assert (stats.hits, stats.derived_hits) == (1, 1)  # the header beside the parse, the rank: no records read
    st = trace.stat()
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert read_trace(trace) == first
    assert (stats.misses, stats.derived_misses, stats.derived_hits) == (2, 4, 1)
    monkeypatch.setattr(parse_cache, "_fingerprint", "another reader or builder")  # what changed code gives
    read_trace(trace)
    assert (stats.misses, stats.derived_misses, stats.derived_hits) == (3, 6, 1)
    hashed = {f"{p.parent.name}/{p.name}" for p in parse_cache.fingerprint_sources()}
    assert {"traces/kineto.py", "traces/exec_graph_build.py", "nccl_env/knobs.py"} <= hashed  # the builder's code


def test_built_rank_is_per_layout(cache, tmp_path, monkeypatch):
    """The same kept parse built in another job layout (here: its folder lost the earlier rank, so the
    shared origin moved) is built again, not taken from the first layout's entry."""
    folder = tmp_path / "job"
    rank0, rank1 = write_rank_copies(EXAMPLE, 2, folder, shift_us=500.0)
    both = {w.rank: w for w in read_trace(folder)}
    rank0.unlink()
    (alone,) = read_trace(folder)
    assert parse_cache.STATS.hits == 1 and parse_cache.STATS.derived_hits == 0  # rank1's parse, a new build
    assert alone.compute_ops[0].start_us == pytest.approx(both[1].compute_ops[0].start_us - 500.0)
    monkeypatch.setenv("LAGOM_TRACE_CACHE", "off")
    assert [alone] == read_trace(folder)  # what reading it afresh gives


def test_a_worker_spills_the_entry_name_and_builds_from_it(cache, trace):
    """Between a folder read's two rounds a worker spills where the cache keeps the parse (its name and
    header), not a copy of the records; built from that, the rank is the one the records give, the
    records read back only when the build is not kept too, and parsed again if the entry went."""
    parsed = parse_trace_file(trace)
    kept = parsed.kept()
    assert kept is not parsed and kept.header() == parsed.header()
    assert len(pickle.dumps(kept)) * 100 < len(pickle.dumps(parsed))
    layout = job_layout([kept.header()], trace)
    first = kept.build_rank(layout, 0)  # no build kept yet: the records from the entry
    assert (parse_cache.STATS.derived_misses, parse_cache.STATS.misses) == (1, 1)
    for entry in (cache / f"traces-{os.geteuid()}").iterdir():
        if entry.suffix in (".parse", ".derived"):
            entry.unlink()  # evicted meanwhile: the file is parsed again (the same file)
    assert kept.build_rank(layout, 0) == first == parse_trace_file(trace).build_rank(layout, 0)
    assert parse_cache.STATS.misses == 2 and parse_cache.STATS.derived_hits == 1
    for entry in (cache / f"traces-{os.geteuid()}").glob("*.parse"):
        entry.unlink()
    os.utime(trace, ns=(trace.stat().st_atime_ns, trace.stat().st_mtime_ns + 1_000_000))  # and changed
    with pytest.raises(LagomError, match="changed while it was read"):
        pickle.loads(pickle.dumps(kept)).build_rank(replace(layout, world_size=layout.world_size + 1), 0)


def test_a_folder_the_cache_keeps_whole_is_read_without_workers(cache, tmp_path):
    """``--executor process``: a folder whose every header and every rank's build the cache keeps is
    read in this process (nothing to parse or build: a pool's start and hand-over would cost more),
    the same ranks; a touched file, or a layout whose builds are not kept, goes to the workers again."""
    from lagom.args.rank_args import ExecutorKind, RankReading
    from lagom.orchestration.rank_pool import RankPool, _whole_workload

    folder = tmp_path / "job"
    files = write_rank_copies(EXAMPLE, 3, folder, shift_us=500.0)

    def read() -> tuple[bool, list]:
        with RankPool(RankReading(ExecutorKind.PROCESS, 2)) as pool:
            job = pool.read_job(folder, _whole_workload)
            return pool._pool is not None, job.values

    workers, first = read()
    assert workers
    workers, again = read()
    assert not workers and again == first
    os.utime(files[1], ns=(files[1].stat().st_atime_ns, files[1].stat().st_mtime_ns + 1_000_000))
    workers, touched = read()
    assert workers and touched == first
    files[0].unlink()  # the other files' headers are kept, their builds in the new layout are not
    assert read()[0]


def test_workers_keep_parses_where_the_process_looks_now(tmp_path, monkeypatch):
    """A pool's workers fork from a server that has the environment of when it started: the cache
    folder the process names now (here changed after a first pool) is where they keep what they read,
    so the second read finds every rank kept and needs no workers."""
    from lagom.args.rank_args import ExecutorKind, RankReading
    from lagom.orchestration.rank_pool import RankPool, _whole_workload

    def read(folder: Path) -> bool:
        with RankPool(RankReading(ExecutorKind.PROCESS, 2)) as pool:
            pool.read_job(folder, _whole_workload)
            return pool._pool is not None

    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path / "before"))
    assert read(write_rank_copies(EXAMPLE, 3, tmp_path / "a", shift_us=500.0)[0].parent)  # the server starts
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path / "after"))
    folder = write_rank_copies(EXAMPLE, 3, tmp_path / "b", shift_us=500.0)[0].parent
    assert read(folder)
    assert _entries(tmp_path / "after")
    assert not read(folder)  # all kept where this process looks
