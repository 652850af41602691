"""The tuned-config file (``lagom.yaml``): what ``lagom tune`` writes and ``lagom run`` applies.

Versioned YAML::

    format: lagom.tuned-config
    version: 1
    cluster: low-bw                 # preset name or cluster file it was tuned for
    nccl_version: "2.18.3"
    workload: "fsdp:llama3-8b:gpus=16"
    method: lagom
    env:                            # process-wide NCCL_* variables (strings)
      NCCL_NTHREADS: "256"
    process_groups:                 # per-communicator ncclConfig_t values
      "0": {min_ctas: 2, max_ctas: 8}
    collectives:                    # per-collective entries, first match wins
      - match: {collective: allgather, group: "0", min_bytes: 1048576, max_bytes: 1048576,
                ranks: 8, nodes: 1}  # any key left out (or null) matches anything
        set: {algorithm: ring, protocol: simple, channels: 2, chunk_bytes: 700416}
    predictions: {baseline_us: 1000.0, tuned_us: 900.0}
    notes: ["threads are process-wide: 256 chosen for all collectives"]
    requirements: ["group 0 (copy_engine): allocate the buffers of its allgather in NCCL symmetric memory ..."]

``workload`` and ``cluster`` may name files (a trace, a workload JSON, a cluster YAML): a
relative path there is relative to the tuned file's own folder (:func:`stored_path` writes
them so, :func:`resolve_stored` reads them so), never to the current folder.

``requirements`` lists what the user must turn on that no door of Lagom's can (a path's
registered buffers, the torch, NCCL and driver versions it needs); ``set`` may carry a
group's ``path`` (sm, symmetric, copy_engine, efficiency), which ``lagom run`` delivers as
the group's CTA policy.

:func:`load_tuned_config` validates a file (:func:`parse_tuned_config`, the one validator
every command's tuned file goes through) and raises LagomError with one line that names
the file and the problem.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lagom.files.output_paths import write_output
from nccl_env.env_names import check_env_names
from nccl_env.env_values import validate_env
from nccl_env.errors import LagomError
from nccl_env.files import check_keys, check_not_empty, read_yaml
from nccl_env.knob_table import GROUP_BY_KEY, validate_config
from nccl_env.knobs import CollectiveType, CommConfig
from nccl_env.nccl_releases import released_version
from nccl_env.plan import Plan, Signature
from nccl_env.rules import (
    ALGORITHM_SINCE,
    MAXCHANNELS_64_SINCE,
    TUNER_SYMBOL_SINCE,
    NcclVersion,
    max_channels,
)

TUNED_CONFIG_FORMAT = "lagom.tuned-config"
VERSION = 1

TOP_KEYS = ("format", "version", "cluster", "nccl_version", "workload", "method", "env", "process_groups",
            "collectives", "predictions", "notes", "requirements")
# Rules for a file that names no NCCL version and is read with none in force: the newest NCCL Lagom
# knows the rules of (64 channels, every algorithm), so no value a newer NCCL takes is refused.
NEWEST_RULES = max(*ALGORITHM_SINCE.values(), *TUNER_SYMBOL_SINCE.values(), MAXCHANNELS_64_SINCE)
_PG_KEYS = set(GROUP_BY_KEY)
_MATCH_KEYS = {"collective", "group", "min_bytes", "max_bytes", "ranks", "nodes"}


@dataclass(frozen=True)
class Match:
    """Which collectives an entry applies to; ``None`` = any."""

    collective: CollectiveType | None = None
    group: str | None = None
    min_bytes: int | None = None
    max_bytes: int | None = None
    ranks: int | None = None
    nodes: int | None = None

    def matches(self, collective: CollectiveType, group: str | None, nbytes: int, ranks: int | None,
                nodes: int | None) -> bool:
        if self.collective is not None and self.collective != collective:
            return False
        if self.group is not None and group is not None and self.group != group:
            return False
        if self.min_bytes is not None and nbytes < self.min_bytes:
            return False
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return False
        if self.ranks is not None and ranks is not None and self.ranks != ranks:
            return False
        return self.nodes is None or nodes is None or self.nodes == nodes

    def to_dict(self) -> dict:
        out = {
            "collective": None if self.collective is None else self.collective.value,
            "group": self.group,
            "min_bytes": self.min_bytes,
            "max_bytes": self.max_bytes,
            "ranks": self.ranks,
            "nodes": self.nodes,
        }
        return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class CollectiveEntry:
    match: Match
    config: CommConfig

    def to_dict(self) -> dict:
        return {"match": self.match.to_dict(), "set": self.config.to_dict()}


@dataclass
class TunedConfig:
    cluster: str = ""
    nccl_version: NcclVersion | None = None  # a release (nccl_env.nccl_releases); None: the file names none
    workload: str = ""
    method: str = ""
    env: dict[str, str] = field(default_factory=dict)
    process_groups: dict[str, dict[str, int | str]] = field(default_factory=dict)
    collectives: list[CollectiveEntry] = field(default_factory=list)
    predictions: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)

    def lookup(self, collective: CollectiveType, group: str | None, nbytes: int, ranks: int | None = None,
               nodes: int | None = None) -> CollectiveEntry | None:
        """First entry whose match accepts this collective, or None."""
        for entry in self.collectives:
            if entry.match.matches(collective, group, nbytes, ranks, nodes):
                return entry
        return None

    def to_plan(self, signatures: Iterable[Signature]) -> Plan:
        """The Plan this file gives a workload with these collective signatures.

        Each signature gets the ``set`` of its first matching entry; unmatched ones are
        left to NCCL. Process-wide env knobs (NCCL_NTHREADS, NCCL_BUFFSIZE) are not part
        of the Plan: evaluators read them through :attr:`env` where they model them.
        """
        entries: dict[Signature, CommConfig] = {}
        for sig in signatures:
            entry = self.lookup(sig.collective, sig.group, sig.message_bytes, sig.ranks, sig.nodes)
            if entry is not None:
                entries[sig] = entry.config
        return Plan(entries=entries)

    def to_dict(self) -> dict:
        return {
            "format": TUNED_CONFIG_FORMAT,
            "version": VERSION,
            "cluster": self.cluster,
            "nccl_version": str(self.nccl_version or ""),
            "workload": self.workload,
            "method": self.method,
            "env": dict(self.env),
            "process_groups": {k: dict(v) for k, v in self.process_groups.items()},
            "collectives": [e.to_dict() for e in self.collectives],
            "predictions": dict(self.predictions),
            "notes": list(self.notes),
            **({"requirements": list(self.requirements)} if self.requirements else {}),
        }

    def to_yaml(self) -> str:
        """The file's text; its first line is ``format: lagom.tuned-config`` (how Lagom knows its own files)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, width=100)

    def dump(self, path: str | Path, flag: str = "") -> None:
        """Write the file atomically (:func:`lagom.files.output_paths.write_output`); LagomError naming ``flag``."""
        write_output(path, self.to_yaml(), flag)


