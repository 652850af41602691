"""Which variables a tuned file's ``env`` may set: exactly the NCCL knobs Lagom tunes
(``delivery.TUNED_ENV_NAMES``: the knob table's env names and point-to-point's step sizes).

A tuned file is data passed around (committed, mailed, saved by ``--online`` on another
cluster) and ``lagom run`` puts its env into every rank: any other name (``LD_PRELOAD``,
``LD_LIBRARY_PATH``, ``CUDA_VISIBLE_DEVICES``, an NCCL variable naming a file or a library
such as ``NCCL_DEBUG_FILE`` or ``NCCL_TUNER_PLUGIN``) is a LagomError, with the closest
allowed name when it looks like a typo (NCCL_NTHREAD)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from nccl_env.delivery import TUNED_ENV_NAMES
from nccl_env.errors import LagomError

ALLOWED_LINE = f"a tuned file's env may set only the NCCL knobs Lagom tunes ({', '.join(sorted(TUNED_ENV_NAMES))})"


def check_env_names(names: Iterable[str]) -> None:
    """Raise LagomError for the first name a tuned file may not set (see the module doc)."""
    for name in names:
        if name in TUNED_ENV_NAMES:
            continue
        close = difflib.get_close_matches(name, TUNED_ENV_NAMES, n=1, cutoff=0.85) if name.startswith("NCCL_") else []
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise LagomError(f"env {name} is refused{hint}: {ALLOWED_LINE}")
