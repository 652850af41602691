"""Traces parsed once: a file's parse kept in the user's cache folder and reused while the file is unchanged.

A user's session is several commands on one folder of traces (``analyze``, ``tune``, a few
``simulate`` what-ifs, ``--export-trace``); parsing each rank's JSON is most of each
command's time. :func:`cached_parse_keyed` keeps what one file's parse gives (the reader's compact
records, :func:`traces.kineto.parse_trace_file`) in ``<cache folder>/traces-<uid>/`` and
hands it back to the next command while the file is the same file:

- **Same file**: an entry is found by a hash of the file's real path, the path as given,
  its size, modification time (ns), inode and device, a hash of its bytes (BLAKE2b, about
  a second per GB: a file rewritten in place within one timestamp tick is not taken for the
  one before), and a fingerprint of the reader's own source (every ``traces/*.py`` and
  ``nccl_env/*.py``), so a changed, touched, moved, truncated or replaced file, and a
  changed reader, are read again; a file that changes while it is parsed is not kept.
- **Safe to share**: the folder is the user's own (mode 0700, owned by this uid; anything
  else and the cache is not used), an entry is used only if it is a regular file owned by
  this uid that no one else may write, and its bytes carry an HMAC-SHA256 under a key only
  this uid can read (``key``, mode 0600): nothing is unpickled that another user could have
  written or changed.
- **Bounded**: after each write the oldest entries (by last use) go until the folder holds at
  most ``LAGOM_TRACE_CACHE_BYTES`` (default 4 GiB).
- **What is built from a parse**: :func:`cached_derived` keeps a value computed from a kept
  parse beside it (``.derived``), named by the parse's entry and the value's inputs, so it is
  rebuilt whenever the parse is read again (its file changed) or the code changed (the
  fingerprint covers the builder: ``traces/`` and the ``nccl_env/`` it imports). The Kineto
  reader keeps two: the file's header and each rank's Workload as built in a job's layout
  (its path, rank, origin and world; :func:`traces.kineto.scan_file`), so a second command on
  a folder reads neither JSON nor records: a header, then each rank's Workload.
- ``LAGOM_TRACE_CACHE=off`` (or ``0``) reads every file afresh; a cache that cannot be used
  (a read-only home, a full disk) is skipped without a word, since it only saves time.

``lagom doctor`` says where the folder is and how large (:func:`cache_summary`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import pickle
import re
import secrets
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nccl_env import cache
from nccl_env.cache import cache_dir

T = TypeVar("T")

DEFAULT_MAX_BYTES = 4 << 30  # 4 GiB: ~1,200 ranks of the 20 MB shared trace (a 2.2 MB parse, a 1.2 MB build)
_MAGIC = b"LAGOM-TRACE-PARSE-1\n"
_DIGEST_BYTES = 32  # HMAC-SHA256
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.parse")


@dataclass
class CacheStats:
    """What this process's reads found (tests and ``--json`` read it); ``derived_*``: the values
    :func:`cached_derived` found, built and kept."""

    hits: int = 0
    misses: int = 0
    stored: int = 0
    derived_hits: int = 0
    derived_misses: int = 0
    derived_stored: int = 0


STATS = CacheStats()
_fingerprint: str | None = None
# every variable that decides where (and whether) parses are kept: a process that reads for another
# one (a worker of lagom.orchestration.rank_pool) is given these
TRACE_CACHE_ENV_NAMES = (*cache.CACHE_DIR_ENV_NAMES, "LAGOM_TRACE_CACHE", "LAGOM_TRACE_CACHE_BYTES")


def enabled() -> bool:
    return os.environ.get("LAGOM_TRACE_CACHE", "on").strip().lower() not in ("off", "0", "no", "false")


def max_bytes() -> int:
    raw = os.environ.get("LAGOM_TRACE_CACHE_BYTES", "")
    try:
        return max(0, int(raw)) if raw.strip() else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


def folder() -> Path:
    """The cache's folder (not created)."""
    return cache_dir() / f"traces-{os.geteuid()}"


