"""Whether the import names Lagom ships resolve to Lagom's own packages.

``traces``, ``tuner``, ``costmodel`` (and ``lagom``) are names other projects use too: another
distribution's package, or a stray ``tuner.py`` in the folder a command runs from (first on
sys.path under ``python -m``), would be imported instead of ours.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

CHECKED_PACKAGES = ("nccl_env", "traces", "costmodel", "tuner")
ROOT = Path(__file__).resolve().parents[2]  # the folder holding lagom/ and its sibling packages


def _resolves_to(name: str) -> Path | None:
    """The file (or, for a folder without __init__.py, the folder) ``name`` imports from.
    Imports nothing: this module runs before the CLI imports any of the four."""
    module = sys.modules.get(name)
    if module is not None:
        return Path(module.__file__) if module.__file__ else None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that fails, or a bad name
        spec = None
    if spec is not None and spec.origin not in (None, "namespace"):
        return Path(str(spec.origin))
    return Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None


def shadowed() -> list[str]:
    """One line per package that is not Lagom's, naming the file imported instead."""
    lines = []
    for name in CHECKED_PACKAGES:
        path = _resolves_to(name)
        ours = ROOT / name / "__init__.py"
        if path is None:
            lines.append(f"{name} is not importable (expected {ours})")
        elif path.resolve() != ours:
            lines.append(f"{name} resolves to {path}, which shadows Lagom's {ours}: rename it or take it off sys.path")
    return lines
