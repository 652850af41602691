"""A Kineto trace rewritten with every event where a replay puts it (``--export-trace``).

The rewrite behind :meth:`traces.kineto_reader.KinetoReader.write_moved`: each GPU op
(kernel, memcpy, memset) gets its predicted start and duration, every CPU event moves with
its thread (its thread's last wait before it: a host sync or a hand-over), ``ac2g`` flow
ends follow their kernels and GPU annotations (``nccl:all_reduce`` spans) the kernel they
wrap. Process, thread and stream layout, names and args stay the original's. A gloo job's
trace (no GPU op) moves its collectives' CPU calls, matched by name and time. What was
predicted is added to the top-level object (``lagom.files.trace_export`` says under which key).
"""

from __future__ import annotations

import gzip
from bisect import bisect_right
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from nccl_env.errors import LagomError
from traces.kineto_events import CATEGORY, GPU_ANNOTATION, KERNEL, MEMCPY, MEMSET, thread_key, to_int
from traces.kineto_json import read_bytes
from traces.workload import CollectiveOp, Op, Workload

if TYPE_CHECKING:
    from traces.reader import MovedOps

_MATCH_US = 1e-3  # an op's start and its event's ts agree to float rounding once shifted by the origin


def _category(event: dict) -> int:
    cat = event.get("cat")
    if type(cat) is not str:
        return -1
    kind = CATEGORY.get(cat)
    return kind if kind is not None else CATEGORY.get(cat.lower(), -1)


def _is_gpu_op(event: dict) -> bool:
    """The events the reader turns into ops (traces.kineto_events.EventReader's own filter)."""
    if event.get("ph", "X") != "X" or _category(event) not in (KERNEL, MEMCPY, MEMSET):
        return False
    ts, dur, args = event.get("ts"), event.get("dur"), event.get("args")
    if type(ts) not in (int, float) or not isinstance(dur, (int, float)) or dur < 0:
        return False
    return type(event.get("name")) is str and isinstance(args, dict) and to_int(args.get("stream")) is not None