def reader_fingerprint() -> str:
    """A hash of the reader's and builder's source (every module of ``traces/`` and of the
    ``nccl_env/`` it imports) and of this Python: a parse, and what is built from it, is reused
    only by the code that made it."""
    global _fingerprint
    if _fingerprint is None:
        h = hashlib.sha256(f"{sys.version_info[:2]}|{pickle.HIGHEST_PROTOCOL}".encode())
        for source in fingerprint_sources():
            h.update(f"{source.parent.name}/{source.name}".encode())
            h.update(source.read_bytes())
        _fingerprint = h.hexdigest()
    return _fingerprint


def fingerprint_sources() -> list[Path]:
    """The modules :func:`reader_fingerprint` hashes: ``traces/`` and ``nccl_env/``."""
    here = Path(__file__).parent
    return [*sorted(here.glob("*.py")), *sorted((here.parent / "nccl_env").glob("*.py"))]


def _owned_private(st: os.stat_result, mode_mask: int) -> bool:
    return st.st_uid == os.geteuid() and not (st.st_mode & mode_mask)


def _private_folder() -> Path | None:
    """The user's cache folder, created 0700; None where it is not this user's alone."""
    try:
        where = folder()
        where.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(where)
    except Exception:  # OSError, cache_dir's LagomError: the cache only saves time
        return None
    if not stat.S_ISDIR(st.st_mode) or not _owned_private(st, 0o077):
        return None
    return where


def _key(where: Path) -> bytes | None:
    """This user's HMAC key (made once, mode 0600)."""
    path = where / "key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    except OSError:
        return None
    else:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    key = _read_private(path, 0o077)
    return key if key is not None and len(key) == 32 else None


def _read_private(path: Path, mode_mask: int) -> bytes | None:
    """A regular file's bytes, where it is not a link and this user alone owns it and may write it
    (``mode_mask``: the mode bits no one else may have); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or not _owned_private(st, mode_mask):
            return None
        return f.read()


def _content_digest(path: Path) -> str:
    with open(path, "rb") as f:
        h = hashlib.blake2b(digest_size=32)
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _entry_name(path: Path, st: os.stat_result, digest: str) -> str:
    ident = "|".join(str(v) for v in (os.path.realpath(path), path, st.st_size, st.st_mtime_ns, st.st_ino,
                                       st.st_dev, digest, reader_fingerprint()))
    return hashlib.sha256(ident.encode()).hexdigest() + ".parse"


def _load(entry: Path, key: bytes) -> object | None:
    data = _read_private(entry, 0o022)
    if data is None:
        return None  # not a file this user alone wrote: never unpickled
    head = len(_MAGIC) + _DIGEST_BYTES
    if len(data) < head or not data.startswith(_MAGIC):
        return None
    body = memoryview(data)[head:]
    if not hmac.compare_digest(data[len(_MAGIC):head], hmac.new(key, body, hashlib.sha256).digest()):
        return None
    try:
        value = pickle.loads(body)
    except Exception:  # an entry of another Lagom build: read the file again
        return None
    with contextlib.suppress(OSError):
        os.utime(entry)  # its last use, for the eviction order
    return value


def _store(where: Path, entry: Path, key: bytes, value: object) -> bool:
    body = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    tmp = where / f".{entry.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC)
            f.write(hmac.new(key, body, hashlib.sha256).digest())
            f.write(body)
        os.replace(tmp, entry)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False
    _evict(where, max_bytes())
    return True


def _entries(where: Path) -> list[tuple[float, int, Path]]:
    out = []
    for entry in [*where.glob("*.parse"), *where.glob("*.derived")]:
        try:
            st = os.lstat(entry)
        except OSError:
            continue
        out.append((st.st_mtime, st.st_size, entry))
    return out


def _evict(where: Path, limit: int) -> None:
    entries = sorted(_entries(where))
    total = sum(size for _, size, _ in entries)
    for _, size, entry in entries:
        if total <= limit:
            break
        with contextlib.suppress(OSError):
            entry.unlink()
            total -= size


def _opened() -> tuple[Path, bytes] | None:
    """The cache's folder and key, None where the cache is off or cannot be used."""
    where = _private_folder() if enabled() else None
    key = _key(where) if where is not None else None
    return (where, key) if where is not None and key is not None else None


