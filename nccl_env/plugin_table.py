"""The tuner plugin's table: NVIDIA's example CSV format plus Lagom's keyed extra fields.

One entry per line (docs/plugin.md has the full description)::

    collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]][,key=value...]

``-1`` means "any" (match fields) or "NCCL decides" (settings); ``#`` starts a
comment. Lagom's extra settings follow the ten positional fields as ``key=value``
(today only ``chunk_bytes=N``, for NCCL >= 2.30's getChunkSize). NVIDIA's example
plugin stops reading after ten fields, so it still reads Lagom's lines (without the
chunk size). :func:`parse_table` accepts and rejects exactly the lines the C plugin
does (the tests check this against the compiled library).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, KNOBS, PROTOCOL, Knob
from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol

MAX_CHANNELS = 64  # MAXCHANNELS from NCCL 2.25; the plugin's upper bound (NCCL caps lower)
MAX_CHUNK_BYTES = 1 << 30  # same cap as MAX_CHUNK_BYTES in plugin/lagom_tuner.c
MAX_FIELDS = 32  # same as MAX_FIELDS in the C parser
UINT64_MAX = (1 << 64) - 1
INT_MAX = (1 << 31) - 1

# The collectives NCCL asks a tuner plugin about (ncclFunc_t 0..4); p2p never reaches it.
PLUGIN_COLLECTIVES = (
    CollectiveType.BROADCAST,
    CollectiveType.REDUCE,
    CollectiveType.ALLGATHER,
    CollectiveType.REDUCESCATTER,
    CollectiveType.ALLREDUCE,
)
_COLL_BY_KEY = {c.value: c for c in PLUGIN_COLLECTIVES}
_ALGO_BY_KEY = {a.nccl_name.replace("_", ""): a for a in Algorithm}
_PROTO_BY_KEY = {p.nccl_name: p for p in Protocol}

HEADER = (
    "# Lagom tuner plugin table (docs/plugin.md). First matching line wins; -1 = any / NCCL decides.\n"
    "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff[,chunk_bytes=N]\n"
)


_PLUGIN_KNOBS = tuple(knob for knob in KNOBS if knob.plugin_column is not None)
_OTHER_KNOBS = tuple(knob for knob in KNOBS if knob.plugin_column is None)


def plugin_settings(config: CommConfig, carried: Iterable[str] | None = None) -> CommConfig:
    """``config``'s knobs that have a plugin column (of those, only the ``carried`` fields if given)."""
    if all(k.get(config) is None for k in _OTHER_KNOBS) and (
            carried is None or all(k.field in carried or k.get(config) is None for k in _PLUGIN_KNOBS)):
        return config  # nothing to drop (most entries: a table of 200,000 asks this 250,000 times)
    values = {knob.field: knob.get(config) for knob in _PLUGIN_KNOBS if carried is None or knob.field in carried}
    return CommConfig(**{name: value for name, value in values.items() if value is not None})


@dataclass(frozen=True)
class PluginEntry:
    """One table line: its match fields (``None`` is ``-1``: any) and the knobs it sets
    (``settings``, only knobs with a plugin column; ``None``: NCCL decides)."""

    collective: CollectiveType | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    nodes: int | None = None
    ranks: int | None = None
    pipe_ops: int | None = None
    reg_buff: int | None = None
    settings: CommConfig = CommConfig()

    def __post_init__(self) -> None:
        if any(k.get(self.settings) is not None for k in _OTHER_KNOBS):
            raise ValueError("a plugin line sets only knobs with a plugin column")

    def matches(self, collective: CollectiveType, nbytes: int, nodes: int, ranks: int,
                pipe_ops: int | None = None, reg_buff: int | None = None) -> bool:
        """The plugin's match rule (``None`` inputs are not matched on, as in getChunkSize)."""
        return (
            (self.collective is None or self.collective == collective)
            and (self.min_bytes is None or nbytes >= self.min_bytes)
            and (self.max_bytes is None or nbytes <= self.max_bytes)
            and (self.nodes is None or self.nodes == nodes)
            and (self.ranks is None or self.ranks == ranks)
            and (self.pipe_ops is None or pipe_ops is None or self.pipe_ops == pipe_ops)
            and (self.reg_buff is None or reg_buff is None or self.reg_buff == reg_buff)
        )


