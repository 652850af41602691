"""NCCL's knobs as Lagom sets them: one row per ``CommConfig`` field.

A row says how the knob is spelled (``CommConfig`` field, ``--set`` names, env variables,
plugin-table column, the report's short prefix), through which door it reaches NCCL on a
given version (:meth:`Knob.scope`) and which values the search space tries
(:attr:`Knob.ladder`). The search space, ``--set``, delivery's env names and the tests
read the rows instead of naming knobs. When NCCL adds or moves a knob (2.30's
``getChunkSize``, 2.31's per-call ``ncclCollConfig_t``), its row changes here.

Doors (``nccl_env.delivery``, sources in ``nccl_env.rules``): per collective through Lagom's
tuner plugin (algorithm, protocol, channels from 2.21; chunk from 2.30, v6 getChunkSize);
per function for NCCL_ALGO/NCCL_PROTO's ``func:list`` syntax from 2.24; per process group
(``ncclConfig_t`` minCTAs/maxCTAs from 2.17, CTAPolicy for the path); else process-wide env.
NCCL 2.31's per-call ``ncclCollConfig_t`` (minCTAs/maxCTAs, algSelection) is a second door for
channels and the algorithm where the running torch takes it (``lagom.runtime.coll_config``,
decided at run time): their scope stays the collective, so no row changes for it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

from nccl_env.errors import LagomError
from nccl_env.knobs import (
    FILE_KEYS,
    Algorithm,
    CollectiveType,
    CommConfig,
    CommPath,
    CtaPolicy,
    Protocol,
    cta_policy_value,
)
from nccl_env.rules import (
    ALGORITHM_SINCE,
    CHUNK_GRAIN_BYTES,
    CHUNK_MAX_BYTES,
    CHUNK_PLUGIN_SINCE,
    CTA_POLICY_SINCE,
    CTAS_ENV_SINCE,
    LL128_THREADS_MAX,
    LL128_THREADS_MIN,
    PATH_SINCE,
    PER_FUNCTION_ALGO_SINCE,
    THREADS_MAX,
    THREADS_MIN,
    TUNER_SYMBOL_SINCE,
    WARP_SIZE,
    NcclVersion,
    algorithms_available,
    max_channels,
    max_chunk_bytes,
    paths_available,
)


class Scope(enum.Enum):
    """The narrowest set of collectives that must share one value of a knob."""

    COLLECTIVE = "collective"
    GROUP = "group"
    FUNCTION = "function"
    PROCESS = "process"


# NCCL_NTHREADS: a multiple of 32 in 64..512 (NCCL src/init.cc, ncclParamNthreads checks).
THREAD_LADDER = (64, 128, 192, 256, 384, 512)
# Channels: roughly x1.5 rungs up to NCCL's MAXCHANNELS (32 before 2.25, 64 from 2.25).
CHANNEL_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Chunk bytes: x sqrt(2) rungs from 128 KiB to 4 MiB (NCCL's Simple ring default is 2 MiB,
# BUFFSIZE 4 MiB / 8 steps x 4; docs/tuner.md), rounded to 4 KiB.
CHUNK_LADDER_MIN_BYTES = 128 * 1024
CHUNK_LADDER_MAX_BYTES = 4 * 1024 * 1024


def chunk_ladder() -> tuple[int, ...]:
    values = []
    value = float(CHUNK_LADDER_MIN_BYTES)
    while value <= CHUNK_LADDER_MAX_BYTES * 1.0001:
        values.append(int(round(value / 4096)) * 4096)
        value *= math.sqrt(2.0)
    return tuple(values)


# A knob's check: (its value, the whole config, the NCCL, NCCL_BUFFSIZE if known) -> what is
# allowed when the value is not, else None (sources beside each bound in nccl_env.rules).
Validator = Callable[[object, CommConfig, NcclVersion, int | None], str | None]


def _check_algorithm(value: object, config: CommConfig, version: NcclVersion, buffsize: int | None) -> str | None:
    available = algorithms_available(version)
    if value in available:
        return None
    assert isinstance(value, Algorithm)
    return f"{', '.join(a.nccl_name for a in available)} (from {ALGORITHM_SINCE[value]})"


def _check_channels(value: object, config: CommConfig, version: NcclVersion, buffsize: int | None) -> str | None:
    top = max_channels(version)
    return None if 1 <= int(value) <= top else f"1-{top}"  # type: ignore[call-overload]


def _check_threads(value: object, config: CommConfig, version: NcclVersion, buffsize: int | None) -> str | None:
    ll128 = PROTOCOL.get(config) is Protocol.LL128
    lo, hi = (LL128_THREADS_MIN, LL128_THREADS_MAX) if ll128 else (THREADS_MIN, THREADS_MAX)
    count = int(value)  # type: ignore[call-overload]
    if lo <= count <= hi and count % WARP_SIZE == 0:
        return None
    return f"a multiple of {WARP_SIZE} in {lo}-{hi} ({'LL128' if ll128 else 'LL/Simple'})"


def _check_path(value: object, config: CommConfig, version: NcclVersion, buffsize: int | None) -> str | None:
    assert isinstance(value, CommPath)
    if version >= PATH_SINCE[value]:
        return None
    return f"from NCCL {PATH_SINCE[value]} (this NCCL has {', '.join(p.value for p in paths_available(version))})"


def _check_chunk(value: object, config: CommConfig, version: NcclVersion, buffsize: int | None) -> str | None:
    size = int(value)  # type: ignore[call-overload]
    if not CHUNK_GRAIN_BYTES <= size <= CHUNK_MAX_BYTES or size % CHUNK_GRAIN_BYTES:
        return f"a multiple of {CHUNK_GRAIN_BYTES} in {CHUNK_GRAIN_BYTES}-{CHUNK_MAX_BYTES}"
    if buffsize is not None:
        ceiling = max_chunk_bytes(buffsize, ALGORITHM.get(config))
        if size > ceiling:
            return f"at most {ceiling} with NCCL_BUFFSIZE={buffsize}"
    return None


PLUGIN_SINCE = min(TUNER_SYMBOL_SINCE.values())  # the oldest tuner-plugin ABI Lagom's plugin exports (v2, 2.21)


V = TypeVar("V")  # the knob's value type (Algorithm, int, CommPath)
K = TypeVar("K")


@dataclass(frozen=True, eq=False)  # a row is its own identity (sets and dicts of rows hash by it)
class Knob(Generic[V]):
    """One NCCL knob (see the module doc). ``None`` in a ``*_since`` field: never through that door."""

    field: str  # the CommConfig field
    cli_names: tuple[str, ...]  # --set spellings, the first the one errors name
    env: tuple[str, ...]  # the NCCL_* variables that carry it process-wide (empty: none)
    plugin_column: str | None  # the plugin table's column (nccl_env.plugin_table), None: not carried
    prefix: str  # the report's short name for it
    plugin_since: NcclVersion | None  # per collective through Lagom's tuner plugin
    function_since: NcclVersion | None = None  # per collective function (NCCL_ALGO's "func:list")
    group_since: NcclVersion | None = None  # per process group (ncclConfig_t)
    resource: bool = False  # a resource axis of the search (a number the space climbs), not a choice
    in_bytes: bool = False  # a size (reports show it in KiB/MiB)
    ladder_fn: Callable[[], tuple[int, ...]] | None = None  # the values the search tries (resource axes)
    validator: Validator | None = None  # the values NCCL takes (None: any value of the field's type)
    choices: tuple[Any, ...] = ()  # a choice knob's values, each spelled by its nccl_name (empty: a number)

    @property
    def key(self) -> str:
        """The knob as files (``CommConfig.to_dict``) and messages spell it (``path`` for ``comm_path``)."""
        return FILE_KEYS.get(self.field, self.field)

    def get(self, config: CommConfig) -> V | None:
        """``config``'s value of this knob (None: NCCL decides)."""
        return getattr(config, self.field)

    def set(self, config: CommConfig, value: V | None) -> CommConfig:
        """``config`` with this knob at ``value`` (None: NCCL decides)."""
        return replace(config, **{self.field: value})  # type: ignore[arg-type]  # the row's V is the field's type

    def set_in(self, items: Iterable[tuple[K, CommConfig]]) -> list[tuple[K, V]]:
        """``(key, value)`` for each ``(key, config)`` whose config sets this knob, in order."""
        return [(key, value) for key, config in items if (value := self.get(config)) is not None]

    def shown(self, value: object) -> str:
        """The value as files, flags and messages spell it (``ring``, ``4``)."""
        return str(getattr(value, "nccl_name", value))

    @property
    def ladder(self) -> tuple[int, ...]:
        return self.ladder_fn() if self.ladder_fn is not None else ()

    def scope(self, version: NcclVersion, use_plugin: bool = True) -> Scope:
        """The narrowest scope this knob is delivered at on ``version`` (``use_plugin=False``:
        without Lagom's tuner plugin, as ``deliver(..., use_plugin=False)``)."""
        if use_plugin and self.plugin_since is not None and version >= self.plugin_since >= PLUGIN_SINCE:
            return Scope.COLLECTIVE
        if self.function_since is not None and version >= self.function_since:
            return Scope.FUNCTION
        if self.group_since is not None and version >= self.group_since:
            return Scope.GROUP
        return Scope.PROCESS


