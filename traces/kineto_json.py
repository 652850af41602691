"""Reading a Kineto trace file's JSON: the metadata object, then its events in chunks.

Parsing a whole trace into Python objects costs about eight times the file size in
memory. :func:`read_events` instead hands the events to a sink a few megabytes at a time
(parsed with orjson), so the sink keeps what it needs from each chunk and the rest is
dropped; the metadata (the object around ``traceEvents``) is parsed at the end.

Chunk boundaries are found without a tokenizer: a candidate boundary is a ``}``
followed by ``,`` or ``]``; the piece up to it is accepted only if ``[piece]`` parses.
Because every piece starts at an element of the events array, a piece that parses is
a whole number of elements (a cut inside a string or a nested object cannot parse).
Anything unexpected (non-object elements, a ``"traceEvents"`` key that is not the
top-level one, malformed JSON such as a ``NaN`` duration, which no JSON parser here takes,
or :data:`MAX_CUT_TRIES` failed cuts in a row) falls back to parsing the whole file, which
also gives the precise error for malformed input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import orjson

from nccl_env.errors import LagomError
from nccl_env.files import PathKind, path_kind, read_bounded
from traces import limits

CHUNK_BYTES = 4 << 20
# Candidate cuts tried per chunk before the chunked path gives up for a whole-file parse: a cut inside an
# element fails for a few candidates; a piece holding what is not JSON (NaN) fails for every one, and each
# try parses megabytes (a trace with one NaN took minutes).
MAX_CUT_TRIES = 64
_BOUNDARY = re.compile(rb"\}\s*,")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[\s*')
_SPACE = re.compile(rb"\s*")


def read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped when they are gzip (detected by content): a regular file only
    (a device, a FIFO, a socket, a link loop: LagomError before it is opened), read no further than
    :func:`traces.limits.trace_json_limit_bytes` (a gzip stream's bytes counted as they come)."""
    if path.is_dir():
        raise LagomError(f"{path}: is a directory, expected a trace file")
    if path_kind_missing(path):
        raise LagomError(f"{path}: no such file or directory")
    return read_bounded(path, limits.trace_json_limit_bytes(), str(path), "a trace")


def path_kind_missing(path: Path) -> bool:
    try:
        return path_kind(path) is PathKind.MISSING
    except OSError:
        return False  # the read says why


class EventSink(Protocol):
    def feed(self, events: list) -> None: ...


S = TypeVar("S", bound=EventSink)


def read_events(path: Path, new_sink: Callable[[], S]) -> tuple[dict, S]:
    """Feed the trace's events, chunk by chunk, to a sink from ``new_sink()``; return the
    metadata (the top-level object without ``traceEvents``) and the sink. If the chunked
    path gives up midway, a fresh sink gets all events from a whole-file parse.
    LagomError if the file is unreadable or not a trace."""
    raw = read_bytes(path)
    sink = new_sink()
    meta = _feed_chunks(raw, sink)
    if meta is not None:
        return meta, sink
    doc = _parse_whole(path, raw)
    del raw
    events = doc.pop("traceEvents")
    sink = new_sink()
    sink.feed(events)
    return doc, sink


def _parse_whole(path: Path, raw: bytes) -> dict:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise LagomError(f"{path}: not valid JSON ({exc}){_non_number(raw, exc.pos)}") from None
    if isinstance(doc, list):  # Chrome trace "JSON array" format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise LagomError(f"{path}: not a PyTorch profiler trace (no 'traceEvents' list)")
    return doc


_NON_NUMBER = re.compile(rb"-?(NaN|Infinity)")


def _non_number(raw: bytes, pos: int) -> str:
    """Where the parser stopped at a NaN or an infinity (Python's json writes them; JSON has neither):
    ", a NaN in the event that starts ..." naming the event around it; else ""."""
    m = _NON_NUMBER.match(raw, pos)
    if m is None:
        return ""
    start = raw.rfind(b"{", max(0, pos - 4096), pos)
    event = raw[start:pos].decode(errors="replace") if start >= 0 else ""
    event = event if len(event) <= 160 else event[:157] + "..."
    return f": a {m.group(1).decode()} time or value, in the event {event}{m.group(0).decode()}"


def _feed_chunks(raw: bytes, sink: EventSink) -> dict | None:
    """Metadata after feeding every chunk, or None when the chunked path does not apply."""
    key = _KEY.search(raw)
    if key is None:
        return None
    start = key.end()
    found = _array_end(raw, start)
    if found is None:
        return None
    array_end, meta = found
    pos = start
    while pos < array_end:
        chunk = None
        if array_end - pos > CHUNK_BYTES:
            m = _BOUNDARY.search(raw, pos + CHUNK_BYTES, array_end)
            tries = 0
            while m is not None:
                chunk = _elements(raw, pos, m.start() + 1)
                if chunk is not None:
                    end = m.start() + 1
                    break
                tries += 1
                if tries > MAX_CUT_TRIES:  # not a cut inside an element: the piece is not JSON (a NaN)
                    return None
                m = _BOUNDARY.search(raw, m.end(), array_end)
        if chunk is None:
            end = array_end
            chunk = _elements(raw, pos, end)
            if chunk is None:
                return None
        sink.feed(chunk)
        del chunk
        pos = _SPACE.match(raw, end).end()  # type: ignore[union-attr]  # blanks, possibly none: always matches
        if pos < array_end:
            if raw[pos:pos + 1] != b",":
                return None
            pos += 1
    return meta


def _array_end(raw: bytes, start: int) -> tuple[int, dict] | None:
    """Index of the ``]`` closing the events array, and the metadata around it.

    Tried from the back of the file: the right ``]`` is the last one for which the
    file with the array emptied parses as an object whose ``traceEvents`` is ``[]``.
    """
    if raw[start:start + 1] == b"]":
        candidates = [start]
    else:
        candidates = []
        cut = len(raw)
        while len(candidates) < 64:
            cut = raw.rfind(b"]", start, cut)
            if cut < 0:
                break
            candidates.append(cut)
    for end in candidates:
        try:
            meta = orjson.loads(raw[:start] + b"]" + raw[end + 1:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(meta, dict) and meta.get("traceEvents") == []:
            meta.pop("traceEvents")
            return end, meta
        return None  # parses, but "traceEvents" was not the top-level key
    return None


def _elements(raw: bytes, a: int, b: int) -> list | None:
    """raw[a:b] parsed as a comma-separated run of JSON values, or None if it is not one."""
    try:
        return orjson.loads(b"[" + raw[a:b] + b"]")
    except orjson.JSONDecodeError:
        return None
