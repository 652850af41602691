"""Reading and writing Workload JSON files (``.json`` or ``.json.gz``)."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import orjson

from nccl_env.errors import LagomError
from nccl_env.files import open_regular, read_bounded
from traces.limits import (
    MAX_GPUS_PER_NODE,
    MAX_GRID_AXIS,
    MAX_MESSAGE_BYTES,
    MAX_NODES,
    MAX_OPS,
    MAX_RANKS,
    WORKLOAD_MEMORY_PER_JSON_BYTE,
    check_fits_memory,
    trace_json_limit_bytes,
)
from traces.workload import Op, Workload


def save_workload(workload: Workload, path: str | Path) -> None:
    data = orjson.dumps(workload.to_dict(), option=orjson.OPT_INDENT_2)
    path = Path(path)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def is_workload_file(path: str | Path) -> bool:
    """True when the file's first bytes say it is a Lagom workload (cheap sniff)."""
    path = Path(path)
    try:
        with open_regular(path) as raw, (gzip.open(raw, "rb") if path.suffix == ".gz" else raw) as fh:
            head = fh.read(4096)
    except (OSError, EOFError, LagomError):  # not a regular file: the reader says what it is
        return False
    return b'"lagom.workload"' in head


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        check_fits_memory([path], path, WORKLOAD_MEMORY_PER_JSON_BYTE)
        raw = read_bounded(path, trace_json_limit_bytes(WORKLOAD_MEMORY_PER_JSON_BYTE), str(path),
                           "a workload file", gunzip=path.suffix == ".gz")
        workload = Workload.from_dict(orjson.loads(raw))
    except FileNotFoundError:
        raise LagomError(f"{path}: no such file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LagomError(f"{path}: cannot read: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise LagomError(f"{path}: not valid JSON: {exc}") from None
    except KeyError as exc:
        raise LagomError(f"{path}: not a valid Lagom workload: missing key {exc}") from None
    except (ValueError, TypeError, AttributeError) as exc:
        raise LagomError(f"{path}: not a valid Lagom workload: {exc}") from None
    problem = workload_problem(workload)
    if problem:
        raise LagomError(f"{path}: not a valid Lagom workload: {problem}")
    return workload


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def workload_problem(workload: Workload) -> str | None:
    """The first inconsistency that would make an evaluator compute nonsense or crash, or None.

    Checks what ``Workload.from_dict`` leaves unchecked: times and sizes are finite
    numbers >= 0 and within :mod:`traces.limits`' bounds, op ids are unique, every op's
    stream and every collective's group exist, and dependencies name existing ops.
    A sound workload (every trace read) is checked over arrays (:func:`_ops_sound`); the
    op-by-op checks run only to name the first problem of one that is not.
    """
    bounds = out_of_bounds(workload)
    if bounds is not None:
        return bounds
    ops: tuple[Op, ...] = (*workload.compute_ops, *workload.collectives)
    ids = {op.op_id for op in ops}
    sound = len(ids) == len(ops) and _ops_sound(workload, ops, {s.stream_id for s in workload.streams})
    problem = _collective_problem(workload) if sound else _op_problem(workload, ops)
    if problem is not None:
        return problem
    for dep in workload.dependencies:
        if dep.before not in ids or dep.after not in ids:
            return f"dependency {dep.before} -> {dep.after} names an op that is not in the workload"
    return _cycle(workload)


def _sound_numbers(values: list, optional: bool = False, signed: bool = False) -> bool:
    """Every value an int or float (or None where ``optional``), finite, and >= 0 unless ``signed``:
    what :func:`_number` and the bounds check one at a time. False also where unsure (another type)."""
    kinds = set(map(type, values))
    if not kinds <= ({int, float, type(None)} if optional else {int, float}):
        return False
    present = [v for v in values if v is not None] if type(None) in kinds else values
    try:
        arr = np.array(present, dtype=np.float64)
    except OverflowError:
        return False
    return bool(np.isfinite(arr).all() and (signed or (arr >= 0).all()))


def _ops_sound(workload: Workload, ops: tuple[Op, ...], streams: set[int]) -> bool:
    """True where :func:`_op_problem`'s op and kernel checks all pass (ids already unique): each
    check over every op at once. False where one fails or cannot be made so (then they run op by op)."""
    if not ({op.stream for op in ops} <= streams and _sound_numbers([op.start_us for op in ops], signed=True)
            and _sound_numbers([op.duration_us for op in ops])):
        return False
    kernels = workload.compute_ops
    return all(_sound_numbers([getattr(op, name) for op in kernels], optional=True)
               for name in ("flops", "dram_bytes", "blocks_per_sm"))


def _op_problem(workload: Workload, ops: tuple[Op, ...]) -> str | None:
    """The first problem of an op (its id, times, stream), a collective or a kernel's sizes, op by op."""
    streams = {s.stream_id for s in workload.streams}
    ids: set[int] = set()
    for op in ops:
        what = f"op {op.op_id} ({op.name[:40]!r})"
        if op.op_id in ids:
            return f"op id {op.op_id} is used twice"
        ids.add(op.op_id)
        if not (_number(op.start_us) and _number(op.duration_us)) or op.duration_us < 0:
            return f"{what}: start_us and duration_us must be finite numbers, duration >= 0"
        if op.stream not in streams:
            return f"{what}: stream {op.stream} is not in 'streams'"
    problem = _collective_problem(workload)
    if problem is not None:
        return problem
    for op in workload.compute_ops:
        for name in ("flops", "dram_bytes", "blocks_per_sm"):
            value = getattr(op, name)
            if value is not None and (not _number(value) or value < 0):
                return f"op {op.op_id}: {name} must be a finite number >= 0, got {value!r}"
    return None


def _collective_problem(workload: Workload) -> str | None:
    for op in workload.collectives:
        size = op.message_bytes
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            return f"op {op.op_id}: message_bytes must be an integer >= 0 or null (not recorded), got {size!r}"
        if op.group not in workload.groups:
            return f"op {op.op_id}: process group {op.group!r} is not in 'groups'"
        if op.p2p is not None and not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < MAX_RANKS
                                          for r in (op.p2p.src, op.p2p.dst)):
            return f"op {op.op_id}: p2p src and dst must be ranks (integers in [0, {MAX_RANKS})), got {op.p2p}"
        if op.p2p is not None and op.p2p.seq is not None and (not isinstance(op.p2p.seq, int)
                                                               or isinstance(op.p2p.seq, bool)):
            return f"op {op.op_id}: p2p seq must be an integer or null, got {op.p2p.seq!r}"
    return None


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def out_of_bounds(workload: Workload) -> str | None:
    """The first size over a bound of :mod:`traces.limits`, or None."""
    ops = len(workload.compute_ops) + len(workload.collectives)
    if ops > MAX_OPS:
        return f"{ops:,} ops, over Lagom's bound of {MAX_OPS:,}"
    if not _whole(workload.world_size, 1, MAX_RANKS):
        return f"world_size must be an integer in 1..{MAX_RANKS:,}, got {workload.world_size!r}"
    if not _whole(workload.rank, 0, MAX_RANKS - 1):
        return f"rank must be an integer in 0..{MAX_RANKS - 1:,}, got {workload.rank!r}"
    if workload.gpus_per_node is not None and not _whole(workload.gpus_per_node, 1, MAX_GPUS_PER_NODE):
        return f"gpus_per_node must be an integer in 1..{MAX_GPUS_PER_NODE}, got {workload.gpus_per_node!r}"
    for g in workload.groups.values():
        if not 1 <= len(g.ranks) <= MAX_RANKS or not all(_whole(r, 0, MAX_RANKS - 1) for r in g.ranks):
            return f"process group {g.name!r}: 1..{MAX_RANKS:,} ranks, each in 0..{MAX_RANKS - 1:,}"
        if g.nodes is not None and not _whole(g.nodes, 1, MAX_NODES):
            return f"process group {g.name!r}: nodes must be an integer in 1..{MAX_NODES:,}, got {g.nodes!r}"
    for coll in workload.collectives:
        if isinstance(coll.message_bytes, int) and coll.message_bytes > MAX_MESSAGE_BYTES:
            return (f"op {coll.op_id}: message_bytes={coll.message_bytes:,} is over Lagom's bound of "
                    f"{MAX_MESSAGE_BYTES:,} (1 TiB)")
    try:  # each distinct grid checked once; kernel by kernel only to name the first bad one
        bad = any(not _cuda_grid(g) for g in {k.grid for k in workload.compute_ops})
    except TypeError:  # a grid that is not a tuple (unhashable)
        bad = True
    if bad:
        for kernel in workload.compute_ops:
            grid = kernel.grid
            if not _cuda_grid(grid):
                return (f"op {kernel.op_id}: grid {grid} is not a CUDA grid (three axes of 0..{MAX_GRID_AXIS:,} "
                        f"blocks)")
    return None


