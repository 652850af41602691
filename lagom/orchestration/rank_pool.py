"""Reading a trace folder's ranks on a pool of workers: processes on this machine, or a Dask cluster.

``lagom analyze``, ``simulate`` and ``tune`` read a directory of per-rank traces. One
worker holds one rank at a time, so a worker's peak memory is about one rank's read
(docs/performance.md measures it). Every rank's times are measured from one origin
shared by the ranks (:func:`traces.reader.job_layout`), and that origin is known only
once every file has been read, so the work is two rounds of one task per file:

1. **scan**: parse the file (its reader's scan, :func:`traces.reader.scan_trace_file`), keep its compact
   records (spilled to a temporary file for a process pool, or only the name of the trace
   cache's entry that keeps them, ``ScannedTrace.kept``; held by the worker for Dask, about a
   twentieth of the JSON) and return its small :class:`~traces.reader.TraceHeader`.
2. The parent lays out the job from the headers (ranks, origin, world; the checks that
   the files are one job's), as the in-process reader does.
3. **finish**: build the rank's Workload from its records and run the command's
   per-rank function on it (``work``, a module-level function: it must pickle), which
   returns what the parent needs (a report, the lowest rank's Workload, ...); the task
   also returns the rank's collectives in compact form (:class:`traces.comm_split.RankComm`),
   from which the parent computes each collective's wait for its peers
   (:func:`traces.comm_split.key_waits`) without any other rank's Workload.

The results are exactly the in-process reader's: the same functions, in the same order
of files. An error in a worker is the one-line LagomError the in-process reader gives for
the first bad file of the folder; a worker that dies (killed for memory) is one line too.
Ctrl-C stops the workers and removes the spilled records.

Executors (``--executor``): ``local`` reads in this process (what ``--jobs 1`` gives);
``process`` uses ``--jobs`` worker processes (default: the cores this process may use), except
for a folder whose every file the trace cache keeps whole (each header, each rank's build in
this layout: a command run again): nothing is parsed or built, so it is read in this process;
``dask`` runs the same tasks on a Dask cluster: an existing one (``--dask-address``,
whose workers have lagom-nccl installed and see the trace files at the same path) or a
local one of ``--jobs`` single-threaded worker processes. Dask is the optional extra
``lagom-nccl[dask]``.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from rich.console import Console

from lagom.args.rank_args import ExecutorKind, RankReading
from lagom.reports.console import StageProgress
from nccl_env.errors import LagomError
from traces import parse_cache
from traces.comm_split import RankComm, join_waits, op_waits, rank_comm
from traces.rank_join import RankJoin, TransferFloor, join_ranks
from traces.reader import (
    JobLayout,
    ScannedTrace,
    TraceHeader,
    job_layout,
    kept_trace_scans,
    scan_trace_file,
    set_comm_waits,
    trace_files,
)
from traces.workload import Workload

R = TypeVar("R")
SAY_PROGRESS_BYTES = 20_000_000  # folders this large take seconds to read: progress lines even on a pipe


# ---- the tasks (run in the workers) -------------------------------------------------------
def _scan_to_file(path: Path, spill_dir: str) -> tuple[TraceHeader, str]:
    """Parse one file, spill its records to ``spill_dir`` (where this machine's trace cache keeps them: their
    name, ``ScannedTrace.kept``); its header and the spill file."""
    parsed = _guarded(path, scan_trace_file, path)
    spill = os.path.join(spill_dir, f"{uuid.uuid4().hex}.pkl")
    try:
        with open(spill, "wb") as f:
            pickle.dump(parsed.kept(), f, pickle.HIGHEST_PROTOCOL)
    except OSError as exc:
        raise LagomError(f"{path}: cannot spill its records to {spill_dir}: {exc.strerror or exc}") from None
    return parsed.header(), spill


def _scan_to_bytes(path: Path, absolute: Path) -> tuple[TraceHeader, bytes]:
    """Parse one file (read at ``absolute``: a Dask worker may run elsewhere, in another folder; named
    ``path``, as given); its header and its records pickled (they stay on the worker)."""
    parsed = _guarded(absolute, lambda p: scan_trace_file(p).whole(), absolute)  # the records: for any worker
    parsed.path = path
    return parsed.header(), pickle.dumps(parsed, pickle.HIGHEST_PROTOCOL)


def _header(scanned: tuple[TraceHeader, Any]) -> TraceHeader:
    return scanned[0]


def _finish(scanned: tuple[TraceHeader, str | bytes], index: int, layout: JobLayout, lowest: bool,
            work: Callable[..., R], args: tuple) -> tuple[RankComm, R]:
    """Build one rank's Workload from its scanned records; its compact collectives and ``work``'s result."""
    header, records = scanned
    if isinstance(records, str):
        with open(records, "rb") as f:
            parsed = pickle.load(f)
        os.unlink(records)
    else:
        parsed = pickle.loads(records)
    del records
    workload = _guarded(header.path, parsed.build_rank, layout, index)
    del parsed
    return rank_comm(workload), _guarded(header.path, work, workload, lowest, *args)


def _guarded(path: Path, fn: Callable[..., R], *args: Any) -> R:
    """``fn(*args)``, any failure but a LagomError made one line naming the file."""
    try:
        return fn(*args)
    except LagomError:
        raise
    except MemoryError:
        raise LagomError(f"{path}: out of memory reading it (fewer --jobs leave each worker more)") from None
    except Exception as exc:  # a bug: one line, and how to get the traceback
        raise LagomError(f"{path}: {type(exc).__name__}: {exc} (--jobs 1 reads in this process and shows where)") \
            from None


def _cache_env() -> dict[str, str | None]:
    """What the trace cache reads from the environment (traces.parse_cache.TRACE_CACHE_ENV_NAMES): a worker forked
    from the fork server has the server's environment, from when it started."""
    return {name: os.environ.get(name) for name in parse_cache.TRACE_CACHE_ENV_NAMES}


