"""Turn a tuned-config file (lagom.yaml) into the tuner plugin's table.

The lines are ``nccl_env.delivery``'s (:func:`~nccl_env.delivery.plugin_lines`, the
rule ``deliver`` applies to a plan): each ``collectives`` entry becomes one line, in
the same order (both are first-match-wins), with its match (collective, byte range,
ranks, nodes) and the settings the plugin carries on the file's NCCL version (all of
algorithm, protocol, channels and chunk_bytes where the file names none). This
module only formats them, with comments for what the table does not carry.
"""

from __future__ import annotations

from pathlib import Path

from lagom.files.output_paths import write_output
from lagom.files.tuned_config import TunedConfig
from nccl_env.delivery import PLUGIN_SETTINGS, PluginRule, plugin_lines
from nccl_env.errors import LagomError
from nccl_env.knob_table import CHUNK, THREADS
from nccl_env.knobs import CommConfig
from nccl_env.plugin_table import PLUGIN_COLLECTIVES, PluginEntry, format_table, plugin_settings
from nccl_env.rules import (
    CHUNK_PLUGIN_SINCE,
    TUNER_SYMBOL_SINCE,
    NcclVersion,
    per_collective_knobs,
    tuner_symbols,
)


def _version(cfg: TunedConfig) -> NcclVersion | None:
    return cfg.nccl_version


def _table(cfg: TunedConfig) -> tuple[list[PluginEntry], list[str]]:
    version = _version(cfg)
    per_coll = per_collective_knobs(version) if version is not None else frozenset(PLUGIN_SETTINGS)
    rules = [
        PluginRule(PluginEntry(collective=e.match.collective, min_bytes=e.match.min_bytes or None,
                               max_bytes=e.match.max_bytes, nodes=e.match.nodes, ranks=e.match.ranks,
                               settings=plugin_settings(e.config)),
                   e.match.group, f"entry {number}")
        for number, e in enumerate(cfg.collectives, start=1)
    ]
    return plugin_lines(rules, per_coll)


def plugin_entries_from_config(cfg: TunedConfig) -> list[PluginEntry]:
    """The plugin lines for ``cfg``'s collectives, first-match order kept (p2p entries dropped)."""
    return _table(cfg)[0]


def plugin_table_comments(cfg: TunedConfig, table_notes: list[str] | None = None) -> list[str]:
    """Comment lines for the table: what it does not carry, and why (``table_notes``: ``_table(cfg)[1]``
    where the caller has it already)."""
    comments = []
    version = _version(cfg)
    if cfg.nccl_version:
        comments.append(f"tuned for NCCL {cfg.nccl_version}, cluster {cfg.cluster or '?'}, method {cfg.method or '?'}")
    dropped = [e for e in cfg.collectives if e.match.collective is not None
               and e.match.collective not in PLUGIN_COLLECTIVES]
    if dropped:
        names = sorted({e.match.collective.value for e in dropped if e.match.collective is not None})
        comments.append(f"{len(dropped)} entries for {', '.join(names)} left out: NCCL never asks a tuner plugin "
                        f"about point-to-point traffic")
    comments += _table(cfg)[1] if table_notes is None else table_notes
    dropped_ids = {id(e) for e in dropped}  # by identity: `in` a list compared every pair (200,000 entries)
    asked = [e for e in cfg.collectives
             if id(e) not in dropped_ids and plugin_settings(e.config) != CommConfig()]
    if version is not None and asked and not tuner_symbols(version):
        oldest = min(TUNER_SYMBOL_SINCE.values())
        comments.append(f"NCCL {version} loads none of the plugin's ABIs (the oldest, v2, needs NCCL >= {oldest}): "
                        "this table has no lines; the config's env and process_groups carry what that NCCL takes")
    elif version is not None and version < CHUNK_PLUGIN_SINCE and any(CHUNK.get(e.config) is not None for e in asked):
        comments.append(f"chunk_bytes is applied only by NCCL >= {CHUNK_PLUGIN_SINCE} (tuner getChunkSize), so this "
                        f"table leaves it out; on NCCL {version} NCCL_BUFFSIZE (the config's env) carries it")
    if any(THREADS.get(e.config) is not None for e in cfg.collectives):
        comments.append("threads are process-wide (NCCL_NTHREADS in the config's env), not in this table")
    return comments


def render_plugin_table(cfg: TunedConfig) -> str:
    """The CSV text ``lagom plugin table`` prints."""
    try:
        entries, notes = _table(cfg)  # once: every entry checked and converted
        return format_table(entries, plugin_table_comments(cfg, notes))
    except LagomError as exc:
        raise LagomError(f"cannot make a plugin table: {exc}") from None


def write_plugin_table(cfg: TunedConfig, path: str | Path) -> Path:
    """Write the table for ``cfg`` to ``path``; returns the absolute path."""
    path = Path(path).resolve()
    write_output(path, render_plugin_table(cfg))
    return path