ALGORITHM: Knob[Algorithm] = Knob(
    "algorithm", ("algorithm", "algo"), ("NCCL_ALGO",), "algorithm", "a", PLUGIN_SINCE,
    function_since=PER_FUNCTION_ALGO_SINCE, validator=_check_algorithm, choices=tuple(Algorithm))
PROTOCOL: Knob[Protocol] = Knob(
    "protocol", ("protocol", "proto"), ("NCCL_PROTO",), "protocol", "p", PLUGIN_SINCE,
    function_since=PER_FUNCTION_ALGO_SINCE, choices=tuple(Protocol))
CHANNELS: Knob[int] = Knob(
    "channels", ("channels", "nc"), ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS"),
    "channels", "nc", PLUGIN_SINCE, group_since=CTAS_ENV_SINCE, resource=True,
    ladder_fn=lambda: CHANNEL_LADDER, validator=_check_channels)
CHUNK: Knob[int] = Knob(
    "chunk_bytes", ("chunk", "chunk_bytes"), ("NCCL_BUFFSIZE",), "chunk_bytes", "c", CHUNK_PLUGIN_SINCE,
    resource=True, in_bytes=True, ladder_fn=chunk_ladder, validator=_check_chunk)
THREADS: Knob[int] = Knob(
    "threads", ("threads", "nt"), ("NCCL_NTHREADS", "NCCL_LL128_NTHREADS"), None, "nt", None,
    resource=True, ladder_fn=lambda: THREAD_LADDER, validator=_check_threads)
