"""What ``lagom run`` checks before the job starts, in one place: what the ranks will read.

- the file itself (:func:`lagom.files.tuned_config.load_tuned_config`: its env an
  allowlist of the NCCL knobs Lagom tunes, every value by NCCL's rules), done by the caller;
- the paths the file stores (``workload``, ``cluster``), resolved against the file's own
  folder (:func:`lagom.files.tuned_config.resolve_stored`), so that the run folder's copy,
  which the ranks read, names them absolutely;
- when the ranks need them (``lagom run --online`` with a seed and no ``--simulate``): the
  cluster loads (a preset Lagom has, a valid cluster file) and the workload reads (the
  trace or workload file, or the spec); a problem is one line and exit 2, and no job runs.
  A run that does not read them (a plain run, ``--simulate``): one that does not resolve or
  load is one note;
- the user's own NCCL variables that cap or override a tuned value
  (:mod:`nccl_env.env_effects`): one line each, naming the variable, its value and what it
  changes (a variable of the very same name as one of the file's env is said by
  :func:`lagom.runtime.env.merge_env`).

The plugin's build is checked where the run folder is laid out (lagom.runtime.launcher).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from lagom.files.tuned_config import TunedConfig, resolve_stored
from nccl_env.env_effects import EFFECTS, EnvEffect
from nccl_env.errors import LagomError
from nccl_env.files import PathKind, check_path_kind
from nccl_env.knob_table import CHANNELS, GROUP_BY_KEY


@dataclass
class Preflight:
    """The file with its stored paths resolved, and the lines to print before the job."""

    config: TunedConfig
    changed: bool = False  # a stored path was resolved: the run folder's copy is written from ``config``
    messages: list[str] = field(default_factory=list)


def preflight(config: TunedConfig, config_path: str | os.PathLike, env: Mapping[str, str],
              ranks_read_stored: bool = False, plugin_knobs: frozenset[str] = frozenset()) -> Preflight:
    """Check what the job will need (see the module doc); LagomError when the ranks would fail.
    ``ranks_read_stored``: the ranks load the file's workload and cluster (online tuning from a seed);
    ``plugin_knobs``: the knobs the tuner plugin carries per collective in this run."""
    resolved: dict[str, str] = {}
    messages: list[str] = []
    for kind in ("workload", "cluster"):
        text = getattr(config, kind)
        try:
            value, note = resolve_stored(text, kind, config_path)
            if value != text:
                _check_readable(value, f"{config_path}: {kind} {text}")
        except LagomError as exc:
            if ranks_read_stored:
                raise
            messages.append(f"lagom run: note: {exc} (this run does not read it)")
            continue
        if note:
            messages.append(f"lagom run: note: {note}")
        resolved[kind] = value
    out = replace(config, workload=resolved.get("workload", config.workload),
                  cluster=resolved.get("cluster", config.cluster))
    if ranks_read_stored:
        _check_loads(out, config_path, ("cluster", "workload"))
    elif "cluster" in resolved and out.cluster:  # one that did not resolve has its note
        try:
            _check_loads(out, config_path, ("cluster",))
        except LagomError as exc:
            messages.append(f"lagom run: note: {exc} (this run does not read it)")
    messages += conflict_lines(out, env, plugin_knobs)
    return Preflight(out, out != config, messages)


def _check_readable(path: str, where: str) -> None:
    kind = check_path_kind(path, where, folder=True)  # a FIFO, a device, a link loop: refused, never opened
    if kind is PathKind.MISSING:
        raise LagomError(f"{where}: no such file")
    if not os.access(path, os.R_OK | (os.X_OK if kind is PathKind.FOLDER else 0)):
        raise LagomError(f"{where}: not readable by this user")


def _check_loads(config: TunedConfig, config_path: str | os.PathLike, kinds: tuple[str, ...]) -> None:
    """The cluster and workload the ranks will load, loaded here first (one line, exit 2, no job)."""
    from costmodel.cluster import load_cluster
    from lagom.orchestration.workload_arg import read_workload_arg

    loaders: dict[str, Callable[[str], object]] = {"cluster": load_cluster, "workload": read_workload_arg}
    for kind in kinds:
        load, text = loaders[kind], getattr(config, kind)
        if not text:
            raise LagomError(f"{config_path}: names no {kind}, which online tuning from it needs")
        try:
            load(text)
        except LagomError as exc:
            raise LagomError(f"{config_path}: {kind}: {exc}") from None


def conflict_lines(config: TunedConfig, env: Mapping[str, str],
                   plugin_knobs: frozenset[str] = frozenset()) -> list[str]:
    """One line per user variable in ``env`` that caps or overrides one of ``config``'s tuned values
    (``plugin_knobs``: those the tuner plugin carries per collective in this run)."""
    lines = []
    for effect in EFFECTS:
        value = env.get(effect.name)
        if value is None:
            continue
        line = _conflict(effect, value, config, effect.knob.field in plugin_knobs)
        if line:
            lines.append(f"lagom run: your {effect.name}={value} {line}")
    return lines


def _conflict(effect: EnvEffect, value: str, config: TunedConfig, plugin_carried: bool) -> str:
    knob = effect.knob
    shown: list[object] = []
    entries = 0
    for entry in config.collectives:
        tuned = knob.get(entry.config)
        if tuned is not None and effect.touches(value, tuned, entry.config, entry.match.collective, plugin_carried):
            shown.append(tuned)
            entries += 1
    groups = []
    for name, settings in sorted(config.process_groups.items()):
        for key, tuned in sorted(settings.items()):
            row = GROUP_BY_KEY.get(key)
            if row is not None and row.carries is knob and effect.touches(value, tuned):
                shown.append(tuned)
                groups.append(f"{name!r} ({key} {tuned})")
    file_env = [f"{name}={tuned}" for name, tuned in sorted(config.env.items())
                if knob is CHANNELS and name in knob.env and name != effect.name and tuned.isdigit()
                and effect.touches(value, int(tuned))]
    shown += [int(item.split("=")[1]) for item in file_env]
    if not shown:
        return ""
    where = []
    if entries:
        where.append(f"{entries} collective entr{'y' if entries == 1 else 'ies'}")
    if groups:
        where.append(f"process group{'s' if len(groups) > 1 else ''} {', '.join(groups)}")
    if file_env:
        where.append(f"the file's {', '.join(file_env)}")
    return f"{effect.effect.value} the tuned {_values(knob, shown)} {knob.key} of {' and '.join(where)}"


def _values(knob, values: list[object]) -> str:
    """``8-12`` for numbers, ``ring, tree`` for choices."""
    if all(type(v) is int for v in values):  # not an enum's member (Algorithm is an IntEnum)
        numbers = sorted(int(v) for v in values)  # type: ignore[call-overload]
        return str(numbers[0]) if numbers[0] == numbers[-1] else f"{numbers[0]}-{numbers[-1]}"
    return ", ".join(sorted({knob.shown(v) for v in values}))


def copy_text(pre: Preflight, config_path: Path) -> bytes:
    """What the run folder's copy of the file holds: the file as given, or with its paths resolved."""
    return pre.config.to_yaml().encode() if pre.changed else config_path.read_bytes()
