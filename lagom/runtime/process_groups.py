"""Per-communicator NCCL settings: the tuned file's ``process_groups`` as ``pg_options``.

NCCL reads ``ncclConfig_t`` (minCTAs, maxCTAs, CTAPolicy) once, when a communicator
is created; PyTorch exposes it as ``ProcessGroupNCCL.Options().config``. The hook
wraps c10d's ``_new_process_group_helper``, the one function every process group
creation goes through (``init_process_group``, ``new_group``, DeviceMesh), because it
receives the group's final name: no guessing names ahead of time.

A group's settings are found under its name (``"0"`` is the default group, then
``"1"``, ``"2"`` ... in creation order, the names profiler traces show) or under its
description (``group_desc``, e.g. ``default_pg`` or a DeviceMesh dimension name).
Options the user passed themselves win. Groups without NCCL, and torch builds
without ProcessGroupNCCL or without a field, are left untouched and reported once.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nccl_env.knob_table import GROUP_BY_KEY


@dataclass
class GroupDecision:
    """What happened to one process group's options, for the audit."""

    group: str
    desc: str
    status: str  # applied | user-options | not-nccl | no-nccl-in-torch | unsupported-field | no-settings
    applied: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"group": self.group, "desc": self.desc, "status": self.status, "applied": dict(self.applied)}


def settings_for(process_groups: dict[str, dict], name: str, desc: str) -> dict | None:
    """The tuned settings for a group, by name first, then by description."""
    if name in process_groups:
        return process_groups[name]
    if desc and desc in process_groups:
        return process_groups[desc]
    return None


def build_nccl_options(options_cls: type, settings: dict) -> tuple[object, dict[str, int], list[str]]:
    """A fresh ``options_cls()`` with the settings this torch supports.

    Returns (options, applied {key: value}, keys this build lacks). Raises ValueError
    on a value NCCL would reject (a bad cta_policy, a negative CTA count).
    """
    options = options_cls()
    if hasattr(options, "is_high_priority_stream"):
        options.is_high_priority_stream = False  # what torch itself sets for a default NCCL group
    config = getattr(options, "config", None)
    applied: dict[str, int] = {}
    missing: list[str] = []
    for key, value in settings.items():
        row = GROUP_BY_KEY.get(key)
        if row is None:
            continue
        number = row.value(value)  # the file's key is the Options().config attribute
        if config is None or not hasattr(config, row.key):
            missing.append(key)
            continue
        setattr(config, row.key, number)
        applied[key] = number
    return options, applied, missing


def backends_of(backend: object) -> set[str]:
    """The backend names a c10d ``backend`` argument resolves to (``"cpu:gloo,cuda:nccl"`` -> both)."""
    from torch.distributed.distributed_c10d import Backend, BackendConfig

    text = str(backend) if backend is not None else Backend.UNDEFINED
    return {str(b).lower() for b in BackendConfig(Backend(text)).get_device_backend_map().values()}


class GroupOptionsInjector:
    """Wraps c10d's ``_new_process_group_helper`` to add NCCL options per group.

    ``process_groups()`` gives the tuned settings by group name or description;
    ``report(message)`` receives one-line notes (each distinct note once);
    ``on_error(where, exc)`` is told when the injector's own code fails (the group is
    then created exactly as the caller asked);
    ``decisions`` keeps one :class:`GroupDecision` per group created.
    """

    def __init__(
        self,
        process_groups: Callable[[], dict[str, dict]],
        report: Callable[[str], None],
        on_error: Callable[[str, BaseException], None],
    ):
        self.process_groups = process_groups  # called at each group creation (the file may load late)
        self.report = report
        self.on_error = on_error
        self.decisions: list[GroupDecision] = []
        self._original: Callable | None = None
        self._module: Any = None  # torch's c10d module, while patched

    def install(self) -> bool:
        """Patch c10d; False (and a note) when this torch has no usable helper."""
        import torch.distributed.distributed_c10d as c10d

        helper = getattr(c10d, "_new_process_group_helper", None)
        if helper is None:
            self.report("this torch has no _new_process_group_helper: per-group NCCL options are not applied")
            return False
        signature = inspect.signature(helper)
        needed = {"group_name", "backend", "backend_options"}
        if not needed <= set(signature.parameters):
            self.report("this torch's _new_process_group_helper has another signature: per-group NCCL options are not "
                        "applied")
            return False
        original = helper
        injector = self

        def _new_process_group_helper(*args, **kwargs):
            try:
                args, kwargs = injector._with_options(signature, args, kwargs)
            except Exception as exc:  # never let our code break group creation
                injector.on_error("process-group options", exc)
            return original(*args, **kwargs)

        _new_process_group_helper.__wrapped__ = original  # type: ignore[attr-defined]  # functools' marker, set by hand
        _new_process_group_helper.__doc__ = original.__doc__
        self._original = original
        self._module = c10d
        c10d._new_process_group_helper = _new_process_group_helper
        return True

    def uninstall(self) -> None:
        if self._module is not None and self._original is not None:
            self._module._new_process_group_helper = self._original
        self._module = None
        self._original = None

    def _with_options(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        bound = signature.bind(*args, **kwargs)
        name = str(bound.arguments.get("group_name", ""))
        desc = str(bound.arguments.get("group_desc") or "")
        settings = settings_for(self.process_groups(), name, desc)
        if not settings:
            return args, kwargs
        decision = GroupDecision(group=name, desc=desc, status="no-settings")
        self.decisions.append(decision)
        if "nccl" not in backends_of(bound.arguments.get("backend")):
            decision.status = "not-nccl"
            self.report(f"process group {name!r} does not use NCCL: its tuned options do not apply")
            return args, kwargs
        if bound.arguments.get("backend_options") is not None:
            decision.status = "user-options"
            self.report(f"process group {name!r}: your own pg_options win over the tuned ones")
            return args, kwargs
        import torch.distributed as dist

        options_cls = getattr(dist, "ProcessGroupNCCL", None)
        options_cls = getattr(options_cls, "Options", None) if options_cls is not None else None
        if options_cls is None:
            decision.status = "no-nccl-in-torch"
            self.report("this torch build has no ProcessGroupNCCL: per-group NCCL options are not applied")
            return args, kwargs
        options, applied, missing = build_nccl_options(options_cls, settings)
        if missing:
            self.report(f"this torch's ProcessGroupNCCL.Options has no {', '.join(missing)}: left to NCCL")
        if not applied:
            decision.status = "unsupported-field"
            return args, kwargs
        bound.arguments["backend_options"] = options
        decision.status = "applied"
        decision.applied = applied
        return bound.args, bound.kwargs