def _worker_init(cache_env: dict[str, str | None] | None = None) -> None:
    """Ctrl-C reaches the whole process group: the parent alone stops the pool. ``cache_env``: the
    parent's cache settings when it made the pool, so a worker keeps parses where the parent looks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name, value in (cache_env or {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _fork_server_without_ctrl_c() -> None:
    """Start the fork server with SIGINT ignored: a Python started so keeps ignoring it, and each worker
    the server forks takes the server's start-up handler back, so a Ctrl-C that lands while a worker
    starts (before :func:`_worker_init`) raises nothing there. SIGINT is blocked meanwhile, so one
    that lands here is held and delivered once the handler is back (Linux keeps a blocked signal
    pending even while ignored)."""
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def dask_setup(worker: object) -> None:
    """Run by each worker of the local Dask cluster (its ``preload``): as :func:`_worker_init`."""
    _worker_init()


# ---- the pools ----------------------------------------------------------------------------
class _Pool:
    """What a folder read needs of an executor: submit a task, wait for tasks, stop."""

    workers: int

    def scan(self, path: Path) -> tuple[Any, Any]:
        """(handle of the scanned records, handle of what holds the header: :meth:`header`)."""
        raise NotImplementedError

    def header(self, result: Any) -> TraceHeader:
        """The header in the result of :meth:`scan`'s second handle."""
        return result

    def finish(self, scanned: Any, index: int, layout: JobLayout, lowest: bool, work: Callable, args: tuple) -> Any:
        raise NotImplementedError

    def completed(self, handles: list) -> Iterator:
        raise NotImplementedError

    def result(self, handle: Any) -> Any:
        """The task's result; an error that says a worker or the cluster was lost (:meth:`lost`) is a
        LagomError, any other is the task's own."""
        try:
            return handle.result()
        except Exception as exc:
            why = self.lost(exc)
            if why is None:
                raise
            raise LagomError(why) from None

    def lost(self, exc: Exception) -> str | None:
        """What to tell the user when ``exc`` means the executor lost a worker; None: the task's own error."""
        return None

    def cancel(self, handles: Iterable) -> None:
        raise NotImplementedError

    def release(self, handles: Iterable) -> None:
        """Done with these results: free what a worker holds for them."""

    def close(self, abort: bool) -> None:
        raise NotImplementedError


