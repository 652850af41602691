"""Where Lagom keeps what it builds or fits once and reuses: built plugins, calibrated presets.

One folder for both: ``$LAGOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/lagom``, else
``~/.cache/lagom`` (the XDG base-directory convention). Entries are named by a hash of
what they were made from, so a stale entry is never read.
"""

from __future__ import annotations

import os
from pathlib import Path

from nccl_env.errors import LagomError

CACHE_DIR_ENV_NAMES = ("LAGOM_CACHE_DIR", "XDG_CACHE_HOME", "HOME")  # what cache_dir() reads (HOME: Path.home())


def cache_dir() -> Path:
    """The cache folder, created on demand; a LagomError naming it when it cannot be one."""
    chosen = os.environ.get("LAGOM_CACHE_DIR")
    if chosen:
        path, name = Path(chosen).expanduser(), f"LAGOM_CACHE_DIR={chosen}"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "lagom"
        name = f"{path} (set LAGOM_CACHE_DIR for another folder)"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LagomError(f"{name}: cannot use it as the cache folder: {exc.strerror or exc}") from None
    return path


def write_cached(path: Path, text: str) -> None:
    """``text`` into the cache entry ``path``, whole or not at all: written under a temporary name of
    this process's own (two commands, or test workers, may write one entry at once), then renamed."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