def _match_int(match: dict, key: str, minimum: int) -> int | None:
    """An integer ``match`` field (None = any); refuses fractions, booleans and text."""
    value = match.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"match.{key} must be an integer >= {minimum}, got {value!r}")
    return value


def parse_tuned_config(data: object, origin: str = "<config>", nccl_version: NcclVersion | None = None) -> TunedConfig:
    """Validate a loaded YAML document; LagomError names ``origin`` and the problem.

    This is the one validator of a tuned file, whichever command reads it: its keys (an
    unknown one gets the closest known name), its env names and values, process-group
    settings and per-collective settings by NCCL's rules (:mod:`nccl_env.env_values`,
    :func:`nccl_env.rules.validate_config`) for the NCCL in force: ``nccl_version``
    (the job's or the cluster's), else the file's own, else :data:`NEWEST_RULES`."""

    def bad(msg: str) -> LagomError:
        return LagomError(f"{origin}: {msg}")

    if not isinstance(data, dict):
        raise bad("not a Lagom tuned config (expected a YAML mapping)")
    if data.get("format") != TUNED_CONFIG_FORMAT:
        raise bad(f"not a Lagom tuned config (expected 'format: {TUNED_CONFIG_FORMAT}')")
    check_keys(data, TOP_KEYS, origin)
    try:
        version = int(data.get("version", 0))
    except (TypeError, ValueError):
        raise bad(f"'version' must be an integer, got {data.get('version')!r}") from None
    if version < 1 or version > VERSION:
        raise bad(f"version {version} is not one this Lagom reads (1..{VERSION})")
    file_version = _file_nccl_version(data.get("nccl_version"), bad)
    in_force = nccl_version or file_version or NEWEST_RULES
    env = data.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) for k in env):
        raise bad("'env' must map variable names to values")
    try:
        check_env_names(env)
        validate_env(env, in_force)
    except LagomError as exc:
        raise bad(str(exc)) from None
    pgs = data.get("process_groups") or {}
    if not isinstance(pgs, dict):
        raise bad("'process_groups' must map group names to settings")
    process_groups: dict[str, dict[str, int | str]] = {}
    for name, settings in pgs.items():
        if not isinstance(settings, dict) or set(settings) - _PG_KEYS:
            raise bad(f"process group {name!r}: settings must use only {', '.join(sorted(_PG_KEYS))}")
        process_groups[str(name)] = {k: v for k, v in settings.items() if v is not None}
        problem = _group_problem(process_groups[str(name)], in_force)
        if problem:
            raise bad(f"process group {name!r}: {problem}")
    raw_entries = data.get("collectives") or []
    if not isinstance(raw_entries, list):
        raise bad("'collectives' must be a list")
    entries = []
    for i, raw in enumerate(raw_entries):
        if (not isinstance(raw, dict) or not isinstance(raw.get("match", {}), dict)
                or not isinstance(raw.get("set"), dict)):
            raise bad(f"collectives[{i}]: needs a 'match' mapping and a 'set' mapping")
        m = raw.get("match") or {}
        unknown = set(m) - _MATCH_KEYS
        if unknown:
            raise bad(f"collectives[{i}].match: unknown key(s) {', '.join(sorted(unknown))}")
        try:
            match = Match(
                collective=None if m.get("collective") is None else CollectiveType.parse(str(m["collective"])),
                group=None if m.get("group") is None else str(m["group"]),
                min_bytes=_match_int(m, "min_bytes", 0),
                max_bytes=_match_int(m, "max_bytes", 0),
                ranks=_match_int(m, "ranks", 1),
                nodes=_match_int(m, "nodes", 1),
            )
            config = CommConfig.from_dict(raw["set"])
            validate_config(config, in_force)
        except (ValueError, KeyError, TypeError, LagomError) as exc:
            raise bad(f"collectives[{i}]: {exc}") from None
        entries.append(CollectiveEntry(match, config))
    predictions = data.get("predictions") or {}
    if not isinstance(predictions, dict):
        raise bad("'predictions' must be a mapping")
    notes = data.get("notes") or []
    if not isinstance(notes, list):
        raise bad("'notes' must be a list")
    requirements = data.get("requirements") or []
    if not isinstance(requirements, list):
        raise bad("'requirements' must be a list")
    return TunedConfig(
        cluster=str(data.get("cluster", "")),
        nccl_version=file_version,
        workload=str(data.get("workload", "")),
        method=str(data.get("method", "")),
        env={k: str(v) for k, v in env.items()},
        process_groups=process_groups,
        collectives=entries,
        predictions={str(k): v for k, v in predictions.items()},
        notes=[str(n) for n in notes],
        requirements=[str(r) for r in requirements],
    )