PATH: Knob[CommPath] = Knob(
    "comm_path", ("path",), ("NCCL_CTA_POLICY",), None, "path", None, group_since=NcclVersion(2, 0),
    validator=_check_path, choices=tuple(CommPath))

KNOBS: tuple[Knob[Any], ...] = (ALGORITHM, PROTOCOL, CHANNELS, CHUNK, THREADS, PATH)
BY_FIELD: dict[str, Knob[Any]] = {k.field: k for k in KNOBS}
BY_CLI_NAME: dict[str, Knob[Any]] = {name: k for k in KNOBS for name in k.cli_names}
RESOURCE_KNOBS: tuple[Knob[int], ...] = (CHANNELS, CHUNK, THREADS)  # the space's resource axes, in its order
RESOURCE_AXES: tuple[str, ...] = tuple(k.field for k in RESOURCE_KNOBS)
REPORT_ORDER: tuple[Knob[int], ...] = (CHANNELS, THREADS, CHUNK)  # "ring/simple nc2 nt512 c2M" (AutoCCL's NC, NT, C)
CHOICE_KNOBS: tuple[Knob[Any], ...] = (ALGORITHM, PROTOCOL)  # chosen together, as (algorithm, protocol) pairs
KERNEL_KNOBS: tuple[str, ...] = RESOURCE_AXES + tuple(k.field for k in CHOICE_KNOBS)  # what NCCL's SM kernels run
assert set(BY_FIELD) == {f.name for f in fields(CommConfig)}, "every CommConfig field has a row"


