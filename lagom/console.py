"""The console a command prints its text report on."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

PIPE_COLUMNS = 100  # text reports fit this width when stdout is a pipe or a file


def stdout_console() -> Console:
    """The terminal's width on a terminal; PIPE_COLUMNS otherwise (rich would use 80)."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_COLUMNS)


class StageProgress:
    """Progress of a long step on stderr: a rich bar on a terminal; on a pipe or a file, a
    plain line when the step starts, at each quarter of it (or each new stage when the
    total is unknown), and when it ends."""

    def __init__(self, console: Console, label: str, total: int | None = None, enabled: bool = True,
                 unit: str = "steps") -> None:
        self.console, self.label, self.total, self.enabled, self.unit = console, label, total, enabled, unit
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._stage: str | None = None
        self._done = 0
        self._quarter = 0

    def __enter__(self) -> StageProgress:
        if not self.enabled:
            return self
        if self.console.is_terminal:
            self._bar = Progress(TextColumn(f"[bold]{self.label}[/] {{task.description}}"), BarColumn(),
                                 MofNCompleteColumn(), TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=self.total)
        else:
            self._line(f"{self.label}: started" + (f" ({self.total} {self.unit})" if self.total else ""))
        return self

    def update(self, done: int, total: int | None = None, stage: str | None = None) -> None:
        self._done = done
        if not self.enabled:
            return
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=done, total=total or self.total, description=stage or "")
        else:
            total = total or self.total
            if total:
                quarter = min(4, done * 4 // total)
                if 0 < quarter < 4 and quarter > self._quarter:
                    self._line(f"{self.label}: {done}/{total}" + (f" ({stage})" if stage else ""))
                self._quarter = max(self._quarter, quarter)
            elif stage is not None and stage != self._stage:
                self._line(f"{self.label}: {stage}")
        self._stage = stage

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
        elif self.enabled and exc[0] is None:
            self._line(f"{self.label}: done ({self._done} {self.unit})")

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)
