"""The one step listener a job has (``lagom run --online``'s session or ``lagom record``'s
recorder), driven by torch's global ``register_optimizer_step_post_hook``: every
``optimizer.step()`` is a step boundary, until the job calls :func:`lagom.runtime.step`
by hand (the listener is then ``explicit`` and the optimizer's steps no longer count).
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar


class StepListener(Protocol):
    explicit: bool

    def boundary(self) -> None: ...


L = TypeVar("L", bound=StepListener)


class StepHook(Generic[L]):
    """The listener installed (None before :meth:`install` and after :meth:`uninstall`) and the
    torch hook that drives it."""

    def __init__(self) -> None:
        self.listener: L | None = None
        self._handle: Any = None

    def install(self, listener: L) -> L:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        def after_optimizer_step(optimizer, args, kwargs) -> None:
            if not listener.explicit:
                listener.boundary()

        self.listener = listener
        self._handle = register_optimizer_step_post_hook(after_optimizer_step)
        return listener

    def uninstall(self) -> None:
        if self._handle is not None:
            self._handle.remove()
        self.listener = self._handle = None

    def step(self) -> None:
        """A boundary by hand: from now on the optimizer's steps are not boundaries."""
        if self.listener is None:
            return
        self.listener.explicit = True
        self.listener.boundary()
