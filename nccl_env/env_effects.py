"""Which of a user's own NCCL variables cap or override which tuned knob (data for ``lagom run``).

A variable set in the job's environment is read by NCCL whatever a tuned file says: a
channel bound caps or raises the channels the plugin and the process groups ask for (NCCL
keeps a plugin's channels within the communicator's, enqueue.cc ``nc <= comm->nChannels``,
and NCCL_MIN_CTAS/NCCL_MAX_CTAS replace every communicator's minCTAs/maxCTAs, init.cc
envConfigOverride); NCCL_ALGO/NCCL_PROTO take the algorithms and protocols they leave out
away from every collective, a plugin's choice included (tuning.cc ncclTopoTuneModel
disables them); NCCL_NTHREADS/NCCL_LL128_NTHREADS set every kernel's threads (tuning.cc
getNthreads); NCCL_BUFFSIZE bounds every chunk (enqueue.cc clamps the chunk to the
buffer's step); NCCL_CTA_POLICY replaces every communicator's CTA policy (init.cc "Comm
config CTAPolicy reset to NCCL_CTA_POLICY"). :data:`EFFECTS` holds one row per variable,
tied to the knob table's row it touches; :meth:`EnvEffect.touches` says whether the
user's value changes one tuned value.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nccl_env.delivery import ENV_ALGO_NAME, ENV_FUNC_NAME, ENV_PROTO_NAME
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, PATH, PROTOCOL, THREADS, Knob
from nccl_env.knobs import CTA_POLICIES, CollectiveType, CommConfig, CommPath, Protocol
from nccl_env.rules import max_chunk_bytes


class Effect(enum.Enum):
    """What a user's variable does to a tuned value of its knob (the verb of the line that names it)."""

    CAPS = "caps"  # an upper bound: larger tuned values are cut to it
    RAISES = "raises"  # a lower bound: smaller tuned values are raised to it
    LIMITS = "rules out"  # a list of choices: a tuned choice outside it is not taken
    OVERRIDES = "overrides"  # one value for every collective


def _number(text: str) -> int | None:
    return int(text) if re.fullmatch(r"\s*[0-9]+\s*", text) else None


def allowed_names(value: str, collective: CollectiveType | None) -> set[str] | None:
    """The lower-case names an NCCL_ALGO/NCCL_PROTO ``value`` leaves ``collective`` (None: all of them,
    or a value Lagom cannot read): ``ring,tree``, ``^nvls``, from 2.24 ``ring;allreduce:tree``."""
    func = ENV_FUNC_NAME.get(collective) if collective is not None else None
    chosen = None
    for part in value.split(";"):
        name, sep, names = part.rpartition(":")
        if (sep and name.strip().lower() == func) or (not sep and chosen is None):
            chosen = names
    if chosen is None:
        return None
    every = {n.lower() for n in (*ENV_ALGO_NAME.values(), *ENV_PROTO_NAME.values())}
    listed = {t.strip().lower() for t in chosen.strip().removeprefix("^").split(",") if t.strip()}
    return every - listed if chosen.strip().startswith("^") else listed


def _policy(value: object) -> int | None:
    """A CTA policy as NCCL's integer flags: a path's, a group's (name or integer), or the env's ("1", "ZERO|1")."""
    if isinstance(value, CommPath):
        return int(value.cta_policy)
    total = 0
    for word in str(value).split("|"):
        word = word.strip().lower()
        if word.isdigit():
            total |= int(word)
        elif word in CTA_POLICIES:
            total |= CTA_POLICIES[word]
        else:
            return None
    return total


@dataclass(frozen=True)
class EnvEffect:
    """One user variable and the knob row it touches; ``applies``: which tuned configs it reads for
    (NCCL_NTHREADS: those not on LL128; NCCL_LL128_NTHREADS: those on it)."""

    name: str
    knob: Knob[Any]
    effect: Effect
    applies: Callable[[CommConfig | None], bool] = lambda config: True

    def touches(self, user_value: str, tuned: object, config: CommConfig | None = None,
                collective: CollectiveType | None = None, plugin_carried: bool = False) -> bool:
        """Whether the user's value changes ``tuned`` (the knob's value in ``config`` for ``collective``;
        ``config`` None: a process group's or the file env's value). ``plugin_carried``: the tuner plugin
        sets this value per call, which a floor does not raise (NCCL bounds a plugin's channel count by the
        communicator's from above only, enqueue.cc). An unreadable user value: False."""
        if not self.applies(config) or (plugin_carried and self.effect is Effect.RAISES):
            return False
        if self.knob is PATH:
            mine, theirs = _policy(user_value), _policy(tuned)
            return mine is not None and theirs is not None and mine != theirs
        if self.effect is Effect.LIMITS:
            allowed = allowed_names(user_value, collective)
            shown = (ENV_ALGO_NAME if self.knob is ALGORITHM else ENV_PROTO_NAME).get(tuned)  # type: ignore[call-overload]
            return allowed is not None and shown is not None and shown.lower() not in allowed
        number = _number(user_value)
        if number is None or not isinstance(tuned, int):
            return False
        if self.knob is CHUNK:
            return tuned > max_chunk_bytes(number, ALGORITHM.get(config) if config is not None else None)
        if self.effect is Effect.CAPS:
            return tuned > number
        if self.effect is Effect.RAISES:
            return tuned < number
        return tuned != number


def _ll128(config: CommConfig | None) -> bool:
    return config is not None and PROTOCOL.get(config) is Protocol.LL128


def _channel_effect(name: str) -> EnvEffect:
    return EnvEffect(name, CHANNELS, Effect.RAISES if name.startswith("NCCL_MIN_") else Effect.CAPS)


NTHREADS, LL128_NTHREADS = THREADS.env
# One row per user variable that touches a tuned knob: every env name of the knob table's rows.
EFFECTS: tuple[EnvEffect, ...] = (
    *(_channel_effect(name) for name in CHANNELS.env),  # NCCL_MIN/MAX_NCHANNELS, NCCL_MIN/MAX_CTAS
    *(EnvEffect(name, ALGORITHM, Effect.LIMITS) for name in ALGORITHM.env),
    *(EnvEffect(name, PROTOCOL, Effect.LIMITS) for name in PROTOCOL.env),
    EnvEffect(NTHREADS, THREADS, Effect.OVERRIDES, lambda config: config is not None and not _ll128(config)),
    EnvEffect(LL128_NTHREADS, THREADS, Effect.OVERRIDES, lambda config: _ll128(config)),
    *(EnvEffect(name, CHUNK, Effect.CAPS, lambda config: config is not None) for name in CHUNK.env),
    *(EnvEffect(name, PATH, Effect.OVERRIDES) for name in PATH.env),
)
BY_NAME: dict[str, EnvEffect] = {e.name: e for e in EFFECTS}