class _ProcessPool(_Pool):
    def __init__(self, workers: int, preload: list[str]) -> None:
        self.workers = workers
        self.spill_dir = tempfile.mkdtemp(prefix="lagom-ranks-")
        ctx: multiprocessing.context.BaseContext
        if "forkserver" in multiprocessing.get_all_start_methods():
            # a fork of a server that has imported the readers once: no fork of this (threaded) process
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["lagom.orchestration.rank_pool", *preload])
            _fork_server_without_ctrl_c()
        else:
            ctx = multiprocessing.get_context("spawn")
        self.pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init,
                                        initargs=(_cache_env(),))

    def scan(self, path: Path) -> tuple[Future, Future]:
        future = self.pool.submit(_scan_to_file, path, self.spill_dir)
        return future, future

    def header(self, result: Any) -> TraceHeader:
        return result[0]

    def finish(self, scanned: Future, index: int, layout: JobLayout, lowest: bool, work: Callable,
               args: tuple) -> Future:
        return self.pool.submit(_finish, scanned.result(), index, layout, lowest, work, args)

    def completed(self, handles: list) -> Iterator:
        return as_completed(handles)

    def lost(self, exc: Exception) -> str | None:
        if isinstance(exc, BrokenProcessPool):
            return "a worker process died while reading ranks (killed for memory?); fewer --jobs leave each worker more"
        return None

    def cancel(self, handles: Iterable) -> None:
        for h in handles:
            h.cancel()

    def close(self, abort: bool) -> None:
        if abort:  # stop the running tasks now: a large rank takes seconds
            terminate = getattr(self.pool, "terminate_workers", None)  # Python 3.14
            if terminate is not None:
                terminate()
            else:
                for process in list((getattr(self.pool, "_processes", None) or {}).values()):
                    process.terminate()
        self.pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(self.spill_dir, ignore_errors=True)


# No dashboard; the scheduler's HTTP endpoints on a free port of this machine (not the 8787 that
# another cluster may hold).
LOCAL_SCHEDULER = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}


class _DaskPool(_Pool):
    def __init__(self, workers: int, address: str | None) -> None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise LagomError("--executor dask needs Dask: pip install 'lagom-nccl[dask]'") from None
        self.cluster = None
        if address is not None:
            try:
                self.client = Client(address, timeout="20s")
            except (OSError, TimeoutError) as exc:
                raise LagomError(f"--dask-address {address}: cannot reach the scheduler: {exc}") from None
            self.workers = max(1, len(self.client.scheduler_info().get("workers", {})))
        else:
            # Ctrl-C reaches the whole process group: the cluster's threads and worker processes start
            # with SIGINT blocked (they inherit the mask), so the parent alone stops them, and a Ctrl-C
            # during the start is delivered here once it is unblocked.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                self.cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                            host="127.0.0.1", dashboard_address=None, silence_logs=logging.CRITICAL,
                                            preload=["lagom.orchestration.rank_pool"], scheduler_kwargs=LOCAL_SCHEDULER)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            self.client = Client(self.cluster)
            self.workers = workers

    def scan(self, path: Path) -> tuple[Any, Any]:
        scanned = self.client.submit(_scan_to_bytes, path, path.absolute(), pure=False)
        return scanned, self.client.submit(_header, scanned, pure=False)

    def finish(self, scanned: Any, index: int, layout: JobLayout, lowest: bool, work: Callable, args: tuple) -> Any:
        return self.client.submit(_finish, scanned, index, layout, lowest, work, args, pure=False)

    def completed(self, handles: list) -> Iterator:
        from distributed import as_completed as dask_completed

        return iter(dask_completed(handles))

    def lost(self, exc: Exception) -> str | None:
        from distributed import KilledWorker

        if isinstance(exc, KilledWorker):
            return ("a Dask worker died while reading ranks (killed for memory?); give the workers more memory or "
                    "fewer threads")
        if isinstance(exc, OSError):  # the connection to the scheduler (distributed's CommClosedError is one)
            return f"lost the Dask cluster while reading ranks: {exc}"
        return None

    def cancel(self, handles: Iterable) -> None:
        self.client.cancel(list(handles))

    def release(self, handles: Iterable) -> None:
        self.client.cancel(list(handles))

    def close(self, abort: bool) -> None:
        try:
            self.client.close()
            if self.cluster is not None:
                self.cluster.close()
        except Exception:  # closing after a failure or Ctrl-C: the workers may be gone already
            if not abort:
                raise