def _cuda_grid(grid: tuple | None) -> bool:
    return grid is None or (len(grid) == 3 and all(_whole(d, 0, MAX_GRID_AXIS) for d in grid))


def _cycle(workload: Workload) -> str | None:
    """A dependency cycle (through dependencies and each stream's list order), or None.

    A stream's order alone is a chain, so a cycle passes through a dependency: the graph of the
    dependencies' ends alone, each stream's ends linked in its order, has one exactly when the
    whole graph has one. That small graph is checked first; the whole one only to name the ops."""
    ends = {d.before for d in workload.dependencies} | {d.after for d in workload.dependencies}
    if not ends or not _stuck(workload, ends):
        return None
    stuck = _stuck(workload, None)
    return (f"dependencies form a cycle (with stream order): ops {', '.join(map(str, stuck[:5]))}"
            f"{', ...' if len(stuck) > 5 else ''} can never start")


def _stuck(workload: Workload, among: set[int] | None) -> list[int]:
    """The ops (of ``among``; None: every op) that can never start, in id order: Kahn's order over
    the dependencies and each stream's list order (over ``among``'s ops: from one to the next)."""
    succ: dict[int, list[int]] = {}
    indegree: dict[int, int] = {}
    last_on_stream: dict[int, int] = {}
    ops: tuple[Op, ...] = (*workload.compute_ops, *workload.collectives)
    for op in ops:
        if among is not None and op.op_id not in among:
            continue
        indegree.setdefault(op.op_id, 0)
        prev = last_on_stream.get(op.stream)
        if prev is not None:
            succ.setdefault(prev, []).append(op.op_id)
            indegree[op.op_id] += 1
        last_on_stream[op.stream] = op.op_id
    for dep in workload.dependencies:
        succ.setdefault(dep.before, []).append(dep.after)
        indegree[dep.after] += 1
    ready = [i for i, d in indegree.items() if d == 0]
    while ready:
        i = ready.pop()
        for j in succ.get(i, ()):
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    return sorted(i for i, d in indegree.items() if d > 0)
