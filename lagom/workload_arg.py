"""Resolving a WORKLOAD command-line argument: a workload JSON file, a profiler trace, or a spec string.

Shared by ``lagom simulate`` and ``lagom tune``. For a trace, compute kernels start from
their *uncontended* durations: the median of same-shape kernels that ran with no
collective overlapping (:func:`traces.contention.uncontended_durations`), else the
observed duration divided by the slowdown the simulator's contention mechanism gives
it under NCCL's default choice for the collective it overlapped (needs a cluster).
"""

from __future__ import annotations

from pathlib import Path

from nccl_env.errors import LagomError
from traces.workload import Workload
from traces.workload_io import is_workload_file, load_workload


def load_workload_arg(text: str, cluster=None) -> Workload:
    """:func:`read_workload_arg`, a trace's compute kernels then uncontended (:func:`uncontend`)."""
    workload, from_trace = read_workload_arg(text)
    if from_trace:
        uncontend(workload, cluster)
    return workload


def read_workload_arg(text: str) -> tuple[Workload, bool]:
    """(workload, whether it is a trace's). An existing workload JSON -> loaded; another existing
    path -> a Kineto trace (rank 0, else the lowest rank), as observed; anything else -> a spec
    string for :func:`traces.generate.generate_workload`."""
    path = Path(text)
    if path.exists():
        if path.is_file() and is_workload_file(path):
            return load_workload(path), False
        from traces.kineto import read_trace  # lazily: only traces need the reader

        workloads = read_trace(path)
        if not workloads:
            raise LagomError(f"{path}: the trace holds no rank")
        return min(workloads, key=lambda w: w.rank), True
    if ":" not in text:
        raise LagomError(f"{text!r}: not a file, and not a workload spec (e.g. fsdp:llama3-8b:gpus=16)")
    from traces.generate import generate_workload

    return generate_workload(text), False


def uncontend(workload: Workload, cluster=None) -> None:
    """Replace observed compute durations with uncontended ones, in place."""
    from traces.contention import uncontended_durations

    reference = uncontended_durations(workload)
    spans = sorted((c.start_us, c.end_us, c) for c in workload.collectives if c.on_gpu)
    sim = None
    if cluster is not None and spans:
        from costmodel.sim import Simulator

        sim = Simulator(cluster, noise=0.0)
    for op in workload.compute_ops:
        if op.op_id in reference:
            op.duration_us = reference[op.op_id]
            continue
        if sim is None or op.is_memory_op:
            continue
        overlapping = [c for a, b, c in spans if a < op.end_us and b > op.start_us]
        if not overlapping:
            continue
        coll = max(overlapping, key=lambda c: min(c.end_us, op.end_us) - max(c.start_us, op.start_us))
        signature = workload.signature(coll, cluster.gpus_per_node)
        model = sim.collective_model(signature)
        slowed = sim.compute_time_us(op, model.channels, model.config.chunk_bytes or 0)
        alone = sim.compute_time_us(op)
        if slowed > alone > 0:
            overlap = min(coll.end_us, op.end_us) - max(coll.start_us, op.start_us)
            part = max(0.0, min(op.duration_us, overlap))
            op.duration_us = op.duration_us - part + part * alone / slowed
