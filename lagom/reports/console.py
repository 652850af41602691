"""The console a command prints its text report on."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

PIPE_COLUMNS = 100  # text reports fit this width when stdout is a pipe or a file and COLUMNS is not set


def mib(n_bytes: int | None, unit: bool = True) -> str:
    """A size in MiB, the one unit for sizes in every report: ``16 MiB``, ``1.375 MiB``,
    ``0.0003662 MiB`` (4 significant digits); ``unknown`` where the trace recorded none."""
    if n_bytes is None:
        return "unknown"
    return f"{n_bytes / (1 << 20):.4g}" + (" MiB" if unit else "")


def stdout_console() -> Console:
    """$COLUMNS when set (as rich reads it on a terminal), else the terminal's width; on a pipe or a file
    without COLUMNS, PIPE_COLUMNS (rich would use 80). Its tables keep their numbers whole (:class:`ReportConsole`)."""
    if sys.stdout.isatty():
        return ReportConsole()
    columns = os.environ.get("COLUMNS", "")
    return ReportConsole(width=int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_COLUMNS)


class ReportConsole(Console):
    """A console whose tables narrow by wrapping words, never by cutting a number: each table it prints
    gets column widths from :func:`fit_columns` first, so a report fits 80 columns with every number in it."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for table in objects:
            if isinstance(table, Table):
                fit_columns(table, self.width)
        super().print(*objects, **kwargs)


_NUMBER_WORD_CHARS = 24  # a word with a digit and at most this long is a number (a path or a hash may fold)


def _is_number(word: str) -> bool:
    return len(word) <= _NUMBER_WORD_CHARS and any(ch.isdigit() for ch in word)


def fit_columns(table: Table, width: int) -> Table:
    """Give ``table``'s columns widths that fit ``width`` with every number whole (a word of at most
    24 characters with a digit in it: ``1,171.2>1,171.2``, ``x8r/1n``, ``ProfilerStep#4``) and every
    header word whole (``measured``, never ``measur``/``ed``).

    Left alone when the table fits as it is. Otherwise every column may wrap at spaces; each
    gets at least its longest word (if that is too wide, the frame goes first: a plain rule
    under the header and three spaces between columns, then two; then the longest cell words
    fold, numbers and header words never), and the width left goes to the columns in
    proportion to what they lack: to whole cells first, then to whole headers. Narrower than
    the numbers and header words alone need (no report here needs 80 columns for them), rich
    folds them."""
    columns = table.columns
    texts = [[_plain(c) for c in (col.header, *col.cells)] for col in columns]
    longest = [max((len(line) for t in ts for line in t.splitlines()), default=1) for ts in texts]
    if sum(longest) + _chrome(table) <= width:
        return table
    words = [max((len(w) for t in ts for w in t.split()), default=1) for ts in texts]
    numbers = [max((len(w) for t in ts[1:] for w in t.split() if _is_number(w)), default=1) for ts in texts]
    whole = [max(n, max((len(w) for w in ts[0].split()), default=1)) for n, ts in zip(numbers, texts)]
    for frame in _NARROWER_FRAMES:  # the first frame in which every word fits, else every number and header word
        if sum(words) + _chrome(table) <= width:
            break
        table.box, table.show_edge, table.pad_edge, table.padding = frame
    cap = max(words)  # the longest word that stays whole: lowered until the table fits (numbers stay whole)
    while cap > 1 and sum(max(n, min(w, cap)) for n, w in zip(whole, words)) + _chrome(table) > width:
        cap -= 1
    widths = [max(n, min(w, cap)) for n, w in zip(whole, words)]
    cells = [max((len(line) for t in ts[1:] for line in t.splitlines()), default=1) for ts in texts]
    for target in (cells, longest):  # whole cells first, then whole headers
        room = width - _chrome(table) - sum(widths)
        lack = [max(0, top - now) for top, now in zip(target, widths)]
        if room <= 0 or not sum(lack):
            continue
        widths = [now + min(d, room * d // sum(lack)) for now, d in zip(widths, lack)]
    for col, now in zip(columns, widths):
        col.width, col.min_width, col.no_wrap, col.overflow = now, None, False, "fold"
    return table


# Ever narrower frames for a table too wide for its words: a rule under the header, a padding either
# side of the space between columns; then one padding (rich's padding: top, right, bottom, left).
_NARROWER_FRAMES = ((box.SIMPLE_HEAD, False, False, (0, 1)), (box.SIMPLE_HEAD, False, False, (0, 1, 0, 0)))


def _chrome(table: Table) -> int:
    """Columns' padding and the frame's characters: what a table adds to its cells' widths."""
    n = len(table.columns)
    _, right, _, left = Padding.unpack(table.padding)
    pad = n * (left + right) - (0 if table.pad_edge else left + right)
    frame = 0 if table.box is None else (n - 1) + (2 if table.show_edge else 0)
    return pad + frame


def _plain(cell: object) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        return Text.from_markup(cell).plain
    return ""


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
