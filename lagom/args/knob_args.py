"""Command-line spellings of knob values: sizes (``2MiB``, ``684KB``), ``--set`` assignments, ``--noise``."""

from __future__ import annotations

import math
import re

from nccl_env.errors import LagomError
from nccl_env.knob_table import BY_CLI_NAME, CHANNELS, CHOICE_KNOBS, CHUNK, PATH, THREADS
from nccl_env.knobs import CommConfig
from nccl_env.nccl_releases import released_version
from nccl_env.rules import NcclVersion

# Binary multiples for every spelling: NCCL sizes are powers of two and the Lagom paper's
# "684 KB" chunk is 684 x 1024 bytes (a 1368 KiB NCCL_BUFFSIZE / 2).
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_KEYS = BY_CLI_NAME  # --set spellings (nccl_env.knob_table)


_SET_ORDER = (CHANNELS, THREADS, CHUNK, *CHOICE_KNOBS, PATH)  # how --set's error lists them


def parse_nccl_version_arg(text: str | None, flag: str = "--nccl-version") -> NcclVersion | None:
    """``--nccl-version``'s NCCL release (None when not given); a version NCCL never released is an error."""
    return None if text is None else released_version(text, flag)


def parse_size(text: str) -> int:
    """``2MiB`` -> 2097152, ``684KB`` -> 700416, ``4096`` -> 4096 (K/M/G are binary)."""
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise LagomError(f"bad size {text!r}: expected a number with an optional unit (B, KB/KiB, MB/MiB, GB/GiB)")
    value = float(match.group(1)) * _UNITS[unit]
    if value < 1 or value != int(value):
        raise LagomError(f"bad size {text!r}: must be a whole number of bytes >= 1")
    return int(value)


def parse_set(text: str) -> CommConfig:
    """``channels=16,chunk=2MiB,threads=256,algorithm=ring,protocol=simple`` -> CommConfig; also
    ``path=copy_engine`` (sm, symmetric, copy_engine, efficiency: docs/tuner.md "Paths")."""
    values: dict = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        knob = _KEYS.get(key.strip().lower())
        if not sep or knob is None:
            raise LagomError(f"--set: bad item {item!r}: expected KNOB=VALUE with KNOB one of "
                             f"{', '.join(k.cli_names[0] for k in _SET_ORDER)}")
        value = value.strip()
        field = knob.field
        if field in values:
            raise LagomError(f"--set: {knob.key} is given twice ({item!r}); give each knob once")
        if knob.choices:
            by_name = {c.nccl_name: c for c in knob.choices}
            if value.lower() not in by_name:
                raise LagomError(f"--set: {knob.key} {value!r} is not one of {', '.join(by_name)}")
            values[field] = by_name[value.lower()]
        elif knob.in_bytes:
            values[field] = parse_size(value)
        else:
            try:
                number = int(value)
            except ValueError:
                raise LagomError(f"--set: {key} must be an integer, got {value!r}") from None
            if number < 1:
                raise LagomError(f"--set: {key} must be >= 1, got {number}")
            values[field] = number
    return CommConfig(**values)


# --noise is a relative standard deviation per op, the same range in every command that takes it
# (simulate, calibrate, run --online --simulate): the simulator clips each factor N(1, noise) to
# [0.5, 1.5] (costmodel/sim/simulator.py), so from 0.5 on a third of the draws or more are clipped
# and the noise is no longer the one asked for.
MAX_NOISE = 0.5
NOISE_RANGE = f"[0, {MAX_NOISE})"


def check_noise(value: float) -> None:
    """LagomError ``--noise X: a relative noise in [0, 0.5)`` for anything else (nan and inf too)."""
    if not (math.isfinite(value) and 0 <= value < MAX_NOISE):
        raise LagomError(f"--noise {value}: a relative noise in {NOISE_RANGE}")
