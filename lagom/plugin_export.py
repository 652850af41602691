"""Turn a tuned-config file (lagom.yaml) into the tuner plugin's table.

Each ``collectives`` entry becomes one plugin line, in the same order (both are
first-match-wins): its match (collective, byte range, ranks, nodes) and the
per-collective part of its ``set`` (algorithm, protocol, channels, chunk_bytes).
Threads are process-wide (``env``), so they are not in the table. Process-group
names cannot be matched inside the plugin: NCCL does not tell a tuner plugin which
communicator's group it serves. The table says so in a comment where entries differ
only by group.
"""

from __future__ import annotations

from pathlib import Path

from lagom.tuned_config import CollectiveEntry, TunedConfig
from nccl_env.errors import LagomError
from nccl_env.plugin_table import PLUGIN_COLLECTIVES, PluginEntry, format_table
from nccl_env.rules import CHUNK_PLUGIN_SINCE, TUNER_SYMBOL_SINCE, NcclVersion, tuner_symbols


def _entry(entry: CollectiveEntry) -> PluginEntry:
    m, s = entry.match, entry.config
    return PluginEntry(
        collective=m.collective,
        min_bytes=m.min_bytes or None,
        max_bytes=m.max_bytes,
        algorithm=s.algorithm,
        protocol=s.protocol,
        channels=s.channels,
        nodes=m.nodes,
        ranks=m.ranks,
        chunk_bytes=s.chunk_bytes,
    )


def _usable(entry: CollectiveEntry) -> bool:
    return entry.match.collective is None or entry.match.collective in PLUGIN_COLLECTIVES


def plugin_entries_from_config(cfg: TunedConfig) -> list[PluginEntry]:
    """The plugin lines for ``cfg``'s collectives, first-match order kept; p2p entries dropped."""
    return [_entry(e) for e in cfg.collectives if _usable(e)]


def plugin_table_comments(cfg: TunedConfig) -> list[str]:
    """Comment lines for the table: what could not be carried, and group ambiguities."""
    comments = []
    if cfg.nccl_version:
        comments.append(f"tuned for NCCL {cfg.nccl_version}, cluster {cfg.cluster or '?'}, method {cfg.method or '?'}")
    dropped = [e for e in cfg.collectives if not _usable(e)]
    if dropped:
        names = sorted({e.match.collective.value for e in dropped if e.match.collective is not None})
        comments.append(f"{len(dropped)} entries for {', '.join(names)} left out: NCCL never asks a tuner plugin "
                        f"about point-to-point traffic")
    kept = [e for e in cfg.collectives if _usable(e)]
    seen: dict[tuple, tuple[int, CollectiveEntry]] = {}
    for line, entry in enumerate(kept, start=1):
        m = entry.match
        key = (m.collective, m.min_bytes, m.max_bytes, m.ranks, m.nodes)
        if key in seen:
            first_line, first = seen[key]
            if first.config != entry.config and first.match.group != m.group:
                comments.append(
                    f"entries {first_line} and {line} differ only by process group ({first.match.group!r} vs "
                    f"{m.group!r}); the plugin cannot see process groups, so entry {first_line} applies to both"
                )
        else:
            seen[key] = (line, entry)
    try:
        version = NcclVersion.parse(cfg.nccl_version) if cfg.nccl_version else None
    except LagomError:
        version = None
    if version is not None and kept and not tuner_symbols(version):
        oldest = min(TUNER_SYMBOL_SINCE.values())
        comments.append(f"NCCL {version} loads none of the plugin's ABIs (the oldest, v2, needs NCCL >= {oldest}): "
                        "this table has no "
                        f"effect there; the config's env and process_groups carry what that NCCL takes")
    elif (version is not None and version < CHUNK_PLUGIN_SINCE
          and any(e.config.chunk_bytes is not None for e in kept)):
        comments.append(f"chunk_bytes is applied only by NCCL >= {CHUNK_PLUGIN_SINCE} (tuner getChunkSize); "
                        f"on NCCL {version} use NCCL_BUFFSIZE (the config's env)")
    if any(e.config.threads is not None for e in cfg.collectives):
        comments.append("threads are process-wide (NCCL_NTHREADS in the config's env), not in this table")
    return comments


def render_plugin_table(cfg: TunedConfig) -> str:
    """The CSV text ``lagom plugin table`` prints."""
    try:
        return format_table(plugin_entries_from_config(cfg), plugin_table_comments(cfg))
    except LagomError as exc:
        raise LagomError(f"cannot make a plugin table: {exc}") from None


def write_plugin_table(cfg: TunedConfig, path: str | Path) -> Path:
    """Write the table for ``cfg`` to ``path``; returns the absolute path."""
    path = Path(path).resolve()
    text = render_plugin_table(cfg)
    try:
        path.write_text(text)
    except OSError as exc:
        raise LagomError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path
