"""NCCL's rules for the values of the env variables a tuned file sets, per NCCL version.

NCCL reads a value it cannot use with a warning in its debug log and its own default
(src/graph/tuning.cc getNthreads, src/init.cc, src/enqueue.cc): a job would run
untuned without a word. :func:`validate_env` raises LagomError instead, one line naming
the variable, the value and what NCCL takes on that version. Every name a tuned file may
set (:mod:`nccl_env.env_names`) has a rule here (:data:`RULED_NAMES`); others pass.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from nccl_env.delivery import ENV_ALGO_NAME, ENV_FUNC_NAME, ENV_PROTO_NAME
from nccl_env.errors import LagomError
from nccl_env.knob_table import ALGORITHM, CHANNELS, CHUNK, PATH, PROTOCOL
from nccl_env.knobs import CTA_POLICIES, CtaPolicy
from nccl_env.rules import (
    ALGORITHM_SINCE,
    CTA_POLICY_NAMES_SINCE,
    CTA_POLICY_SINCE,
    LL128_THREADS_MAX,
    LL128_THREADS_MIN,
    P2P_NET_CHUNK_ENV,
    P2P_NVL_CHUNK_ENV,
    P2P_PCI_CHUNK_ENV,
    PER_FUNCTION_ALGO_SINCE,
    THREADS_MAX,
    THREADS_MIN,
    WARP_SIZE,
    NcclVersion,
    max_channels,
)

# Byte sizes NCCL takes as a positive integer (init.cc computeBuffSizes); at most 2^40, more than any GPU holds.
_BYTES_ENV = (*CHUNK.env, P2P_NET_CHUNK_ENV, P2P_NVL_CHUNK_ENV, P2P_PCI_CHUNK_ENV)
MAX_ENV_BYTES = 1 << 40
_CHANNELS_ENV = CHANNELS.env
_ALGO_NAMES = {name.lower(): algo for algo, name in ENV_ALGO_NAME.items()}
_PROTO_NAMES = {name.lower() for name in ENV_PROTO_NAME.values()}
_FUNC_NAMES = {name.lower() for name in ENV_FUNC_NAME.values()}
_THREADS_ENV = ("NCCL_NTHREADS", "NCCL_LL128_NTHREADS")
# The names validate_env has a rule for (a test holds every name a tuned file may set to it).
RULED_NAMES = frozenset((*_THREADS_ENV, *_BYTES_ENV, *_CHANNELS_ENV, *ALGORITHM.env, *PROTOCOL.env, *PATH.env))


def validate_env(env: Mapping[str, object], version: NcclVersion) -> None:
    """LagomError for the first value NCCL ``version`` would not take (see the module doc)."""
    for name, raw in env.items():
        if isinstance(raw, (list, dict)) or raw is None:
            raise LagomError(f"env {name}: expected a single value, got {raw!r}")
        value = str(raw).strip()

        def bad(allowed: str, name: str = name, value: str = value) -> LagomError:
            return LagomError(f"env {name}={value!r} is not valid on NCCL {version}: allowed {allowed}")

        if name == "NCCL_NTHREADS":
            _threads(value, THREADS_MIN, THREADS_MAX, bad)
        elif name == "NCCL_LL128_NTHREADS":
            _threads(value, LL128_THREADS_MIN, LL128_THREADS_MAX, bad)
        elif name in _BYTES_ENV:
            if not _integer_in(value, 1, MAX_ENV_BYTES):
                raise bad(f"a whole number of bytes in 1-{MAX_ENV_BYTES}")
        elif name in _CHANNELS_ENV:
            top = max_channels(version)
            if not _integer_in(value, 1, top):
                raise bad(f"an integer in 1-{top}")
        elif name in ALGORITHM.env:
            _names(value, version, {k: ALGORITHM_SINCE[a] for k, a in _ALGO_NAMES.items()}, bad)
        elif name in PROTOCOL.env:
            _names(value, version, dict.fromkeys(_PROTO_NAMES, NcclVersion(2, 0)), bad)
        elif name in PATH.env:
            _cta_policy(value, version, bad)


def _integer_in(value: str, low: int, high: int) -> bool:
    return re.fullmatch(r"[0-9]+", value) is not None and low <= int(value) <= high


def _threads(value: str, low: int, high: int, bad) -> None:
    if not _integer_in(value, low, high) or int(value) % WARP_SIZE:
        raise bad(f"a multiple of {WARP_SIZE} in {low}-{high}")


def _names(value: str, version: NcclVersion, known: dict[str, NcclVersion], bad) -> None:
    """``ring,tree`` / ``^nvls`` and, from 2.24, ``ring;allreduce:tree;allgather:^nvls`` (a list without
    FUNC: applies to the functions not named)."""
    listed = sorted(n for n, since in known.items() if version >= since)
    parts = value.split(";")
    for part in parts:
        func, sep, names = part.rpartition(":")
        if sep:
            if version < PER_FUNCTION_ALGO_SINCE:
                raise bad(f"a list of {', '.join(listed)} (per-function 'FUNC:' syntax needs NCCL "
                          f"{PER_FUNCTION_ALGO_SINCE})")
            if func.strip().lower() not in _FUNC_NAMES:
                raise bad(f"'FUNC:LIST;...' with FUNC one of {', '.join(sorted(_FUNC_NAMES))}")
        tokens = [t.strip().lower() for t in names.strip().removeprefix("^").split(",")]
        for token in tokens:
            if token not in known or version < known[token]:
                raise bad(f"a comma-separated list of {', '.join(listed)} (optionally after '^')")


def _cta_policy(value: str, version: NcclVersion, bad) -> None:
    """NCCL_CTA_POLICY: the flags' integers (0-3) from 2.27, ZERO (2) from 2.28; from 2.29 also their
    names joined by '|' (init.cc getEnvCtaPolicyOnce; nccl_env.rules CTA_POLICY_SINCE)."""
    known = sorted(p for p, since in CTA_POLICY_SINCE.items() if version >= since)
    top = sum(int(p) for p in known)
    if not known:
        raise bad(f"nothing: NCCL_CTA_POLICY is read from NCCL {min(CTA_POLICY_SINCE.values())}")
    names = " or names joined by '|' (" + ", ".join(p.nccl_name for p in known) + ")"
    allowed = f"an integer in 0-{top}" + (names if version >= CTA_POLICY_NAMES_SINCE else "")
    if re.fullmatch(r"[0-9]+", value):
        number = int(value)
    elif version >= CTA_POLICY_NAMES_SINCE:
        words = [w.strip().lower() for w in value.split("|")]
        if not all(w in CTA_POLICIES for w in words):
            raise bad(allowed)
        number = 0
        for w in words:
            number |= CTA_POLICIES[w]
    else:
        raise bad(allowed)
    if number & ~top or any(number & int(p) and version < CTA_POLICY_SINCE[p] for p in CtaPolicy):
        raise bad(allowed)
