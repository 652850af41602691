"""Reading a user's input file: the one-line LagomError every loader gives for a file it cannot read.

What a path is comes first (:func:`path_kind`, :func:`check_path_kind`): every path a
command reads or writes is a regular file (or a folder where one is asked for); a
device (``/dev/zero``), a FIFO, a socket or a symbolic-link loop is refused in one line
before anything opens it (opening a FIFO blocks until a writer comes; a device reads
forever). :func:`open_regular` opens without blocking and checks again on the open file;
:func:`read_bounded` reads at most a given number of bytes, counting a gzip stream's
decompressed bytes as they come (a gzip trailer's size wraps at 4 GiB and can lie).

A missing file, an unreadable one and (for :func:`read_yaml`) one that is
not YAML each raise :class:`~nccl_env.errors.LagomError` naming the file; what the
content must be is the caller's to check, with :func:`check_keys` for the keys of a
mapping (every loader's "unknown key, did you mean ...") and :func:`check_not_empty` for
a name given as "" (which ``Path`` would read as the current folder). A YAML mapping
that gives one key twice is refused with the key named (PyYAML keeps the last silently).
"""

from __future__ import annotations

import difflib
import enum
import errno
import gzip
import os
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from nccl_env.errors import LagomError

# A tuned config, a cluster file or a plugin table is a few kilobytes; 64 MiB is far past any.
MAX_TEXT_BYTES = 64 << 20
READ_CHUNK_BYTES = 1 << 20
# How deep a YAML file's mappings and lists may nest: Lagom's deepest file (a tuned config's
# collectives[i].match.ranks) is 4 levels; 64 leaves room, and keeps PyYAML's recursive composer
# (about 3 Python frames a level) far under Python's recursion limit of 1,000.
MAX_YAML_DEPTH = 64
GZIP_MAGIC = b"\x1f\x8b"


class PathKind(enum.Enum):
    """What a path is, followed through symbolic links (the value says it in a message)."""

    MISSING = "missing"
    FILE = "a regular file"
    FOLDER = "a folder"
    FIFO = "a FIFO (named pipe)"
    CHAR_DEVICE = "a character device"
    BLOCK_DEVICE = "a block device"
    SOCKET = "a socket"
    LINK_LOOP = "a symbolic link loop"
    OTHER = "neither a file nor a folder"


def path_kind(path: str | os.PathLike) -> PathKind:
    """What ``path`` is, by ``os.stat`` (nothing is opened); MISSING for a dangling link or a missing
    parent; an OSError other than those (permission) is raised."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return PathKind.LINK_LOOP
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return PathKind.MISSING
        raise
    return _kind_of_mode(mode)


# Each kind and the stat test that tells it, in the order they are asked.
_MODE_KINDS: tuple[tuple[Callable[[int], bool], PathKind], ...] = (
    (stat.S_ISREG, PathKind.FILE),
    (stat.S_ISDIR, PathKind.FOLDER),
    (stat.S_ISFIFO, PathKind.FIFO),
    (stat.S_ISCHR, PathKind.CHAR_DEVICE),
    (stat.S_ISBLK, PathKind.BLOCK_DEVICE),
    (stat.S_ISSOCK, PathKind.SOCKET),
)


def _kind_of_mode(mode: int) -> PathKind:
    return next((kind for is_kind, kind in _MODE_KINDS if is_kind(mode)), PathKind.OTHER)


SPECIAL_KINDS = frozenset({PathKind.FIFO, PathKind.CHAR_DEVICE, PathKind.BLOCK_DEVICE, PathKind.SOCKET,
                           PathKind.LINK_LOOP, PathKind.OTHER})


def check_path_kind(path: str | os.PathLike, where: str, folder: bool = False, file: bool = True,
                    expected: str | None = None) -> PathKind:
    """``path``'s kind, or LagomError ``"{where}: is a FIFO (named pipe), expected a regular file"`` when it
    is a device, a FIFO, a socket or a link loop. MISSING is returned (the caller says what a missing path
    means: an error for an input, a new file for an output); a folder is refused unless ``folder``, a
    regular file unless ``file``. ``expected`` words what was asked for (default from those two)."""
    try:
        kind = path_kind(path)
    except OSError as exc:
        raise LagomError(f"{where}: cannot look at it: {exc.strerror or exc}") from None
    expected = expected or " or ".join(w for w, ok in (("a regular file", file), ("a folder", folder)) if ok)
    if kind in SPECIAL_KINDS or (kind is PathKind.FOLDER and not folder) or (kind is PathKind.FILE and not file):
        raise LagomError(f"{where}: is {kind.value}, expected {expected}")
    return kind


def open_regular(path: str | os.PathLike, where: str | None = None) -> BinaryIO:
    """``path`` opened for reading, binary, once it is known to be a regular file (LagomError naming
    ``where``, default the path, otherwise: missing, a folder, a device, a FIFO, a socket, a link loop).
    Opened with O_NONBLOCK and checked again on the open file, so a path swapped for a FIFO in between
    does not block either."""
    label = where or str(path)
    kind = check_path_kind(path, label)
    if kind is PathKind.MISSING:
        raise LagomError(f"{label}: no such file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise LagomError(f"{label}: no such file") from None
    except OSError as exc:
        raise LagomError(f"{label}: cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LagomError(f"{label}: is {_kind_of_mode(mode).value}, expected a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_bounded(path: str | os.PathLike, limit_bytes: int, where: str | None = None, what: str = "a file",
                 gunzip: bool = True) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), gunzipped when they are gzip
    (detected by content) and ``gunzip``; LagomError as soon as there are more than ``limit_bytes``: the
    file's real size is checked before reading, a gzip stream's decompressed bytes while it is read."""
    label = where or str(path)
    with open_regular(path, label) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit_bytes:
            raise LagomError(f"{label}: {size:,} bytes, more than the {limit_bytes:,} {what} can be here")
        head = fh.read(2)
        if not (gunzip and head == GZIP_MAGIC):
            raw = head + fh.read(limit_bytes + 1 - len(head))
            if len(raw) > limit_bytes:  # it grew since the size was read
                raise LagomError(f"{label}: more than the {limit_bytes:,} bytes {what} can be here")
            return raw
        fh.seek(0)
        return _gunzip_bounded(fh, limit_bytes, label, what)


