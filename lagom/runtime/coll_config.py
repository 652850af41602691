"""NCCL 2.31's per-collective config as a door for ``lagom run``, where the running torch has it.

NCCL 2.31 takes an ``ncclCollConfig_t`` on each call of its ``nccl*Config`` entry points
(``minCTAs``, ``maxCTAs``, ``CTAPolicy``, ``algSelection``, ...; nccl.h). PyTorch carries one
only with pytorch PR #194826 (open in 2026-12, issue #194678): a keyword-only ``config`` on the
``torch.distributed`` collectives, an nccl4py ``NCCLCollConfig`` (``nccl.core``: ``min_ctas``,
``max_ctas``, ``alg_selection``, ``cta_policy``), consumed by NCCL groups on NCCL >= 2.31. No
released torch has it, so the door is detected at run time (:func:`coll_config_door`, a seam
the tests drive with stand-ins); where it is absent the tuner plugin carries channels and the
algorithm as before. Where it is open, the hook (:mod:`lagom.runtime.hook`) passes each call
of a matched signature on an NCCL group a config built from its tuned entry
(:func:`per_call_config`), unless the caller gave one; the plugin stays loaded for what the
config does not carry (the protocol, the chunk size).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nccl_env.delivery import ENV_ALGO_NAME
from nccl_env.knob_table import ALGORITHM, CHANNELS
from nccl_env.knobs import CommConfig
from nccl_env.rules import COLL_CONFIG_SINCE, NcclVersion

CONFIG_KEYWORD = "config"  # pytorch PR #194826: `dist.all_reduce(t, group=g, config=NCCLCollConfig(...))`


@dataclass(frozen=True)
class CollConfigDoor:
    """What the running torch offers: the class that builds a per-call config and the
    ``torch.distributed`` functions that take one."""

    make: Callable[..., Any]  # nccl4py's NCCLCollConfig (keyword arguments)
    functions: frozenset[str]


def _takes_config(function: object) -> bool:
    try:
        parameter = inspect.signature(function).parameters.get(CONFIG_KEYWORD)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind is inspect.Parameter.KEYWORD_ONLY


def _nccl4py_config_class() -> Callable[..., Any] | None:
    try:
        from nccl.core import NCCLCollConfig  # type: ignore[import-not-found]  # nccl4py, where installed
    except Exception:  # absent, or a broken install: the door stays shut
        return None
    return NCCLCollConfig


def coll_config_door(torch_module: object, functions: tuple[str, ...],
                     config_class: Callable[..., Any] | None = None) -> CollConfigDoor | None:
    """The per-collective config door of ``torch_module`` (the running ``torch``), or None.

    Open where at least one of ``functions`` of ``torch_module.distributed`` takes a keyword-only
    ``config`` and the NCCL torch runs (``torch_module.cuda.nccl.version()``) is 2.31 or later;
    ``config_class`` builds the configs (default: nccl4py's ``NCCLCollConfig``, None: shut)."""
    dist = getattr(torch_module, "distributed", None)
    taking = frozenset(name for name in functions if _takes_config(getattr(dist, name, None)))
    if not taking:
        return None
    try:
        major, minor, *_ = torch_module.cuda.nccl.version()  # type: ignore[attr-defined]
    except Exception:  # a CPU-only torch, or one built without NCCL
        return None
    if NcclVersion(int(major), int(minor)) < COLL_CONFIG_SINCE:
        return None
    make = config_class or _nccl4py_config_class()
    return CollConfigDoor(make, taking) if make is not None else None


def per_call_config(door: CollConfigDoor, config: CommConfig) -> Any | None:
    """The per-call config for a tuned entry's settings: channels as both CTA bounds, the
    algorithm as the selection (NCCL falls back to its own choice where it cannot run it);
    None where the entry sets neither (NCCL's choice, as without the door)."""
    fields: dict[str, Any] = {}
    ctas, algo = CHANNELS.get(config), ALGORITHM.get(config)  # the knob table's rows (issue 25)
    if ctas is not None:
        fields["min_ctas"] = fields["max_ctas"] = ctas
    if algo is not None:
        fields["alg_selection"] = ENV_ALGO_NAME[algo]  # NCCL_ALGO's spelling, as algSelection's
        fields["force_alg_selection"] = False  # unsatisfiable: NCCL's own choice, never an error
    return door.make(**fields) if fields else None