def cached_parse_keyed(path: Path, parse: Callable[[Path], T],
                       known: FileIdentity | None = None) -> tuple[T, str | None]:
    """``parse(path)``, or what it gave for this very file before, and the name of its entry: what
    :func:`cached_derived` keeps values built from this parse under (None: the cache is not used,
    or the file changed while read). ``known``: what :func:`file_identity` just found for ``path``
    (not hashed twice)."""
    opened = _opened()
    if opened is None:
        return parse(path), None
    where, key = opened
    try:
        before, digest = known if known is not None else (os.stat(path), _content_digest(path))
    except OSError:
        return parse(path), None  # parse names the problem in its one line
    entry = where / _entry_name(path, before, digest)
    found = _load(entry, key)
    if found is not None:
        STATS.hits += 1
        return found, entry.name  # type: ignore[return-value]
    STATS.misses += 1
    value = parse(path)
    try:
        after = os.stat(path)
    except OSError:
        return value, None
    if _entry_name(path, after, digest) != entry.name:  # changed while it was read
        return value, None
    if _store(where, entry, key, value):
        STATS.stored += 1
    return value, entry.name


FileIdentity = tuple[os.stat_result, str]  # a file's stat and the digest of its bytes


def file_identity(path: Path) -> tuple[FileIdentity, str] | None:
    """``path`` as it is now (its stat and digest) and the name its parse is kept under; None where
    the cache is not used or the file cannot be read."""
    if not enabled() or _private_folder() is None:
        return None
    try:
        known = (os.stat(path), _content_digest(path))
    except OSError:
        return None
    return known, _entry_name(path, *known)


def _derived_entry(where: Path, parse_entry: str, inputs: tuple) -> Path:
    ident = f"{parse_entry}|{inputs!r}"
    return where / (hashlib.sha256(ident.encode()).hexdigest() + ".derived")


def cached_derived(parse_entry: str | None, inputs: tuple, build: Callable[[], T]) -> T:
    """``build()``, or what it gave before for the parse kept as ``parse_entry`` (the name
    :func:`cached_parse_keyed` gave; None: just build) and the same ``inputs`` (plain values whose
    ``repr`` names them: what ``build`` reads besides that parse). The entry goes when the parse's
    does: its file changed, or the code (the parse's name holds the fingerprint)."""
    opened = _opened() if parse_entry is not None else None
    if parse_entry is None or opened is None:
        return build()
    where, key = opened
    entry = _derived_entry(where, parse_entry, inputs)
    found = _load(entry, key)
    if found is not None:
        STATS.derived_hits += 1
        return found  # type: ignore[return-value]
    STATS.derived_misses += 1
    value = build()
    if _store(where, entry, key, value):
        STATS.derived_stored += 1
    return value


def derived_is_kept(parse_entry: str, inputs: tuple) -> bool:
    """Whether :func:`cached_derived` holds an entry for that parse and those inputs (not read: the
    read that uses it checks it)."""
    where = _private_folder() if enabled() else None
    return where is not None and _derived_entry(where, parse_entry, inputs).is_file()


def kept_derived(parse_entry: str, inputs: tuple) -> object | None:
    """What :func:`cached_derived` keeps for that parse and those inputs, None where nothing is kept.
    Found, it counts as a hit of the parse (the file's read answered from the cache)."""
    opened = _opened()
    found = _load(_derived_entry(opened[0], parse_entry, inputs), opened[1]) if opened is not None else None
    if found is not None:
        STATS.hits += 1
    return found


def load_kept(entry_name: str) -> object | None:
    """The value kept as ``entry_name`` (a name :func:`cached_parse_keyed` gave), None where it is not
    (evicted, another user's, tampered with, the cache off)."""
    opened = _opened() if _ENTRY_NAME.fullmatch(entry_name) else None
    return _load(opened[0] / entry_name, opened[1]) if opened is not None else None


def cache_summary() -> tuple[Path, int, int] | None:
    """(folder, entries, bytes) of the cache, for ``lagom doctor``; None where it cannot be used."""
    where = _private_folder()
    if where is None:
        return None
    entries = _entries(where)
    return where, len(entries), sum(size for _, size, _ in entries)
