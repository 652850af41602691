"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    """The real profiler traces beside the checkout (../shared/traces), read-only.

    A git worktree may sit one level deeper (e.g. /work/wt/NAME): the nearest
    ancestor holding shared/traces wins."""
    for parent in REPO_ROOT.parents:
        if (parent / "shared" / "traces").is_dir():
            return parent / "shared" / "traces"
    return REPO_ROOT.parent / "shared" / "traces"
