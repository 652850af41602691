"""Shared test helpers."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path:
    """The real profiler traces beside the checkout (../shared/traces), read-only."""
    return REPO_ROOT.parent / "shared" / "traces"