def check_entry(entry: PluginEntry, index: int) -> None:
    """Raise LagomError (naming entry ``index``) for a line the C plugin would reject."""

    def bad(msg: str) -> LagomError:
        return LagomError(f"plugin entry {index}: {msg}")

    if entry.collective is not None and entry.collective not in PLUGIN_COLLECTIVES:
        raise bad(f"collective {entry.collective.value} never reaches a tuner plugin (NCCL asks only about "
                  f"{', '.join(c.value for c in PLUGIN_COLLECTIVES)})")
    checked = [("min_bytes", entry.min_bytes, 0, UINT64_MAX), ("max_bytes", entry.max_bytes, 0, UINT64_MAX),
               *((c.knob.field, c.knob.get(entry.settings), 1, c.most) for c in COLUMNS if c.position == 5),
               ("nodes", entry.nodes, 1, INT_MAX), ("ranks", entry.ranks, 1, INT_MAX),
               ("pipe_ops", entry.pipe_ops, 1, INT_MAX), ("reg_buff", entry.reg_buff, 0, 1),
               *((c.knob.field, c.knob.get(entry.settings), 1, c.most) for c in COLUMNS if c.position is None)]
    for name, value, lo, hi in checked:
        if value is not None and not lo <= value <= hi:
            raise bad(f"{name}={value} outside {lo}-{hi}")
    if entry.min_bytes is not None and entry.max_bytes is not None and entry.min_bytes > entry.max_bytes:
        raise bad(f"min_bytes={entry.min_bytes} is larger than max_bytes={entry.max_bytes}")


def format_line(entry: PluginEntry) -> str:
    """One CSV line (no newline) for ``entry``; all ten positional fields, then keyed extras."""

    def num(v: int | None) -> str:
        return "-1" if v is None else str(int(v))

    fields = [
        "-1" if entry.collective is None else entry.collective.value,
        "0" if entry.min_bytes is None else str(int(entry.min_bytes)),
        num(entry.max_bytes),
        *(c.write(c.knob.get(entry.settings)) for c in POSITIONAL_COLUMNS),
        num(entry.nodes),
        num(entry.ranks),
        num(entry.pipe_ops),
        num(entry.reg_buff),
    ]
    for c in KEYED_COLUMNS:
        if (value := c.knob.get(entry.settings)) is not None:
            fields.append(f"{c.name}={c.write(value)}")
    return ",".join(fields)


def format_table(entries: Iterable[PluginEntry], comments: Iterable[str] = ()) -> str:
    """The CSV the plugin reads. ``comments`` become ``#`` lines after the header.

    Raises LagomError for an entry the plugin would reject.
    """
    lines = [HEADER.rstrip("\n")]
    lines += [f"# {c}" for c in comments]
    for i, entry in enumerate(entries):
        check_entry(entry, i)
        lines.append(format_line(entry))
    return "\n".join(lines) + "\n"


def _name(token: str, table: dict, what: str):
    if token == "-1" or token.lower() == "any":
        return None
    key = token.lower().replace("_", "").replace("-", "")
    if key not in table:
        raise ValueError(f"unknown {what} '{token[:40]}'")
    return table[key]


def _is_digits(s: str) -> bool:
    return s != "" and all("0" <= ch <= "9" for ch in s)


def _int(token: str, lo: int, hi: int, what: str, allow_zero: bool = True) -> int | None:
    """Strict decimal like the C parser; -1 -> None."""
    body = token[1:] if token[:1] in "+-" else token
    if not _is_digits(body):
        raise ValueError(f"{what} '{token[:40]}' is not an integer")
    value = int(token)
    if not lo <= value <= hi or (value == 0 and not allow_zero):
        raise ValueError(f"{what} '{token[:40]}' out of range")
    return None if value == -1 else value


def _bytes(token: str, what: str) -> int | None:
    if token == "-1":
        return None
    body = token[1:] if token[:1] == "+" else token
    if not _is_digits(body) or int(body) > UINT64_MAX:
        raise ValueError(f"{what} '{token[:40]}' is not a byte count or -1")
    return int(body)


@dataclass(frozen=True)
class Column:
    """A knob's place in a table line: a positional field (``position``) or a keyed extra
    (``position`` None, written ``name=value``), how its value is written and read (ValueError
    for what the C parser rejects) and, for a number, its largest value (``most``; 0 for a name)."""

    knob: Knob[Any]
    position: int | None
    write: Callable[[Any], str]
    read: Callable[[str], Any]
    most: int = 0

    @property
    def name(self) -> str:
        assert self.knob.plugin_column is not None
        return self.knob.plugin_column


def _write_name(value: Algorithm | Protocol | None) -> str:
    return "-1" if value is None else value.nccl_name


def _write_int(value: int | None) -> str:
    return "-1" if value is None else str(int(value))


