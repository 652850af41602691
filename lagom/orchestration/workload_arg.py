"""Resolving a WORKLOAD command-line argument: a workload JSON file, a profiler trace, or a spec string.

Shared by ``lagom simulate`` and ``lagom tune``. A trace keeps its measured times: the
evaluators replay its execution graph (costmodel.replay) and only scale those times
by the ratio their mechanism gives between a plan and the trace's recorded settings
(costmodel.replay.anchor). The simulator decides nothing about a trace.
"""

from __future__ import annotations

from pathlib import Path

from lagom.args.rank_args import ExecutorKind, RankReading
from nccl_env.errors import LagomError
from nccl_env.files import check_path_kind
from traces.workload import Workload
from traces.workload_io import is_workload_file, load_workload


def load_workload_arg(text: str) -> Workload:
    """:func:`read_workload_arg`'s workload."""
    return read_workload_arg(text)[0]


def read_workload_arg(text: str, reading: RankReading | None = None) -> tuple[Workload, bool]:
    """(workload, whether it is a trace's). An existing workload JSON -> loaded; another existing
    path -> a Kineto trace (rank 0, else the lowest rank); anything else -> a spec string for
    :func:`traces.generate.generate_workload`. ``reading``: the executor that reads a folder's
    ranks (lagom.orchestration.rank_pool; default: in this process), with the same result."""
    if not text.strip():
        raise LagomError("WORKLOAD: an empty name (give a trace, a workload JSON file or a spec such as "
                         "fsdp:llama3-8b:gpus=16)")
    path = Path(text)
    check_path_kind(path, text, folder=True)  # a device, a FIFO, a socket, a link loop: one line, never opened
    if path.exists():
        if path.is_file() and is_workload_file(path):
            return load_workload(path), False
        if reading is not None and reading.executor is not ExecutorKind.LOCAL and path.is_dir():
            from lagom.orchestration.rank_pool import read_lowest_rank

            return read_lowest_rank(path, reading), True
        from traces.reader import read_trace  # lazily: only traces need the reader

        workloads = read_trace(path)
        if not workloads:
            raise LagomError(f"{path}: the trace holds no rank")
        return min(workloads, key=lambda w: w.rank), True
    if ":" not in text:
        raise LagomError(f"{text!r}: not a file, and not a workload spec (e.g. fsdp:llama3-8b:gpus=16)")
    from traces.generate import generate_workload

    return generate_workload(text), False
