"""A folder's ranks read on worker processes or a Dask cluster (lagom.orchestration.rank_pool) give exactly what
reading them in this process gives; a bad file is the same one line; Ctrl-C stops the pool.

Folders: the w128 pair (two real ranks of one job) and copies of a real trace rewritten as the
distinct ranks of one job, each copy's times moved a little later than the previous one, so
the ranks wait for each other and the wait/transfer split has something to split.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from conftest import REPO_ROOT, trace_path
from kineto_builder import write_rank_copies

from lagom.args.rank_args import ExecutorKind, RankReading
from lagom.cli import main
from lagom.orchestration.rank_pool import LOCAL_SCHEDULER, read_lowest_rank
from lagom.orchestration.workload_arg import read_workload_arg
from traces.comm_split import rank_comm
from traces.exec_graph import WAIT_BASIS_RANKS
from traces.kineto import read_trace
from traces.rank_join import join_ranks

SHIFT_US = 7.25  # each copy's times, later than the previous copy's


@pytest.fixture(scope="module")
def w128_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("w128")
    for name in ("w128_sendrecv_rank0.json.gz", "w128_sendrecv_rank1.json.gz"):
        shutil.copy(trace_path(name), folder / name)
    return folder


@pytest.fixture(scope="module")
def copies_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("copies")
    write_rank_copies(trace_path("w128_sendrecv_rank0.json.gz"), 6, folder, shift_us=SHIFT_US)
    return folder


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _bad_folder(tmp_path: Path) -> Path:
    """Two good ranks, then a truncated gzip (rank2) and a file that is not JSON (rank3)."""
    folder = tmp_path / "bad"
    write_rank_copies(trace_path("w128_sendrecv_rank0.json.gz"), 2, folder)
    (folder / "rank2.json.gz").write_bytes(gzip.compress((folder / "rank1.json").read_bytes())[:4000])
    (folder / "rank3.json").write_text('{"traceEvents": [')
    return folder


@pytest.mark.slow  # two pools and four reads of the folders
def test_analyze_on_worker_processes_equals_in_process(capsys, w128_dir, copies_dir):
    for folder, ranks in ((w128_dir, [0, 1]), (copies_dir, list(range(6)))):
        code, here, _ = _run(capsys, "analyze", str(folder), "--json", "--jobs", "1")
        assert code == 0
        code, pooled, err = _run(capsys, "analyze", str(folder), "--json", "--jobs", "2")
        assert code == 0
        assert pooled == here
        reports = orjson.loads(here)["ranks"]
        assert [r["rank"] for r in reports] == ranks
        assert all(row["basis"] == WAIT_BASIS_RANKS for r in reports for row in r["wait_transfer"])
        assert err == ""  # a read of a second or two says nothing on a pipe (a large one: the Ctrl-C test)
    # copies shifted wholesale are clocks apart (traces/rank_join.py): every copy waits alike
    waits = [sum(row["wait_us"] for row in r["wait_transfer"]) for r in reports]
    assert max(waits) - min(waits) <= 1e-3 * max(waits)


def test_lowest_rank_read_on_workers_is_the_same_workload(copies_dir):
    here, from_trace = read_workload_arg(str(copies_dir))
    pooled = read_lowest_rank(copies_dir, RankReading(ExecutorKind.PROCESS, 2))
    assert from_trace and pooled.rank == 0
    assert pooled.to_dict() == here.to_dict()  # ops, groups, execution graph, each collective's wait
    assert pooled.exec_graph is not None and pooled.exec_graph.wait_basis == WAIT_BASIS_RANKS
    assert max(pooled.exec_graph.comm_wait_us.values()) > 0


def test_copies_shifted_wholesale_are_clocks_apart(copies_dir):
    """Every time of copy k is SHIFT_US x k later: to the trace that is copy k's host clock
    running ahead, not copy k arriving later (traces/rank_join.py): the alignment finds
    the shifts, and every copy then waits as long as every other, for the 122 ranks of
    the 128 the folder lacks."""
    workloads = read_trace(copies_dir)
    joined = join_ranks([rank_comm(w) for w in workloads])
    for w in workloads:
        assert joined.alignment.offsets_us[w.rank] == pytest.approx(-SHIFT_US * w.rank, abs=1e-6)
    assert joined.alignment.residual_us == pytest.approx(0.0, abs=1e-6)
    sequences = {w.rank: sorted((c for c in w.collectives if c.on_gpu), key=lambda c: (c.start_us, c.op_id))
                 for w in workloads}
    checked = 0
    lowest = workloads[0].exec_graph
    assert lowest is not None
    for w in workloads:
        assert w.exec_graph is not None
        for op, first in zip(sequences[w.rank], sequences[0]):
            assert w.exec_graph.comm_wait_us[op.op_id] == pytest.approx(lowest.comm_wait_us[first.op_id])
            assert 0.0 <= w.exec_graph.comm_wait_us[op.op_id] <= op.duration_us
            checked += 1
    assert checked > 50


def test_bad_file_in_a_worker_is_the_in_process_error(capsys, tmp_path):
    folder = _bad_folder(tmp_path)
    code, _, here = _run(capsys, "analyze", str(folder), "--jobs", "1")
    assert code == 2
    code, _, pooled = _run(capsys, "analyze", str(folder), "--jobs", "2")
    assert code == 2 and "Traceback" not in pooled
    line = pooled.strip().splitlines()[-1]
    assert line == here.strip().splitlines()[-1]  # the first bad file in the folder's order, as here
    assert line.startswith("lagom analyze: error: ") and "rank2.json.gz: truncated gzip" in line


def test_rank_options_are_checked(capsys, w128_dir):
    for argv, says in ((["--jobs", "0"], "--jobs 0: must be at least 1"),
                       (["--executor", "process", "--dask-address", "tcp://127.0.0.1:1"], "--dask-address is for")):
        code, _, err = _run(capsys, "analyze", str(w128_dir), *argv)
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # a pool started and stopped
def test_ctrl_c_stops_the_pool(tmp_path):
    folder = tmp_path / "ranks"
    write_rank_copies(REPO_ROOT / "traces" / "examples" / "a100_w2_allreduce_broadcast.json.gz", 8, folder)
    spill_root = tmp_path / "tmp"
    spill_root.mkdir()
    env = {**os.environ, "TMPDIR": str(spill_root)}
    proc = subprocess.Popen([sys.executable, "-m", "lagom", "analyze", str(folder), "--json", "--jobs", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO_ROOT,
                            start_new_session=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the pool is up and reading: a plain line on a pipe for a folder this large
    assert first.startswith("ranks: 8 ranks on 2 workers: started (16 tasks)")
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the whole process group
    started = time.monotonic()
    err = first + proc.stderr.read()
    assert proc.wait(timeout=60) == 130
    assert time.monotonic() - started < 20
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "lagom analyze: interrupted"
    assert not list(spill_root.glob("lagom-ranks-*"))  # the spilled records are gone


# ---- Dask ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_address():
    """A local Dask cluster of two worker processes, as an existing cluster (--dask-address)."""
    distributed = pytest.importorskip("distributed", reason="the dask extra is not installed "
                                                            "(pip install -e '.[dask]')")
    import logging

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None, silence_logs=logging.CRITICAL,
                                       scheduler_kwargs=LOCAL_SCHEDULER)
    yield cluster.scheduler_address
    cluster.close()


@pytest.mark.slow  # a Dask cluster
def test_dask_cluster_gives_the_same_results(capsys, copies_dir, tmp_path, dask_address):
    code, here, _ = _run(capsys, "analyze", str(copies_dir), "--json", "--jobs", "1")
    assert code == 0
    code, on_dask, _ = _run(capsys, "analyze", str(copies_dir), "--json", "--dask-address", dask_address)
    assert code == 0 and on_dask == here

    workload, _ = read_workload_arg(str(copies_dir))
    pooled = read_lowest_rank(copies_dir, RankReading(ExecutorKind.DASK, 2, dask_address))
    assert pooled.to_dict() == workload.to_dict()

    folder = _bad_folder(tmp_path)
    code, _, serial_err = _run(capsys, "analyze", str(folder), "--jobs", "1")
    code, _, dask_err = _run(capsys, "analyze", str(folder), "--dask-address", dask_address)
    assert code == 2 and "Traceback" not in dask_err
    assert dask_err.strip().splitlines()[-1] == serial_err.strip().splitlines()[-1]


@pytest.mark.slow  # starts its own local Dask cluster
def test_dask_executor_starts_a_local_cluster(capsys, w128_dir):
    pytest.importorskip("distributed", reason="the dask extra is not installed (pip install -e '.[dask]')")
    code, here, _ = _run(capsys, "simulate", str(w128_dir), "--cluster", "a100-nvswitch", "--json", "--jobs", "1")
    assert code == 0
    code, on_dask, _ = _run(capsys, "simulate", str(w128_dir), "--cluster", "a100-nvswitch", "--json",
                            "--executor", "dask", "--jobs", "2")
    assert code == 0 and on_dask == here


def test_a_worker_ignores_ctrl_c_from_its_first_instruction():
    """A Ctrl-C reaches the whole process group; one that lands while a worker starts, before the pool's
    initializer ignores SIGINT, once printed a worker's traceback. The fork server starts with SIGINT
    ignored, so every process it forks ignores it from the start, initializer or not."""
    import multiprocessing

    from lagom.orchestration.rank_pool import _ProcessPool

    if sys.platform != "linux" or "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("reads /proc; a fork server")
    pool = _ProcessPool(2, [])
    bare = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(60,))  # no initializer
    try:
        bare.start()
        time.sleep(1.5)  # past its start: asleep in time.sleep, its handlers the server gave it
        status = Path(f"/proc/{bare.pid}/status").read_text()
    finally:
        bare.kill()
        bare.join()
        pool.close(abort=False)
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    assert ignored & (1 << (signal.SIGINT - 1))