def _file_nccl_version(value: object, bad) -> NcclVersion | None:
    """The file's ``nccl_version`` (None when absent); a float (YAML reads 2.20 as 2.2), a non-version or a
    version NCCL never released is an error."""
    if value is None or value == "":
        return None
    try:
        return released_version(value, "nccl_version")
    except LagomError as exc:
        raise bad(str(exc)) from None


def _group_problem(settings: dict[str, int | str], version: NcclVersion) -> str | None:
    """What NCCL ``version`` would not take in one process group's ncclConfig_t settings, or None."""
    top = max_channels(version)
    for key, value in settings.items():
        if GROUP_BY_KEY[key].policy:
            try:
                GROUP_BY_KEY[key].value(value)
            except (TypeError, ValueError) as exc:
                return f"{key}: {exc}"
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            return f"{key}={value!r} is not valid on NCCL {version}: allowed an integer in 1-{top}"
    return None


def is_stored_path(text: str, kind: str) -> bool:
    """Whether a file's ``workload`` or ``cluster`` (``kind``) text names a file rather than a
    generator spec (``fsdp:llama3-8b:gpus=16``, which has a ':') or a preset name (``low-bw``),
    by the rules :func:`lagom.orchestration.workload_arg.read_workload_arg` and
    :func:`costmodel.cluster.load_cluster` read them with."""
    if not text:
        return False
    if kind == "cluster":
        return "/" in text or text.endswith((".yaml", ".yml"))
    return "/" in text or ":" not in text


