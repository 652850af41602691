"""The runtime side of Lagom: apply a tuned config inside a torch.distributed job.

Three doors carry a tuned file (``lagom.yaml``) into a job:

- **env** (process-wide): the file's ``env`` knobs (NCCL_NTHREADS, NCCL_BUFFSIZE ...),
  set before NCCL reads them; a variable the user set themselves wins.
- **process group** (per communicator): ``process_groups`` settings (min_ctas,
  max_ctas, cta_policy) passed as ``ProcessGroupNCCL.Options`` when the group is
  created (see :mod:`lagom.runtime.process_groups`).
- **tuner plugin** (per collective): ``collectives`` entries, written as the C
  plugin's table; NCCL asks the plugin at each collective. Only ``lagom run`` sets
  this door up (it builds the plugin once, not once per rank).

Two ways in:

- ``lagom run --config lagom.yaml -- torchrun ...`` (:mod:`lagom.runtime.launcher`):
  all three doors, no change to the training script; workers install the hook from a
  ``sitecustomize`` bootstrap (:mod:`lagom.runtime.bootstrap`).
- ``import lagom; lagom.install("lagom.yaml")`` at the top of a script, before
  ``init_process_group``: env and process-group doors plus the audit.

Under ``lagom run --online`` (:mod:`lagom.runtime.online`) every ``optimizer.step()`` is
a step boundary of online tuning, and under ``lagom record`` (:mod:`lagom.runtime.record`)
of the recorded window; a job without a torch optimizer calls :func:`step`.

The hook also counts every collective call under its signature and whether a tuned
entry matches it (:mod:`lagom.runtime.hook`); at exit rank 0 prints one summary line
and, under ``lagom run --audit``, each rank's counts go into the audit file
(:mod:`lagom.runtime.audit`). Nothing the hook does changes a call's arguments or
results; any failure inside it leaves the job to NCCL's own choices with one warning.
"""

from __future__ import annotations

import atexit
import contextlib
import os

from lagom.runtime.env import ENV_CONFIG, ENV_RUN_DIR
from lagom.runtime.hook import Hook
from nccl_env.errors import LagomError

__all__ = ["Hook", "current", "install", "step", "uninstall"]

_current: Hook | None = None


def install(
    path: str | os.PathLike | None = None,
    *,
    run_dir: str | os.PathLike | None = None,
    lazy: bool = False,
    stream=None,
) -> Hook:
    """Install the hook in this process and return it (replacing an earlier one).

    ``path`` defaults to ``$LAGOM_CONFIG``; ``run_dir`` (default ``$LAGOM_RUN_DIR``)
    is where this rank writes its audit part at exit. With ``lazy`` the file is read
    when the first process group is created (the bootstrap uses this, so processes
    that never create one stay silent). Under ``lagom run --online --collective-timing``
    the wrappers also hand the collectives' Work handles to the online clock. Never raises for a bad file or an unusable
    torch: the returned hook is then inactive and one warning line says why.
    """
    global _current
    if _current is not None:
        _current.uninstall()
        _current = None
    path = path if path is not None else os.environ.get(ENV_CONFIG) or None
    run_dir = run_dir if run_dir is not None else os.environ.get(ENV_RUN_DIR) or None
    from lagom.runtime.online import collective_timing_requested

    hook = Hook(config_path=path, run_dir=run_dir, stream=stream, lazy=lazy,
                deliver_works=collective_timing_requested())
    if not lazy and hook.ensure_config() is None:
        return hook
    try:
        hook.install()
    except Exception as exc:  # an old or unusual torch: leave it untouched
        hook.uninstall()
        message = str(exc) if isinstance(exc, LagomError) else f"{type(exc).__name__}: {exc}"
        hook.warn(f"hook not installed ({message}); running with NCCL's own choices")
        return hook
    atexit.register(hook.finish)
    _current = hook
    return hook


def uninstall() -> None:
    """Remove the installed hook (its counts stay readable on the Hook object)."""
    global _current
    if _current is not None:
        _current.uninstall()
        with contextlib.suppress(Exception):
            atexit.unregister(_current.finish)
        _current = None


def current() -> Hook | None:
    """The hook installed in this process, if any."""
    return _current


def step() -> None:
    """Mark the end of a training step for ``lagom run --online`` and ``lagom record`` (jobs
    without a torch optimizer; with one, torch's optimizer step hook does it). A no-op otherwise."""
    from lagom.runtime import online, record

    online.step_hook.step()
    record.step_hook.step()