class RankPool:
    """The executor a command reads folders with (a context manager); ``None`` pool = in this process."""

    def __init__(self, reading: RankReading, preload: list[str] | None = None) -> None:
        self.reading = reading
        self.preload = preload or []
        self._pool: _Pool | None = None
        self.err = Console(stderr=True)

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if self._pool is not None:
            self._pool.close(abort=exc_type is not None)
            self._pool = None

    def _get(self, files: int) -> _Pool:
        if self._pool is None:
            workers = min(self.reading.jobs, files)
            if self.reading.executor is ExecutorKind.DASK:
                self._pool = _DaskPool(workers, self.reading.dask_address)
            else:
                self._pool = _ProcessPool(workers, self.preload)
        return self._pool

    def read_job(self, path: Path, work: Callable[..., R], args: tuple = ()) -> JobRanks[R]:
        """Every rank of the trace file or folder ``path``: ``work(workload, lowest, *args)`` per rank
        (``lowest``: the job's lowest rank), with each rank's compact collectives."""
        files = trace_files(path)
        if self.reading.executor is ExecutorKind.LOCAL or len(files) == 1:
            return _read_here(path, files, work, args)
        if self.reading.executor is ExecutorKind.PROCESS:
            kept = _kept_here(path, files)
            if kept is not None:  # nothing to parse or build: reading here beats a pool's start and hand-over
                return _read_here(path, files, work, args, kept)
        pool = self._get(len(files))
        name = path.name or str(path)
        scans = [pool.scan(f) for f in files]
        # a bar on a terminal (it goes away when done); on a pipe, lines only for a read of seconds
        shown = self.err.is_terminal or _total_bytes(files) >= SAY_PROGRESS_BYTES
        with StageProgress(self.err, f"{name}: {len(files)} ranks on {pool.workers} workers", total=2 * len(files),
                           enabled=shown, unit="tasks") as bar:
            scanned = _gather(pool, [h for _, h in scans], bar, "reading")
            layout = job_layout([pool.header(r) for r in scanned], path)
            low = min(range(len(files)), key=lambda i: layout.ranks[i])
            finished = [pool.finish(s, i, layout, i == low, work, args) for i, (s, _) in enumerate(scans)]
            results = _gather(pool, finished, bar, "analysing", len(files))
        pool.release([s for s, _ in scans] + finished)
        return JobRanks(path, layout, [c for c, _ in results], [v for _, v in results])


def _total_bytes(files: list[Path]) -> int:
    try:
        return sum(f.stat().st_size for f in files)
    except OSError:
        return 0


def _kept_here(path: Path, files: list[Path]) -> tuple[list[ScannedTrace], JobLayout] | None:
    """Every file's scan and the job's layout where the trace cache keeps every file's header and every
    rank's Workload in that layout (a command run again on the folder); None otherwise."""
    scans = kept_trace_scans(files)
    if scans is None:
        return None
    layout = job_layout([s.header() for s in scans], path)
    return (scans, layout) if all(s.build_is_kept(layout, i) for i, s in enumerate(scans)) else None


