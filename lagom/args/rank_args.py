"""The command-line choice of where a trace folder's ranks are read: ``--jobs``, ``--executor``,
``--dask-address`` (shared by ``lagom analyze``, ``simulate`` and ``tune``; the reading
itself is :mod:`lagom.orchestration.rank_pool`)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from enum import Enum

from nccl_env.errors import LagomError


class ExecutorKind(str, Enum):
    LOCAL = "local"
    PROCESS = "process"
    DASK = "dask"


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class RankReading:
    """How to read a folder's ranks: the command-line choice."""

    executor: ExecutorKind = ExecutorKind.LOCAL
    jobs: int = 1
    dask_address: str | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--jobs``, ``--executor`` and ``--dask-address`` on a command that reads trace folders."""
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="worker processes reading a folder's ranks (default: the cores; 1 = in this process)")
    parser.add_argument("--executor", choices=[k.value for k in ExecutorKind], default=None,
                        help="where a folder's ranks are read: local (this process), process (--jobs worker "
                             "processes, the default), dask (a Dask cluster: lagom-nccl[dask])")
    parser.add_argument("--dask-address", default=None, metavar="ADDRESS",
                        help="scheduler of an existing Dask cluster (e.g. tcp://host:8786); implies --executor dask")


def reading_from_args(args: argparse.Namespace) -> RankReading:
    jobs = args.jobs if args.jobs is not None else default_jobs()
    if jobs < 1:
        raise LagomError(f"--jobs {args.jobs}: must be at least 1")
    if args.dask_address is not None and args.executor not in (None, ExecutorKind.DASK.value):
        raise LagomError(f"--dask-address is for --executor dask, not --executor {args.executor}")
    if args.executor is not None:
        kind = ExecutorKind(args.executor)
    elif args.dask_address is not None:
        kind = ExecutorKind.DASK
    else:
        kind = ExecutorKind.PROCESS if jobs > 1 else ExecutorKind.LOCAL
    return RankReading(kind, jobs, args.dask_address)
