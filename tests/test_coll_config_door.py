"""NCCL 2.31's per-collective config as a door (issue 30): detected at run time on the running
torch (no released torch has it, so the detection is driven here with stand-in modules: a seam),
built from a tuned entry, and passed by the hook on the groups that take it, on a real 1-rank
gloo group."""

from __future__ import annotations

import io
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from lagom.files.tuned_config import parse_tuned_config
from lagom.runtime import Hook
from lagom.runtime.coll_config import CollConfigDoor, coll_config_door, per_call_config
from lagom.runtime.collectives import SPECS
from nccl_env.knobs import Algorithm, CommConfig, Protocol

FUNCTIONS = tuple(spec.function for spec in SPECS)


@dataclass(kw_only=True)
class StandInCollConfig:
    """Stands in for nccl4py's NCCLCollConfig (its field names)."""

    min_ctas: int | None = None
    max_ctas: int | None = None
    alg_selection: str | None = None
    force_alg_selection: bool | None = None


def _torch(nccl: tuple[int, int, int], keyword_only: bool = True):
    def all_reduce(tensor, op=None, group=None, async_op=False, *, config=None):
        return config

    def all_gather(tensor_list, tensor, group=None, async_op=False, config=None):  # not keyword-only
        return config

    def broadcast(tensor, src=None, group=None, async_op=False):
        return None

    functions = {"all_reduce": all_reduce if keyword_only else all_gather, "all_gather": all_gather,
                 "broadcast": broadcast}
    return SimpleNamespace(distributed=SimpleNamespace(**functions),
                           cuda=SimpleNamespace(nccl=SimpleNamespace(version=lambda: nccl)))


def test_the_door_opens_where_torch_takes_a_keyword_only_config_on_nccl_2_31():
    door = coll_config_door(_torch((2, 31, 2)), FUNCTIONS, StandInCollConfig)
    assert door is not None and door.functions == {"all_reduce"}
    assert coll_config_door(_torch((2, 30, 7)), FUNCTIONS, StandInCollConfig) is None  # NCCL before 2.31
    assert coll_config_door(_torch((2, 31, 2), keyword_only=False), FUNCTIONS, StandInCollConfig) is None
    no_nccl = SimpleNamespace(distributed=_torch((2, 31, 2)).distributed, cuda=SimpleNamespace())
    assert coll_config_door(no_nccl, FUNCTIONS, StandInCollConfig) is None  # a torch without NCCL
    assert coll_config_door(None, FUNCTIONS, StandInCollConfig) is None


def test_the_running_torch_has_no_door_today():
    """No released torch takes a per-collective config (pytorch PR #194826 is open): the plugin carries it."""
    assert coll_config_door(torch, FUNCTIONS) is None


def test_a_tuned_entry_becomes_the_per_call_config():
    door = CollConfigDoor(StandInCollConfig, frozenset({"all_reduce"}))
    assert per_call_config(door, CommConfig(channels=8, algorithm=Algorithm.NVLS_TREE)) == StandInCollConfig(
        min_ctas=8, max_ctas=8, alg_selection="nvlstree", force_alg_selection=False)
    assert per_call_config(door, CommConfig(algorithm=Algorithm.COLLNET_DIRECT)).alg_selection == "collnetdirect"
    assert per_call_config(door, CommConfig(protocol=Protocol.LL, chunk_bytes=1 << 20)) is None  # the plugin's


CONFIG = {
    "format": "lagom.tuned-config", "version": 1, "nccl_version": "2.31.2",
    "collectives": [{"match": {"collective": "allreduce", "max_bytes": 64}, "set": {"channels": 4,
                                                                                   "algorithm": "ring"}}],
}


@pytest.fixture
def seen_hook(world):
    """A hook whose door is open on a stand-in all_reduce that keeps what it was given."""
    seen: list = []

    def all_reduce(tensor, op=None, group=None, async_op=False, *, config=None):
        seen.append(config)

    hook = Hook(config=parse_tuned_config(CONFIG), stream=io.StringIO())
    hook.observing = True
    hook.coll_door = CollConfigDoor(StandInCollConfig, frozenset({"all_reduce"}))
    spec = next(s for s in SPECS if s.function == "all_reduce")
    import inspect

    wrapped = hook._wrap(spec, all_reduce, list(inspect.signature(all_reduce).parameters))
    return hook, wrapped, seen


def test_the_hook_gives_no_config_on_a_group_that_does_not_take_one(seen_hook):
    hook, wrapped, seen = seen_hook
    wrapped(torch.ones(8))  # a gloo group: torch would refuse a config there
    assert seen == [None]
    assert dist.get_backend() == "gloo"


def test_the_hook_passes_each_matched_call_its_config(seen_hook):
    hook, wrapped, seen = seen_hook
    hook.door_backends = ("gloo",)  # this group's backend stands for NCCL's here
    wrapped(torch.ones(8))  # 32 B: the entry
    wrapped(torch.ones(8))
    wrapped(torch.ones(64))  # 256 B: no entry, NCCL decides
    mine = StandInCollConfig(min_ctas=1)
    wrapped(torch.ones(8), config=mine)  # the caller's own config wins
    tuned = StandInCollConfig(min_ctas=4, max_ctas=4, alg_selection="ring", force_alg_selection=False)
    assert seen == [tuned, tuned, None, mine]
    assert seen[0] is seen[1]  # built once per signature
    assert {(c.collective, c.bytes): c.count for c in hook.signature_counts()} == {("allreduce", 32): 3,
                                                                                  ("allreduce", 256): 1}