COLUMNS: tuple[Column, ...] = (
    Column(ALGORITHM, 3, _write_name, lambda t: _name(t, _ALGO_BY_KEY, "algorithm")),
    Column(PROTOCOL, 4, _write_name, lambda t: _name(t, _PROTO_BY_KEY, "protocol")),
    Column(CHANNELS, 5, _write_int, lambda t: _int(t, -1, MAX_CHANNELS, "channels", allow_zero=False),
           most=MAX_CHANNELS),
    Column(CHUNK, None, _write_int, lambda t: _int(t, -1, MAX_CHUNK_BYTES, "chunk_bytes", allow_zero=False),
           most=MAX_CHUNK_BYTES),
)
POSITIONAL_COLUMNS = tuple(sorted((c for c in COLUMNS if c.position is not None), key=lambda c: c.position or 0))
KEYED_COLUMNS = tuple(c for c in COLUMNS if c.position is None)
_KEYED_BY_NAME = {c.name: c for c in KEYED_COLUMNS}
assert {c.knob for c in COLUMNS} == {k for k in KNOBS if k.plugin_column is not None}, "a column per plugin knob"
assert [c.position for c in POSITIONAL_COLUMNS] == [3, 4, 5]


def parse_line(line: str) -> PluginEntry:
    """One non-comment, non-empty line; ValueError saying why it is rejected."""
    tokens = line.split(",")
    if len(tokens) > MAX_FIELDS:
        raise ValueError(f"more than {MAX_FIELDS} fields")
    tokens = [t.strip(" \t\r") for t in tokens]
    npos = 0
    while npos < len(tokens) and "=" not in tokens[npos]:
        npos += 1
    if npos < 8:
        raise ValueError(f"{npos} positional fields, need at least 8")
    if npos > 10:
        raise ValueError(f"{npos} positional fields, at most 10 (extras go as key=value)")
    collective = _name(tokens[0], _COLL_BY_KEY, "collective")
    min_bytes = _bytes(tokens[1], "min_bytes")
    max_bytes = _bytes(tokens[2], "max_bytes")
    if (min_bytes or 0) > (UINT64_MAX if max_bytes is None else max_bytes):
        raise ValueError("min_bytes is larger than max_bytes")
    settings = CommConfig()
    for c in POSITIONAL_COLUMNS:
        settings = c.knob.set(settings, c.read(tokens[c.position]))  # type: ignore[index]
    nodes = _int(tokens[6], -1, INT_MAX, "nNodes", allow_zero=False)
    ranks = _int(tokens[7], -1, INT_MAX, "nRanks", allow_zero=False)
    pipe_ops = _int(tokens[8], -1, INT_MAX, "numPipeOps", allow_zero=False) if npos > 8 else None
    reg_buff = _int(tokens[9], -1, 1, "regBuff") if npos > 9 else None
    seen: set[str] = set()
    for token in tokens[npos:]:
        if "=" not in token:
            raise ValueError(f"positional field '{token[:40]}' after a key=value field")
        key, _, value = token.partition("=")
        key, value = key.strip(" \t\r"), value.strip(" \t\r")
        if key not in _KEYED_BY_NAME:
            raise ValueError(f"unknown field '{key[:40]}'")
        if key in seen:
            raise ValueError(f"{key} given twice")
        seen.add(key)
        column = _KEYED_BY_NAME[key]
        settings = column.knob.set(settings, column.read(value))
    return PluginEntry(
        collective=collective,
        min_bytes=min_bytes or None,  # 0 bytes and up is "any"
        max_bytes=None if max_bytes == UINT64_MAX else max_bytes,
        nodes=nodes,
        ranks=ranks,
        pipe_ops=pipe_ops,
        reg_buff=reg_buff,
        settings=settings,
    )


def parse_table(text: str) -> tuple[list[PluginEntry], list[str]]:
    """Entries in file order, and one warning per rejected line (``line N: why``)."""
    entries: list[PluginEntry] = []
    warnings: list[str] = []
    for number, raw in enumerate(text.replace("\0", "\x7f").split("\n"), start=1):
        line = raw.split("#", 1)[0].strip(" \t\r")
        if not line:
            continue
        try:
            entries.append(parse_line(line))
        except ValueError as exc:
            warnings.append(f"line {number}: {exc}; line ignored, NCCL decides")
    return entries, warnings


def lookup(entries: Iterable[PluginEntry], collective: CollectiveType, nbytes: int, nodes: int, ranks: int,
           pipe_ops: int | None = None, reg_buff: int | None = None) -> PluginEntry | None:
    """The entry the plugin applies (first match in file order), or None."""
    for entry in entries:
        if entry.matches(collective, nbytes, nodes, ranks, pipe_ops, reg_buff):
            return entry
    return None
