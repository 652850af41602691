"""How ranks agree: one rank decides, every rank applies the same decision at the same step.

Keys in a key-value store shared by the job's ranks (torch.distributed's TCPStore
under torchrun, :class:`MemoryStore` in process), under the prefix the caller gives:

- ``sample/<step>/<rank>``: what rank R measured during step S (a Timing on the wire);
  the decider deletes it once read;
- ``decision/<step>``: the plan every rank runs from step S + 1 on, written once by the
  decider: ``<sha256 of the body, 16 hex>\\n<JSON body>``, the body
  ``{"step": S, "epoch": K, "configs": [...], "done": bool, "result": ...}``, one
  config per signature in the space's order.

Every rank, the decider included, reads the decision back from the store and checks
it (:func:`decode_decision`): checksum, the step it is for, an epoch that is the
current one or the next. All ranks check the same bytes, so they agree: a decision
that fails the check keeps the current epoch on every rank (and ends the tuning
there, so that no rank is ever asked to follow a decision others skipped). A rank
that cannot read a key within the timeout raises: the job fails loudly rather than
letting one rank revert alone (NCCL hangs when ranks disagree on a collective's
algorithm, protocol or channels).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from nccl_env.errors import LagomError
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan, Signature


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the protocol uses."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> bytes: ...

    def wait(self, keys: list[str], timeout: timedelta) -> None: ...

    def delete_key(self, key: str) -> bool: ...


class MemoryStore:
    """A store for ranks simulated in one process (they run in turn: nothing to wait for)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        if key not in self.data:
            raise LagomError(f"online tuning: {key} was never written")
        return self.data[key]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        missing = [k for k in keys if k not in self.data]
        if missing:
            raise LagomError(f"online tuning: {missing[0]} was never written")

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


def read(store: Store, key: str, timeout_s: float) -> bytes:
    """The value at ``key``, waiting up to ``timeout_s``; LagomError (one line) when it never comes."""
    try:
        store.wait([key], timedelta(seconds=timeout_s))
        return store.get(key)
    except LagomError:
        raise
    except Exception as exc:  # noqa: BLE001 - torch raises DistStoreError, RuntimeError or others on a timeout or a lost store
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LagomError(f"online tuning: no {key} within {timeout_s:.0f} s ({first}); "
                         "a rank is gone or stuck: stopping the job rather than letting ranks disagree") from None


def sample_key(step: int, rank: int) -> str:
    return f"sample/{step}/{rank}"


def decision_key(step: int) -> str:
    return f"decision/{step}"


@dataclass(frozen=True)
class Decision:
    step: int  # decided at the end of this step; in force from the next one
    epoch: int
    configs: tuple[CommConfig, ...]  # one per signature, in the space's order
    done: bool = False
    result: str = ""  # "kept" | "reverted" once done

    def plan(self, signatures: tuple[Signature, ...]) -> Plan:
        return Plan(entries=dict(zip(signatures, self.configs, strict=True)))


def configs_of(plan: Plan, signatures: tuple[Signature, ...]) -> tuple[CommConfig, ...]:
    return tuple(plan.config_for(s) for s in signatures)


def plan_hash(configs: tuple[CommConfig, ...]) -> str:
    """A short name for a plan: equal on every rank for equal plans."""
    body = json.dumps([c.to_dict() for c in configs], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def encode_decision(decision: Decision) -> str:
    body = json.dumps(
        {
            "step": decision.step,
            "epoch": decision.epoch,
            "configs": [c.to_dict() for c in decision.configs],
            "done": decision.done,
            "result": decision.result,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return hashlib.sha256(body).hexdigest()[:16] + "\n" + body.decode()


def decode_decision(raw: bytes, step: int, epoch: int, signatures: int) -> Decision | None:
    """The decision in ``raw`` if it is intact and meant for this step and epoch, else None."""
    checksum, _, body = raw.partition(b"\n")
    if hashlib.sha256(body).hexdigest()[:16].encode() != checksum:
        return None
    try:
        data = json.loads(body)
        decision = Decision(
            int(data["step"]),
            int(data["epoch"]),
            tuple(CommConfig.from_dict(c) for c in data["configs"]),
            bool(data["done"]),
            str(data["result"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if decision.step != step or decision.epoch not in (epoch, epoch + 1) or len(decision.configs) != signatures:
        return None
    return decision