def stored_path(text: str, kind: str, file_path: str | os.PathLike) -> str:
    """``text`` (a WORKLOAD or --cluster argument) as a tuned file at ``file_path`` stores it: an existing
    file under the file's folder relative to that folder, another file absolute, a spec or preset as is."""
    if not is_stored_path(text, kind) or not Path(text).exists():
        return text
    target = Path(os.path.abspath(text))
    folder = Path(os.path.abspath(file_path)).parent
    return str(target.relative_to(folder)) if target.is_relative_to(folder) else str(target)


def resolve_stored(text: str, kind: str, file_path: str | os.PathLike) -> tuple[str, str | None]:
    """(``text`` resolved against the tuned file's folder, a note or None): the absolute path of a stored
    path, or ``text`` itself for a spec or preset. A relative path not found beside the file but found
    from the current folder (a file written before paths were stored relative to it) is taken from
    there, and the note says so; found in neither: LagomError."""
    if not is_stored_path(text, kind) or os.path.isabs(text):
        return text, None
    folder = Path(os.path.abspath(file_path)).parent
    beside = folder / text
    if beside.exists():
        return str(beside), None
    if Path(text).exists():
        found = os.path.abspath(text)
        return found, (f"{file_path}: {kind} {text} is not in the file's folder ({folder}), where a tuned file's "
                       f"paths resolve; found from the current folder instead: {found}")
    raise LagomError(f"{file_path}: {kind} {text}: no such file relative to the file's folder ({folder}), "
                     f"where a tuned file's paths resolve")


def load_tuned_config(path: str | os.PathLike, nccl_version: NcclVersion | None = None,
                      flag: str = "--config") -> TunedConfig:
    """Read and validate a tuned file (:func:`parse_tuned_config`); ``flag`` names it when the name is empty."""
    check_not_empty(path, flag)
    path = Path(path)
    return parse_tuned_config(read_yaml(path), str(path), nccl_version)


def absent_group_warning(path: str, cfg: TunedConfig, groups: Iterable[str], whose: str) -> str | None:
    """One line when entries of ``cfg`` name a ``match.group`` that is none of ``groups`` (the job's,
    as ``whose`` says where they come from), else None; every command that reads a tuned file and
    knows the job's groups says it in these words. Such an entry matches no collective in
    ``lagom simulate --config`` and the hook, while the plugin's table, which cannot tell groups
    apart, carries it to every group's collectives of its type and size."""
    known = sorted(set(groups))
    absent = [(n, e.match.group) for n, e in enumerate(cfg.collectives, start=1)
              if e.match.group is not None and e.match.group not in known]
    if not known or not absent:
        return None
    names = ", ".join(repr(g) for g in sorted({g for _, g in absent}))
    one = len(absent) == 1
    return (f"{path}: {'entry' if one else 'entries'} {', '.join(str(n) for n, _ in absent)} "
            f"name{'s' if one else ''} group {names}, which {whose} does not have (its groups: "
            f"{', '.join(repr(g) for g in known)}): lagom simulate and the hook match no collective with "
            f"{'it' if one else 'them'}; the plugin's table, which cannot tell groups apart, applies "
            f"{'it' if one else 'them'} to every group's collectives of that type and size")