@dataclass(frozen=True, eq=False)
class GroupKnob:
    """One per-communicator setting (``ncclConfig_t``), a row like the per-collective ones: how a tuned
    file's ``process_groups`` entry spells it (``key``, which is also ``ProcessGroupNCCL.Options().config``'s
    attribute, pytorch PR #164309 for the policy), NCCL's field, its process-wide env twin, the release
    that has it, and the per-collective knob it bounds (channels) or carries (the path)."""

    key: str
    nccl_field: str  # ncclConfig_t's field (nccl.h)
    env: str  # the process-wide twin (a user's value of it overrides every communicator's)
    since: NcclVersion
    carries: Knob[Any]
    policy: bool = False  # a CTA policy (names or flags, nccl_env.knobs.cta_policy_value), else a CTA count

    def value(self, raw: object) -> int:
        """The number NCCL takes for ``raw`` (a file's value); ValueError naming the key otherwise."""
        if self.policy:
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ValueError(f"{self.key}: {raw!r} is not a CTA policy")
            return cta_policy_value(raw)
        if isinstance(raw, bool) or not isinstance(raw, int | str):
            raise ValueError(f"{self.key} must be an integer, got {raw!r}")
        number = int(raw)
        if number < 0:
            raise ValueError(f"{self.key} must be >= 0, got {number}")
        return number


MIN_CTAS = GroupKnob("min_ctas", "minCTAs", "NCCL_MIN_CTAS", CTAS_ENV_SINCE, CHANNELS)
MAX_CTAS = GroupKnob("max_ctas", "maxCTAs", "NCCL_MAX_CTAS", CTAS_ENV_SINCE, CHANNELS)
CTA_POLICY = GroupKnob("cta_policy", "CTAPolicy", "NCCL_CTA_POLICY", CTA_POLICY_SINCE[CtaPolicy.DEFAULT], PATH,
                       policy=True)
GROUP_KNOBS: tuple[GroupKnob, ...] = (MIN_CTAS, MAX_CTAS, CTA_POLICY)
GROUP_BY_KEY: dict[str, GroupKnob] = {k.key: k for k in GROUP_KNOBS}


def config_from(values: Iterable[tuple[Knob[Any], object]]) -> CommConfig:
    """A CommConfig with each given row's knob at its value (None: NCCL decides)."""
    return CommConfig(**{knob.field: value for knob, value in values})  # type: ignore[arg-type]  # rows' types


def sets_every_kernel_knob(config: CommConfig) -> bool:
    """``config`` leaves NCCL nothing to decide for its SM kernels (every knob but the path set)."""
    return all(BY_FIELD[field].get(config) is not None for field in KERNEL_KNOBS)


def knob_scopes(version: NcclVersion, use_plugin: bool = True) -> dict[str, Scope]:
    """Each non-path knob's narrowest scope on this NCCL (the path is one value per group)."""
    return {k.field: k.scope(version, use_plugin) for k in KNOBS if k is not PATH}


def value_of(config: CommConfig, knob: Knob[Any]) -> object:
    """``config``'s value of ``knob`` (None: NCCL decides)."""
    return knob.get(config)


# The order validate_config checks the rows in (the first bad value is the one named).
VALIDATION_ORDER: tuple[Knob[Any], ...] = (ALGORITHM, CHANNELS, THREADS, PATH, CHUNK)
assert {k for k in KNOBS if k.validator is not None} == set(VALIDATION_ORDER)


def validate_config(config: CommConfig, version: NcclVersion, collective: CollectiveType | None = None,
                    buffsize_bytes: int | None = None) -> None:
    """Raise LagomError (knob, value, allowed range) if ``config`` is not valid on ``version``:
    each set knob through its row's validator.

    ``collective``, when given, names the collective in the message. ``buffsize_bytes``
    (NCCL_BUFFSIZE), when given, also bounds the chunk by the buffer's chunk ceiling
    (NCCL would clamp a larger chunk silently).
    """
    where = f" for {collective.value}" if collective is not None else ""
    for knob in VALIDATION_ORDER:
        value = knob.get(config)
        if value is None or knob.validator is None:
            continue
        allowed = knob.validator(value, config, version, buffsize_bytes)
        if allowed is not None:
            raise LagomError(f"{knob.key}={knob.shown(value)}{where} is not valid on NCCL {version}: "
                             f"allowed {allowed}")