def _gunzip_bounded(fh: BinaryIO, limit_bytes: int, label: str, what: str) -> bytes:
    pieces: list[bytes] = []
    total = 0
    try:
        with gzip.GzipFile(fileobj=fh, mode="rb") as stream:
            while piece := stream.read(READ_CHUNK_BYTES):
                total += len(piece)
                if total > limit_bytes:
                    raise LagomError(f"{label}: a gzip stream that decompresses to more than the "
                                     f"{limit_bytes:,} bytes {what} can be here (stopped reading there)")
                pieces.append(piece)
    except EOFError:
        raise LagomError(f"{label}: truncated gzip file (compressed stream ended early)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise LagomError(f"{label}: corrupt gzip file: {exc}") from None
    except OSError as exc:
        raise LagomError(f"{label}: cannot read: {exc.strerror or exc}") from None
    return b"".join(pieces)


def check_not_empty(text: object, what: str) -> None:
    """LagomError for an empty name: ``Path("")`` is the current folder, which no loader means."""
    if isinstance(text, str) and not text.strip():
        raise LagomError(f"{what}: an empty file name")


def read_text(path: Path, what: str = "a text file") -> str:
    """The file's text (a regular file of at most :data:`MAX_TEXT_BYTES`, UTF-8); LagomError
    ("PATH: no such file" / "PATH: is a FIFO ..." / "PATH: is gzip-compressed data, expected {what}" /
    "PATH: cannot read: ...") otherwise."""
    raw = read_bounded(path, MAX_TEXT_BYTES, str(path), what, gunzip=False)
    if raw[:2] == GZIP_MAGIC:
        raise LagomError(f"{path}: is gzip-compressed data (a trace?), expected {what}")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise LagomError(f"{path}: is not UTF-8 text (byte {exc.start:,}), expected {what}") from None


class _UniqueKeys:
    """A loader's constructor that refuses a mapping giving one key twice (SafeLoader keeps the last
    silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)  # type: ignore[attr-defined]  # the loader's
            try:
                first_line = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if first_line is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (lines {first_line + 1} and {key_node.start_mark.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)  # type: ignore[misc]  # the loader's SafeConstructor


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """PyYAML's pure-Python SafeLoader, unique keys, its recursive composer bounded in depth."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        """The composer's recursion, bounded: nesting past :data:`MAX_YAML_DEPTH` is an error (a 2 KB
        file of 1,000 nested lists was a RecursionError)."""
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {MAX_YAML_DEPTH} levels deep (line {mark.line + 1})", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


# libyaml's parser where PyYAML was built with it, its events built into the document by _from_events:
# 4x less CPU than PyYAML's own loader on a 20,000-entry tuned file (the pure-Python scanner and node
# graph were nearly all of plugin table's 172 s on 200,000 entries).
_C_LOADER: type | None = getattr(yaml, "CSafeLoader", None)


class _NotPlain(Exception):
    """What :func:`_from_events` leaves to PyYAML's own loader: explicit tags, merge keys, unhashable keys."""


def _nesting_error(mark: Any) -> yaml.YAMLError:
    line = mark.line + 1 if mark is not None else 0
    return yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} levels deep (line {line})",
                                       None)


