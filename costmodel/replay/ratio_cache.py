"""A bounded least-recently-used map: the replay's memo of its mechanism's answers.

A :class:`~costmodel.replay.trace_evaluator.ReplayEvaluator` asks its mechanism the same
questions for every plan that keeps a signature's settings (a collective's time ratio under
new settings, a kernel's slowdown beside a collective). :class:`LruCache` keeps the answers,
at most ``max_entries`` of them: past that the least recently used goes, so a long search
holds a bounded memo and a repeated question is answered without the mechanism.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """``get(key)``: the held value (None: not held); ``put(key, value)`` (the oldest dropped past ``max_entries``)."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"an LRU cache holds at least one entry, not {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> V:
        self._entries[key] = value
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

