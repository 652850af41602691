"""PyTorch profiler (Kineto) traces as a :class:`traces.reader.TraceReader`: the first reader.

Reading is :mod:`traces.kineto` (chunked JSON, one pass over events, collective metadata);
writing a replay's prediction back is :mod:`traces.kineto_export`. Kineto claims a
``.json`` / ``.json.gz`` file and a folder holding such files; it is also the fallback
reader (:func:`traces.reader.reader_for`), whose one-line errors name what is wrong with a
path no reader claims.
"""

from __future__ import annotations

from pathlib import Path

from traces.kineto import is_trace_name, kept_scan, scan_file
from traces.kineto import read_trace as read_kineto
from traces.kineto import trace_files as kineto_files
from traces.kineto_export import moved_trace
from traces.reader import MovedOps, ReadTrace, ScannedTrace
from traces.workload import Workload


class KinetoReader:
    """Kineto JSON traces, one file per rank."""

    name: str = "kineto"

    def can_read(self, path: Path) -> bool:
        if path.is_dir():
            return any(p.is_file() and is_trace_name(p.name) for p in path.iterdir())
        return path.is_file() and is_trace_name(path.name)

    def files(self, path: Path) -> list[Path]:
        return kineto_files(path)

    def scan(self, file: Path) -> ScannedTrace:
        return scan_file(file)

    def kept_scan(self, file: Path) -> ScannedTrace | None:
        return kept_scan(file)

    def read(self, path: Path) -> ReadTrace:
        files = kineto_files(path)
        return ReadTrace(read_kineto(path), tuple(files), self.name)

    def moved_trace(self, workload: Workload, moved: MovedOps, gzipped: bool, stamp: dict) -> tuple[bytes, int]:
        return moved_trace(workload, moved, gzipped, stamp)


KINETO = KinetoReader()