def _from_events(text: str, loader_type: type) -> object:
    """The document built straight from libyaml's events, as SafeLoader builds it (scalars resolved and
    constructed by PyYAML's own resolver and constructors) but without its node graph, which took 10x the
    file in memory and most of the time: a key given twice and nesting past :data:`MAX_YAML_DEPTH` are
    errors; _NotPlain for what it leaves to the full loader."""
    loader = loader_type("")
    tags: dict[tuple[str, object], str] = {}  # a scalar's resolved tag, by its text and style
    anchors: dict[str, object] = {}
    stack: list[tuple[object, list]] = []  # (container, [pending key, its line, seen keys' lines])
    root: list[object] = []
    str_tag = "tag:yaml.org,2002:str"

    def add(value: object, mark: Any) -> None:
        if not stack:
            root.append(value)
            return
        container, state = stack[-1]
        if isinstance(container, list):
            container.append(value)
        elif state[0] is _NO_KEY:
            try:
                first = state[2].get(value)
            except TypeError:
                raise _NotPlain from None  # an unhashable key: PyYAML's own error says so
            line = mark.line if mark is not None else 0
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {value!r} (lines {first + 1} and {line + 1})", mark)
            state[0], state[1] = value, line
        else:
            state[2][state[0]] = state[1]
            container[state[0]] = value  # type: ignore[index]  # a dict here
            state[0] = _NO_KEY

    events: Iterator[Any] = yaml.parse(text, Loader=loader_type)  # libyaml's events (its own Mark type)
    for event in events:
        kind = type(event)
        if kind is yaml.ScalarEvent:
            if event.tag is not None and event.tag != "!":
                raise _NotPlain
            key = (event.value, event.implicit)
            tag = tags.get(key)
            if tag is None:
                tag = tags[key] = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
                if tag not in loader.yaml_constructors:  # a merge key, '=': PyYAML's own handling
                    raise _NotPlain
            value: object = event.value if tag == str_tag else loader.construct_object(
                yaml.ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style))
            if event.anchor is not None:
                anchors[event.anchor] = value
            add(value, event.start_mark)
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            if event.tag is not None and event.tag != "!" or len(stack) >= MAX_YAML_DEPTH:
                if len(stack) >= MAX_YAML_DEPTH:
                    raise _nesting_error(event.start_mark)
                raise _NotPlain
            made: object = {} if kind is yaml.MappingStartEvent else []
            if event.anchor is not None:
                anchors[event.anchor] = made
            add(made, event.start_mark)
            stack.append((made, [_NO_KEY, 0, {}]))
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            stack.pop()
        elif kind is yaml.AliasEvent:
            if event.anchor not in anchors:
                raise _NotPlain  # PyYAML's own error names it
            add(anchors[event.anchor], event.start_mark)
    if len(root) > 1:
        raise _NotPlain  # several documents: PyYAML's own error
    return root[0] if root else None


_NO_KEY = object()


def load_yaml_text(text: str) -> object:
    """YAML text parsed as ``yaml.safe_load`` does, except that a key given twice in one mapping is an
    error (yaml.YAMLError) naming it, and nesting past :data:`MAX_YAML_DEPTH` levels is one too."""
    if _C_LOADER is not None:
        try:
            return _from_events(text, _C_LOADER)
        except _NotPlain:
            pass  # the full loader: its nesting bounded by _from_events, which read the whole document
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path, what: str = "a YAML file") -> object:
    """The file parsed as YAML; LagomError with the parser's first line when it is not YAML, or
    gives one key twice in a mapping."""
    text = read_text(path, what)
    try:
        return load_yaml_text(text)
    except yaml.YAMLError as exc:
        lines = str(exc).splitlines()
        first = next((line for line in lines if line.startswith("duplicate key")), lines[0] if lines else "parse error")
        raise LagomError(f"{path}: not valid YAML: {first}") from None


def check_keys(mapping: dict, known: Iterable[str], where: str) -> None:
    """LagomError ``"{where}: unknown key 'colectives' (did you mean 'collectives'?)"`` for the first key of
    ``mapping`` not in ``known``; the suggestion is the closest known key, when one is close."""
    names = list(known)
    for key in mapping:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"
            raise LagomError(f"{where}: unknown key {key!r}{hint}")
