"""How ``lagom run`` and ``lagom record`` get into every worker without touching the script.

The launcher (:func:`lagom.runtime.launcher.write_bootstrap`, for both commands) writes
:data:`SITECUSTOMIZE` as ``sitecustomize.py`` into a folder it puts first on
``PYTHONPATH``. Python imports that module at start-up in every process of the job
(torchrun's launcher and each rank). It first runs the ``sitecustomize`` that would
have run without Lagom (the next one on ``sys.path``),
then imports this module from the Lagom that launched the job (``LAGOM_HOME``, even
when another ``lagom`` comes first on ``sys.path``) and calls :func:`activate`, which
waits for ``torch.distributed`` to be imported
(most processes of a job never import it, and importing torch eagerly would cost
every Python process a second) and installs the hook right after, before the
script's own ``from torch.distributed import ...`` lines bind any name. Under
``lagom record`` (``LAGOM_RECORD``) it installs the recorder's step hook
(:mod:`lagom.runtime.record`) once ``torch.optim.optimizer`` is imported, and no hook.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

from lagom.runtime.env import ENV_CONFIG, ENV_HOME, ENV_ONLINE, ENV_RECORD

TARGET = "torch.distributed"
OPTIMIZER = "torch.optim.optimizer"
OWN_PACKAGES = ("lagom", "nccl_env", "traces", "costmodel", "tuner")  # Lagom's own top-level packages

# The file the launcher writes. Self-contained: it must chain the user's own
# sitecustomize even when lagom cannot be imported in this process.
SITECUSTOMIZE = '''\
"""Written by `lagom run` or `lagom record`: runs the next sitecustomize, then Lagom's bootstrap."""
import os as _os
import sys as _sys


def _lagom_chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.realpath(_os.path.dirname(_os.path.abspath(__file__)))
    rest = [p for p in _sys.path if _os.path.realpath(_os.path.abspath(p or ".")) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _lagom_activate():
    # The Lagom that launched the job, not whichever `lagom` comes first on sys.path
    # (another install would read this config with other code): its folder goes first
    # for this import, which also imports nccl_env (lagom.runtime needs it); modules
    # of both packages imported later follow the packages' __path__.
    home = _os.environ.get("LAGOM_HOME")
    if home:
        _sys.path.insert(0, home)
    try:
        from lagom.runtime import bootstrap
    finally:
        if home:
            _sys.path.remove(home)
    bootstrap.activate()


try:
    _lagom_chain()
finally:
    try:
        _lagom_activate()
    except Exception as _exc:
        print(f"lagom: warning: hook not installed ({type(_exc).__name__}: {_exc}); "
              "running with NCCL's own choices", file=_sys.stderr)
'''


class _InstallAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` once, right after module ``target`` has finished executing."""

    def __init__(self, target: str, callback):
        self.target = target
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.target or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
            loader = spec.loader if spec is not None else None
            if loader is None or not hasattr(loader, "exec_module"):
                return None  # let the normal machinery import it, unhooked
            original_exec = loader.exec_module
            finder = self

            def exec_module(module):
                original_exec(module)
                finder.remove()
                finder.callback()

            loader.exec_module = exec_module
            return spec
        except Exception as exc:  # never break the import of torch
            self.remove()
            print(f"lagom: warning: hook not installed ({type(exc).__name__}: {exc}); running with NCCL's own choices",
                  file=sys.stderr)
            return None
        finally:
            self._busy = False

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


class _PinPackages(importlib.abc.MetaPathFinder):
    """Lagom's top-level packages from ``home`` (the Lagom that launched the job), whatever comes first on
    ``sys.path``: the bootstrap imported ``lagom`` and ``nccl_env`` from there, and ``traces``,
    ``costmodel`` and ``tuner``, imported later by the recorder or the online session, must be the same
    install's. Submodules follow their package's ``__path__``."""

    def __init__(self, home: str) -> None:
        self.home = home

    def find_spec(self, fullname, path, target=None):
        if path is not None or fullname not in OWN_PACKAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.home])


def _pin_packages() -> None:
    home = os.environ.get(ENV_HOME)
    if home and not any(isinstance(f, _PinPackages) for f in sys.meta_path):
        sys.meta_path.insert(0, _PinPackages(home))


def _install_hook() -> None:
    try:
        from lagom.runtime import install

        install(lazy=True)
    except Exception as exc:  # never break the import of torch
        print(f"lagom: warning: hook not installed ({type(exc).__name__}: {exc}); running with NCCL's own choices",
              file=sys.stderr)


def _install_online() -> None:
    try:
        from lagom.runtime import online

        online.install(lambda line: print(line, file=sys.stderr, flush=True))
    except Exception as exc:  # noqa: BLE001 - never break the import of torch
        print(f"lagom: warning: online tuning not installed ({type(exc).__name__}: {exc})", file=sys.stderr)


def _install_record() -> None:
    try:
        from lagom.runtime import record

        record.install(record.emit_stderr)
    except Exception as exc:  # noqa: BLE001 - never break the import of torch
        print(f"lagom: warning: recording not installed ({type(exc).__name__}: {exc})", file=sys.stderr)


def _when_imported(target: str, callback) -> None:
    if target in sys.modules:
        callback()
    else:
        sys.meta_path.insert(0, _InstallAfterImport(target, callback))


def activate() -> None:
    """Install the hook now if torch.distributed is loaded, else right after it loads;
    under ``lagom run --online`` also the step hook, once torch.optim.optimizer is loaded;
    under ``lagom record`` only the recorder's step hook."""
    _pin_packages()
    if os.environ.get(ENV_RECORD):
        _when_imported(OPTIMIZER, _install_record)
    if not os.environ.get(ENV_CONFIG):
        return
    _when_imported(TARGET, _install_hook)
    if os.environ.get(ENV_ONLINE):
        _when_imported(OPTIMIZER, _install_online)