def moved_trace(workload: Workload, moved: MovedOps, gzipped: bool, stamp: dict) -> tuple[bytes, int]:
    """``workload``'s trace file with every event moved to ``moved`` and ``stamp``'s entries added to
    its top-level object, as the bytes of a .json (or, ``gzipped``, a .json.gz) file, and the number
    of GPU ops moved; the caller writes them (lagom.files.output_paths.write_output, atomically)."""
    assert workload.exec_graph is not None
    source = Path(workload.source)
    try:
        doc = orjson.loads(read_bytes(source))
    except orjson.JSONDecodeError as exc:
        raise LagomError(f"{source}: not valid JSON ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise LagomError(f"{source}: not a PyTorch profiler trace (no 'traceEvents' list)")
    ops: list[Op] = sorted((*workload.compute_ops, *workload.collectives),
                           key=lambda o: (o.start_us, o.stream, o.op_id))
    matched, offset = _op_events(source, ops, events)
    by_corr: dict[int, float] = {}  # correlation -> predicted kernel start (trace time)
    spans: dict[int, list[tuple[float, float, float]]] = {}  # stream -> (old start, old end, shift), trace time
    # a CPU collective's own call (a gloo job): what it encloses on its thread is stretched with it
    held: dict[tuple, list[tuple[float, float, float, float]]] = {}  # thread -> (old start, old end, new start, x)
    for op, e in zip(ops, matched):
        new_ts = moved.starts[op.op_id] - offset
        spans.setdefault(op.stream, []).append((e["ts"], e["ts"] + e["dur"], new_ts - e["ts"]))
        if isinstance(op, CollectiveOp) and not op.on_gpu and e["dur"] > 0:
            held.setdefault(thread_key(e), []).append(
                (e["ts"], e["ts"] + e["dur"], new_ts, (moved.ends[op.op_id] - moved.starts[op.op_id]) / e["dur"]))
        e["ts"], e["dur"] = new_ts, moved.ends[op.op_id] - moved.starts[op.op_id]
        corr = to_int((e.get("args") or {}).get("correlation"))
        if corr is not None:
            by_corr[corr] = new_ts
    for stream_spans in spans.values():
        stream_spans.sort()
    for thread_spans in held.values():
        thread_spans.sort()
    thread_index = {name: i for i, name in enumerate(workload.exec_graph.cpu_threads)}
    gpu_ids = {id(e) for e in matched}
    for e in events:
        if not isinstance(e, dict) or id(e) in gpu_ids or type(e.get("ts")) not in (int, float):
            continue
        kind = _category(e)
        if kind == GPU_ANNOTATION:
            e["ts"] += _annotation_shift(spans.get(to_int(e.get("tid")) or -1, []), e)
        elif e.get("ph") == "f" and e.get("cat") == "ac2g" and to_int(e.get("id")) in by_corr:
            e["ts"] = by_corr[to_int(e.get("id")) or 0]
        else:
            key = thread_key(e)
            index = thread_index.get(f"{key[0]}/{key[1]}")
            inside = _enclosing(held.get(key, []), e)
            if inside is not None:  # inside a CPU collective's call: stretched with the call
                a, _, new_start, x = inside
                e["ts"] = new_start + (e["ts"] - a) * x
                if isinstance(e.get("dur"), (int, float)):
                    e["dur"] = e["dur"] * x
            elif index is not None:  # both ends move with the thread, so a span keeps what it held
                t = e["ts"] + offset
                start = moved.cpu_us(index, t)
                dur = e.get("dur")
                if isinstance(dur, (int, float)) and dur > 0:
                    e["dur"] = max(0.0, moved.cpu_us(index, t + dur) - start)
                e["ts"] += start - t
    doc.update(stamp)
    data = orjson.dumps(doc)
    return (gzip.compress(data, compresslevel=6) if gzipped else data), len(matched)
def _op_events(source: Path, ops: list[Op], events: list) -> tuple[list[dict], float]:
    """Each replayed op's event, in the ops' order, and the offset from trace time to workload
    time. GPU ops are the kernels, copies and sets; a trace with none (a gloo job) replays its
    collectives' outermost CPU calls (traces.kineto), matched by name and time."""
    gpu = sorted((e for e in events if isinstance(e, dict) and _is_gpu_op(e)),
                 key=lambda e: (e["ts"], to_int(e["args"]["stream"])))
    if not gpu and ops and all(isinstance(o, CollectiveOp) and not o.on_gpu for o in ops):
        by_name: dict[str, list[dict]] = {}
        for e in events:
            if isinstance(e, dict) and e.get("ph") == "X" and type(e.get("ts")) in (int, float) \
                    and isinstance(e.get("dur"), (int, float)):
                by_name.setdefault(str(e.get("name")), []).append(e)
        for first in by_name.get(ops[0].name, []):
            offset = ops[0].start_us - first["ts"]
            found = [next((e for e in by_name.get(o.name, []) if abs(e["ts"] + offset - o.start_us) <= _MATCH_US
                           and abs(e["dur"] - o.duration_us) <= _MATCH_US), None) for o in ops]
            if all(e is not None for e in found):
                return [e for e in found if e is not None], offset
        raise LagomError(f"{source}: its CPU collectives do not match the replayed workload")
    if len(gpu) != len(ops) or not ops:
        raise LagomError(f"{source}: its GPU ops do not match the replayed workload ({len(gpu)} vs {len(ops)})")
    offset = ops[0].start_us - gpu[0]["ts"]  # trace time -> workload time
    for op, e in zip(ops, gpu):
        if abs(e["ts"] + offset - op.start_us) > _MATCH_US or e["name"] != op.name:
            raise LagomError(f"{source}: its GPU ops do not match the replayed workload (at {e['name'][:40]!r})")
    return gpu, offset


def _annotation_shift(stream_spans: list[tuple[float, float, float]], event: dict) -> float:
    """A GPU annotation moves with the kernel it overlaps most on its stream (0 when none)."""
    start = event["ts"]
    end = start + (event.get("dur") or 0)
    i = bisect_right(stream_spans, (end, float("inf"), 0.0))
    best, shift = 0.0, 0.0
    for a, b, s in reversed(stream_spans[max(0, i - 8):i]):
        overlap = min(b, end) - max(a, start)
        if overlap > best:
            best, shift = overlap, s
    return shift


def _enclosing(spans: list[tuple[float, float, float, float]], event: dict) -> tuple | None:
    """The span that holds the event whole, or None; ``spans`` (a thread's outermost collective
    calls) are sorted by start and do not overlap."""
    if not spans:
        return None
    start = event["ts"]
    end = start + (event.get("dur") if isinstance(event.get("dur"), (int, float)) else 0)
    i = bisect_right(spans, (start, float("inf"), 0.0, 0.0)) - 1
    return spans[i] if i >= 0 and end <= spans[i][1] else None