def _read_here(path: Path, files: list[Path], work: Callable[..., R], args: tuple,
               scanned: tuple[list[ScannedTrace], JobLayout] | None = None) -> JobRanks[R]:
    """The same steps in this process, one file at a time (``scanned``: the scans and layout made already)."""
    if scanned is None:
        parsed: list[Any] = [scan_trace_file(f) for f in files]
        layout = job_layout([p.header() for p in parsed], path)
    else:
        parsed, layout = list(scanned[0]), scanned[1]
    low = min(range(len(files)), key=lambda i: layout.ranks[i])
    comms: list[RankComm] = []
    values: list[R] = []
    for i in range(len(parsed)):
        workload = parsed[i].build_rank(layout, i)
        parsed[i] = None  # its records are no longer needed
        comms.append(rank_comm(workload))
        values.append(work(workload, i == low, *args))
    return JobRanks(path, layout, comms, values)


def _gather(pool: _Pool, handles: list, bar: StageProgress, stage: str, done: int = 0) -> list:
    """Every handle's result, in order. On a failure: the failure of the first failing handle
    in order (as the in-process reader would meet them), the later ones cancelled."""
    index = {h: i for i, h in enumerate(handles)}
    results: list = [None] * len(handles)
    failed: dict[int, BaseException] = {}
    waiting = set(range(len(handles)))
    for handle in pool.completed(handles):
        i = index[handle]
        waiting.discard(i)
        if failed and i > min(failed):
            continue  # cancelled, or finished after an earlier file failed
        try:
            results[i] = pool.result(handle)
        except LagomError as exc:
            failed[i] = exc
            pool.cancel([handles[j] for j in waiting if j > i])
        else:
            done += 1
            bar.update(done, stage=stage)
        if failed and not any(j < min(failed) for j in waiting):
            raise failed[min(failed)]
    if failed:
        raise failed[min(failed)]
    return results


@dataclass
class JobRanks(Generic[R]):
    """One trace file's or folder's ranks as read: per file, in the folder's order."""

    path: Path
    layout: JobLayout
    comms: list[RankComm]
    values: list[R]

    def join(self, transfer_floor: TransferFloor | None = None) -> RankJoin:
        """The ranks' collectives matched, their clocks aligned, each instance's wait (traces.rank_join);
        ``transfer_floor``: the cluster's bound on thinly seen collectives (the first call decides)."""
        found = self.__dict__.get("_join")
        if found is None:
            found = self.__dict__["_join"] = join_ranks(self.comms, self.layout.world_size, transfer_floor)
        return found

    def waits(self, transfer_floor: TransferFloor | None = None) -> dict[int, dict]:
        """rank -> key -> each instance's wait for its peers (traces.comm_split.key_waits)."""
        return join_waits(self.comms, self.join(transfer_floor).wait_us)


# ---- what simulate and tune read ----------------------------------------------------------
def _lowest_workload(workload: Workload, lowest: bool) -> Workload | None:
    return workload if lowest else None


def _whole_workload(workload: Workload, lowest: bool) -> Workload:
    return workload


def read_all_ranks(path: Path, reading: RankReading) -> list[Workload]:
    """Every rank's Workload of a trace folder, read on ``reading``'s executor, each collective's
    wait from all ranks: what :func:`traces.kineto.read_trace` gives (a joint replay's input)."""
    with RankPool(reading) as pool:
        job = pool.read_job(path, _whole_workload)
    waits = job.waits()
    for comm, workload in zip(job.comms, job.values):
        set_comm_waits(workload, op_waits(comm, waits[workload.rank]), len(job.values))
    return sorted(job.values, key=lambda w: w.rank)


def read_lowest_rank(path: Path, reading: RankReading) -> Workload:
    """The lowest rank's Workload of a trace file or folder, its collectives' waits from all ranks:
    what :func:`traces.reader.read_trace` gives for it, reading on ``reading``'s executor."""
    with RankPool(reading) as pool:
        job = pool.read_job(path, _lowest_workload)
    low = min(range(len(job.values)), key=lambda i: job.layout.ranks[i])
    workload = job.values[low]
    assert workload is not None
    waits = job.waits()
    set_comm_waits(workload, op_waits(job.comms[low], waits[workload.rank]), len(job.values))
    return workload
