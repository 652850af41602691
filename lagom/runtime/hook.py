"""The torch.distributed hook: per-group NCCL options and a count of every collective.

:class:`Hook` counts every collective the job issues under its signature (type,
bytes, group), whatever issued it, on gloo and NCCL. It replaces the collective
functions of ``torch.distributed`` (see :mod:`lagom.runtime.collectives`) with thin
wrappers that count the call and then call the original with the very same arguments,
returning its result (tensors, async work handles) untouched. What does not pass them
(DDP's gradient buckets, issued from C++; the functional collectives of DeviceMesh,
DTensor and compiled code) is counted at PyTorch's ``c10d`` dispatcher ops
(:mod:`lagom.runtime.c10d_observer`); a wrapped call runs below autograd, where those
kernels do not see it again, so each collective counts once. The tuned file is
consulted once per distinct signature: a wrapped call's steady-state cost is one byte
count, one dict lookup and one increment (under a microsecond); a collective seen at
the dispatcher costs a Python call (tens of microseconds: a DDP bucket, not a kernel).
On a torch whose c10d ops cannot be observed one note says so and the wrappers count
alone. Group creation is wrapped by
:class:`lagom.runtime.process_groups.GroupOptionsInjector`.

Failure policy: anything that goes wrong inside the hook stops the hook's own work
(the job keeps running with NCCL's choices) and prints ONE warning line. Notes about
settings that cannot apply (gloo, a CPU-only torch) are printed once, by rank 0.
Public entry point and documentation: :mod:`lagom.runtime`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path

from lagom.files.tuned_config import TunedConfig, load_tuned_config
from lagom.runtime import audit
from lagom.runtime.c10d_observer import C10dObserver
from lagom.runtime.coll_config import CONFIG_KEYWORD, CollConfigDoor, coll_config_door, per_call_config
from lagom.runtime.collectives import ALSO_IN_C10D, SPECS, TYPE_INDEX, TYPE_ORDER, CollectiveSpec
from lagom.runtime.env import EnvMerge, merge_env
from lagom.runtime.process_groups import GroupOptionsInjector
from nccl_env.errors import LagomError

_IGNORED = None  # record info for a call on a group this rank is not part of
# What computing a call's key raises when the arguments are wrong (a str for a tensor, a
# missing argument): torch rejects that call itself, so it is not the hook's failure.
_BAD_CALL = (AttributeError, KeyError, IndexError, TypeError)


def _env_rank() -> int | None:
    value = os.environ.get("RANK")
    return int(value) if value is not None and value.strip().isdigit() else None


class Hook:
    """One process's hook. Build it through :func:`lagom.runtime.install`.

    ``config`` may be given directly, or loaded from ``config_path`` on first need
    (``lazy``: when the first process group is created, so that processes which never
    create one, like torchrun's own launcher, never read or warn about the file).
    """

    def __init__(
        self,
        config: TunedConfig | None = None,
        config_path: str | os.PathLike | None = None,
        run_dir: str | os.PathLike | None = None,
        stream=None,
        lazy: bool = False,
        deliver_works: bool = False,
    ):
        self.config = config
        # Under `lagom run --online --collective-timing` the wrappers also hand each returned Work
        # handle, with the call's resolved signature, to ``work_sink`` once the online runtime sets
        # it (its clock reads the collectives' durations); other runs keep the plain wrappers.
        self.deliver_works = deliver_works
        self.work_sink: Callable[[tuple, object], None] | None = None
        self.lazy = lazy
        self.config_path = str(config_path) if config_path else ""
        self.run_dir = Path(run_dir) if run_dir else None
        self.stream = stream
        self.observing = False  # read by every wrapper; False = pass straight through
        # True while the c10d dispatcher ops are observed: a call the Python wrappers counted then runs
        # below autograd, where the observer's kernels do not see it again
        self.dispatcher_counts = False
        self._observer: C10dObserver | None = None
        self._observer_tried = False
        self.failed = False
        self.counts: dict[tuple, list] = {}  # (type index, bytes, group) -> [count, info]
        self.rank: int | None = None
        self.warnings: list[str] = []
        self.env_merge: EnvMerge | None = None
        self._said: set[str] = set()
        self._patched: list[tuple[object, str, object]] = []  # (module, attribute, original)
        self._injector: GroupOptionsInjector | None = None
        self._config_tried = config is not None
        self._finished = False
        # NCCL 2.31's per-collective config, where the running torch takes one (lagom.runtime.coll_config);
        # None: the tuner plugin carries the per-collective settings alone
        self.coll_door: CollConfigDoor | None = None
        self.door_backends: tuple[str, ...] = ("nccl",)  # the groups whose calls take it (torch refuses others)
        self._per_call: dict[tuple, object | None] = {}  # signature key -> its config (None: none to pass)

    # ------------------------------------------------------------------ messages
    def _emit(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        with contextlib.suppress(OSError, ValueError):
            print(line, file=stream, flush=True)

    def _is_rank0(self) -> bool:
        rank = self.rank if self.rank is not None else _env_rank()
        return rank is None or rank == 0

    def note(self, message: str) -> None:
        """An informational line, once per distinct message, printed by rank 0 only."""
        if message in self._said:
            return
        self._said.add(message)
        self.warnings.append(f"note: {message}")
        if self._is_rank0():
            self._emit(f"lagom: note: {message}")

    def warn(self, message: str, everyone: bool = False) -> None:
        """A warning line, once per process; ``everyone=False``: rank 0 prints it."""
        if message in self._said:
            return
        self._said.add(message)
        self.warnings.append(f"warning: {message}")
        if everyone or self._is_rank0():
            rank = self.rank if self.rank is not None else _env_rank()
            where = f" (rank {rank})" if everyone and rank is not None else ""
            self._emit(f"lagom: warning{where}: {message}")

    def fail(self, where: str, exc: BaseException) -> None:
        """Stop the hook's own work after an internal error; the job continues untouched."""
        self.observing = False
        if self.failed:
            return
        self.failed = True
        first = str(exc).splitlines()[0] if str(exc) else ""
        self.warn(
            f"hook disabled after an internal error in {where} ({type(exc).__name__}: {first}); "
            "the job continues with NCCL's own choices",
            everyone=True,
        )

    # ------------------------------------------------------------------ config
    def ensure_config(self) -> TunedConfig | None:
        """Load the tuned file on first need; on failure: one warning, hook off."""
        if self._config_tried:
            return self.config
        self._config_tried = True
        try:
            if not self.config_path:
                raise LagomError("no tuned config given (set LAGOM_CONFIG or pass a path)")
            self.config = load_tuned_config(self.config_path)
        except LagomError as exc:
            self.observing = False
            self.warn(f"{exc}; running with NCCL's own choices")
            return None
        self.env_merge = merge_env(self.config.env, os.environ)
        if self.env_merge.kept and not self.lazy:  # under `lagom run` the launcher said it already
            self.note(self.env_merge.kept_line())
        return self.config

    def _process_groups(self) -> dict[str, dict]:
        """The tuned per-group settings, loading the file if needed; {} once failed. Called as each
        group is created, when torch is whole: the c10d ops are observed from the first one on."""
        self._observe_c10d()
        if self.failed:
            return {}
        config = self.ensure_config()
        return config.process_groups if config is not None else {}

    # ------------------------------------------------------------------ patching
    def install(self) -> None:
        """Patch torch.distributed. Raises on a torch without distributed support."""
        import torch.distributed as dist

        if not dist.is_available():
            raise LagomError("this torch has no torch.distributed")
        import torch.distributed.distributed_c10d as c10d

        self._injector = GroupOptionsInjector(self._process_groups, self.note, self.fail)
        self._injector.install()
        self.coll_door = coll_config_door(sys.modules.get("torch"), tuple(spec.function for spec in SPECS))
        if self.coll_door is not None:
            self.note("this torch takes NCCL's per-collective config (NCCL >= 2.31): the tuned channels and "
                      "algorithm go with each matched call, the tuner plugin carries the rest")
        for spec in SPECS:
            original = getattr(dist, spec.function, None)
            if original is None or not callable(original):
                continue
            try:
                params = list(inspect.signature(original).parameters)
            except (TypeError, ValueError):
                continue
            if "group" not in params or any(name not in params for name in spec.buffers):
                continue
            wrapper = self._wrap(spec, original, params)
            self._patch(dist, spec.function, wrapper)
            if spec.function in ALSO_IN_C10D and getattr(c10d, spec.function, None) is original:
                self._patch(c10d, spec.function, wrapper)
        if getattr(sys.modules.get("torch"), "library", None) is not None:
            self._observe_c10d()  # else torch is still importing (the bootstrap): at the first group's creation
        self.observing = self.config is not None or not self._config_tried

    def _observe_c10d(self) -> None:
        """Count at the c10d dispatcher ops from now on; where they cannot be observed, one note."""
        if self._observer_tried:
            return
        self._observer_tried = True
        observer = C10dObserver(self._count, self.fail, lambda: self.observing)
        try:
            observer.install()
        except LagomError as exc:
            self.note(f"{exc}: the audit counts the calls of torch.distributed's Python functions only "
                      "(not DDP's buckets or other collectives issued from C++)")
        else:
            self._observer, self.dispatcher_counts = observer, True

    def _count(self, type_index: int, nbytes: int, group: str) -> None:
        """One collective seen at the dispatcher."""
        key = (type_index, nbytes, group)
        record = self.counts.get(key)
        if record is None:
            record = self._new_record(key)
        record[0] += 1

    def _patch(self, module: object, name: str, replacement: object) -> None:
        self._patched.append((module, name, getattr(module, name)))
        setattr(module, name, replacement)

    def uninstall(self) -> None:
        """Put every original function back (later patches first)."""
        self.observing = False
        for module, name, original in reversed(self._patched):
            setattr(module, name, original)
        self._patched.clear()
        if self._observer is not None:
            self._observer.uninstall()
            self._observer, self.dispatcher_counts = None, False
        self._observer_tried = False
        if self._injector is not None:
            self._injector.uninstall()

    def _wrap(self, spec: CollectiveSpec, original, params: list[str]):
        hook = self
        counts = self.counts
        type_index = TYPE_INDEX[spec.collective]
        nbytes_of = spec.byte_rule(params)
        group_pos = params.index("group")
        # torch.compiler.is_compiling() is constant-folded to True while torch.compile
        # traces, so a compiled region sees only `original` (which dynamo maps to
        # functional collectives), never our byte count on symbolic shapes. Looked up at
        # call time: the bootstrap installs the hook while torch is still importing.
        import torch

        # Below autograd, as torch's own autograd fallback runs a c10d op: the observer's kernel there
        # (lagom.runtime.c10d_observer) is for collectives that do not pass these wrappers.
        below_autograd = torch._C._AutoDispatchBelowAutograd

        # The hot path: a flag test, a byte count, a dict lookup, an increment.
        def wrapper(*args, **kwargs):
            if hook.observing and not torch.compiler.is_compiling():
                try:
                    key = (
                        type_index,
                        nbytes_of(args, kwargs),
                        args[group_pos] if len(args) > group_pos else kwargs.get("group"),
                    )
                except _BAD_CALL:  # arguments torch itself rejects: not counted, hook stays on
                    key = None
                if key is not None:
                    try:
                        record = counts.get(key)
                        if record is None:
                            record = hook._new_record(key)
                        record[0] += 1
                    except Exception as exc:
                        hook.fail(spec.function, exc)
                if hook.dispatcher_counts:  # counted here: the c10d op below must not count it again
                    with below_autograd():
                        return original(*args, **kwargs)
            return original(*args, **kwargs)

        if self.coll_door is not None and spec.function in self.coll_door.functions:
            wrapper = self._configuring(spec, wrapper, type_index, nbytes_of, group_pos)
        if self.deliver_works:  # under --online --collective-timing: the Work a call returns goes to the online clock
            counting = wrapper

            def delivering(*args, **kwargs):
                result = counting(*args, **kwargs)
                sink = hook.work_sink
                if sink is not None and result is not None and hook.observing and not torch.compiler.is_compiling():
                    try:
                        group = args[group_pos] if len(args) > group_pos else kwargs.get("group")
                        key = (type_index, nbytes_of(args, kwargs), group)
                        record = counts.get(key)
                        if record is None:  # counted at the dispatcher: resolve the signature once here
                            record = hook._new_record(key)
                        if record[1] is not _IGNORED:
                            sink(record[1][:5], result)  # (collective, group, ranks, nodes, bytes): no entry index
                    except Exception as exc:
                        hook.fail(spec.function, exc)
                return result

            wrapper = delivering

        functools.update_wrapper(wrapper, original)
        wrapper.__lagom_original__ = original  # type: ignore[attr-defined]  # our marker on a function object
        return wrapper

    def _configuring(self, spec: CollectiveSpec, counting, type_index: int, nbytes_of, group_pos: int):
        """``counting`` passing each call of a matched signature its per-collective config
        (:mod:`lagom.runtime.coll_config`); a config the caller gave wins."""
        hook = self
        import torch

        def configuring(*args, **kwargs):
            if hook.observing and CONFIG_KEYWORD not in kwargs and not torch.compiler.is_compiling():
                try:
                    key = (type_index, nbytes_of(args, kwargs),
                           args[group_pos] if len(args) > group_pos else kwargs.get("group"))
                except _BAD_CALL:  # torch rejects the call itself
                    key = None
                per_call = None
                if key is not None:
                    try:
                        per_call = hook._per_call_for(key)
                    except Exception as exc:
                        hook.fail(spec.function, exc)
                if per_call is not None:
                    kwargs[CONFIG_KEYWORD] = per_call
            return counting(*args, **kwargs)

        return configuring

    def _per_call_for(self, key: tuple) -> object | None:
        """The config for a signature's calls, built once: its tuned entry's, on a group of
        :attr:`door_backends`; None elsewhere (NCCL decides, or the plugin carries it)."""
        if key in self._per_call:
            return self._per_call[key]
        value = None
        record = self.counts.get(key) or self._new_record(key)
        info = record[1]
        if (info is not _IGNORED and info[5] is not None and self.config is not None and self.coll_door is not None
                and self._backend(key[2]) in self.door_backends):
            value = per_call_config(self.coll_door, self.config.collectives[info[5]].config)
        self._per_call[key] = value
        return value

    @staticmethod
    def _backend(group) -> str:
        """The backend of a group argument, lower-case; '' where it cannot be told."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        try:
            pg = c10d._resolve_process_group(group) if isinstance(group, str) else group  # type: ignore[arg-type]
            return str(dist.get_backend(pg)).lower()
        except (ValueError, KeyError, RuntimeError, AttributeError):
            return ""

    # ------------------------------------------------------------------ signatures
    def _new_record(self, key: tuple) -> list:
        """First call of a signature: resolve the group and match the tuned file once."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return [0, _IGNORED]  # torch will raise its own error; not cached
        config = self.ensure_config()
        if config is None:
            return [0, _IGNORED]
        if self.rank is None:
            self.rank = dist.get_rank()
        type_index, nbytes, group = key
        info = self._group_info(group)
        if info is None:
            record: list = [0, _IGNORED]  # [count, info]
        else:
            name, size, nodes = info
            collective = TYPE_ORDER[type_index]
            entry = config.lookup(collective, name, nbytes, size, nodes)
            index = None
            if entry is not None:
                index = next(i for i, e in enumerate(config.collectives) if e is entry)
            record = [0, (collective.value, name, size, nodes, nbytes, index)]
        self.counts[key] = record
        return record

    @staticmethod
    def _group_info(group) -> tuple[str, int, int | None] | None:
        """(name, size, nodes spanned) of a group argument; None if this rank is not in it."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        if group is None:
            pg = c10d._get_default_group()
        elif isinstance(group, str):
            try:
                pg = c10d._resolve_process_group(group)  # type: ignore[arg-type]  # GroupName: a NewType of str
            except (ValueError, KeyError, RuntimeError):
                return None  # not a group name: torch raises its own error for the call
        else:
            pg = group
        if pg is None or pg == dist.GroupMember.NON_GROUP_MEMBER:
            return None
        name = getattr(pg, "group_name", None) or c10d._get_process_group_name(pg)
        ranks = dist.get_process_group_ranks(pg)
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        nodes = len({r // int(local) for r in ranks}) if local.isdigit() and int(local) > 0 else None
        return str(name), len(ranks), nodes

    def signature_counts(self) -> list[audit.SignatureCount]:
        """Counts per signature; keys that name one group two ways (None, WORLD) are summed."""
        totals: dict[tuple, int] = {}
        for count, info in list(self.counts.values()):
            if info is not _IGNORED and count:
                totals[info] = totals.get(info, 0) + count
        return [audit.SignatureCount(c, g, size, nodes, nbytes, n, entry)
                for (c, g, size, nodes, nbytes, entry), n in totals.items()]

    def summary(self) -> audit.Summary:
        return audit.Summary.of(self.signature_counts())

    # ------------------------------------------------------------------ exit
    def finish(self) -> None:
        """At exit: write this rank's audit part; rank 0 prints the summary line."""
        if self._finished:
            return
        self._finished = True
        try:
            from lagom.runtime import online

            counts = self.signature_counts()
            decisions = [d.to_dict() for d in self._injector.decisions] if self._injector else []
            session = online.step_hook.listener
            online_part = session.summary(counts) if session is not None else None
            if not counts and not decisions and online_part is None:
                return  # this process never used torch.distributed (e.g. torchrun's launcher)
            rank = self.rank if self.rank is not None else (_env_rank() or 0)
            if self.run_dir is not None:
                audit.write_rank_part(
                    self.run_dir, audit.rank_part(rank, counts, decisions, self.warnings, online_part)
                )
            if rank == 0:
                partial = " (partial: the hook stopped after an internal error)" if self.failed else ""
                line = (audit.summary_line("rank 0", audit.Summary.of(counts)) if online_part is None
                        else audit.online_summary_line("rank 0", online_part))
                self._emit(line + partial)
        except Exception as exc:  # exit paths must never raise
            self._emit(f"lagom: warning: audit not written ({type(exc).__name__}: {exc})")
