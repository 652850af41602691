"""Whether an NCCL_* variable is one NCCL reads: the installed libnccl's strings decide
where a library is found (NCCL_PARAM names are string literals in it), else the names
Lagom itself delivers (``delivery.ENV_NAMES``). An unknown name is a LagomError with the
closest known name, so that a typo (NCCL_NTHREAD) is not silently ignored by NCCL."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from nccl_env.delivery import ENV_NAMES
from nccl_env.errors import LagomError
from nccl_env.libnccl import candidates, strings_present


@lru_cache(maxsize=1)
def _library() -> Path | None:
    try:
        found = candidates()
    except LagomError:
        return None
    return found[0].path if found else None


def check_env_names(names: Iterable[str]) -> None:
    """Raise LagomError for the first NCCL_* name NCCL does not read (other names pass)."""
    wanted = [n for n in names if n.startswith("NCCL_") and n not in ENV_NAMES]
    if not wanted:
        return
    library = _library()
    if library is not None:
        try:
            known = strings_present(library, wanted)
        except LagomError:
            known = dict.fromkeys(wanted, False)
        where = f"the strings of {library.name}"
    else:
        known = dict.fromkeys(wanted, False)
        where = "Lagom's table (no libnccl found)"
    for name in wanted:
        if not known[name]:
            close = difflib.get_close_matches(name, ENV_NAMES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise LagomError(f"env {name} is not a variable NCCL reads (checked against {where}){hint}")
