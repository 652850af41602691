"""Signature and Plan: what the tuner outputs and the runtime matches on."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from nccl_env.knobs import CollectiveType, CommConfig


@functools.total_ordering
@dataclass(frozen=True)
class Signature:
    """What a collective can be matched by at run time (docs/design.md §1 Vocabulary)."""

    group: str  # process group name, e.g. "0" or "tp"
    collective: CollectiveType
    message_bytes: int
    ranks: int  # process group size
    nodes: int  # nodes the group spans

    def __lt__(self, other: Signature) -> bool:  # enums do not order by default
        return self._key() < other._key()

    def _key(self) -> tuple:
        return (self.group, self.collective.value, self.message_bytes, self.ranks, self.nodes)

    def label(self) -> str:
        return f"{self.collective.value}[{self.group}] {self.message_bytes}B x{self.ranks}r/{self.nodes}n"


@dataclass
class Plan:
    """Signature -> CommConfig. Signatures without an entry get ``default``.

    ``default`` is usually the empty CommConfig (NCCL decides everything).
    """

    entries: dict[Signature, CommConfig] = field(default_factory=dict)
    default: CommConfig = field(default_factory=CommConfig)

    def config_for(self, signature: Signature) -> CommConfig:
        return self.entries.get(signature, self.default)

    def with_entry(self, signature: Signature, config: CommConfig) -> Plan:
        entries = dict(self.entries)
        entries[signature] = config
        return Plan(entries=entries, default=self.default)
