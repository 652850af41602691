"""A kernel model's memo: its duration or DRAM demand under each contention state it met.

Both the compute and the collective models answer the same few states again and again in
a run (each event changes only a few ops' states); the first ``MEMO_STATES`` answers are
kept, so a long run with many distinct states costs no more memory than a short one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

MEMO_STATES = 256  # answers kept per kernel model (Lagom's choice: a step meets far fewer states)


class StateMemo(dict):
    """``key`` (a contention state) -> a float the model computed for it."""

    def get_or(self, key: Hashable, compute: Callable[..., float], *args: float) -> float:
        """The answer kept for ``key``, else ``compute(*args)`` (kept while there is room)."""
        cached = self.get(key)
        if cached is not None:
            return cached
        value = compute(*args)
        if len(self) < MEMO_STATES:
            self[key] = value
        return value
