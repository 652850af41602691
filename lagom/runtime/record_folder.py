"""``lagom record -o DIR``'s folder: what Lagom owns there, the fresh folder a recording goes to, the swap.

``lagom record`` owns in DIR only what its manifest lists: ``lagom-record.txt`` (the
reader skips it: not .json) names the job and each trace file it put there. Before a job
starts, :func:`check_out_dir` refuses DIR when it holds anything else (a user's own
``rank-7.json.gz`` included): nothing of theirs is ever removed. The ranks write into a
fresh folder beside DIR (:func:`new_recording_folder`), and :func:`install` moves that
recording into DIR only once it is complete (the job succeeded and every rank wrote its
trace): the traces the manifest listed for another job are removed then, not before. A
recording that is not complete leaves DIR as it was; its traces, if any, stay in their
folder beside DIR, which one line names.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from nccl_env.errors import LagomError
from nccl_env.files import PathKind, check_path_kind

MANIFEST = "lagom-record.txt"
TRACE_NAME = re.compile(r"^rank-\d+\.json\.gz$")  # the only names a manifest may list (never a path)
NAMED_AT_MOST = 5  # a refusal names this many of the folder's files
_JOB = "Job: "
_TRACE = "Trace: "


@dataclass(frozen=True)
class Manifest:
    """The job and the trace files ``lagom record`` put in a folder."""

    job_id: str | None
    traces: tuple[str, ...]

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        """The folder's manifest; None when it has none (or it cannot be read: then nothing is ours)."""
        path = folder / MANIFEST
        if check_path_kind(path, str(path), expected="lagom record's manifest") is not PathKind.FILE:
            return None
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            return None
        job = next((line[len(_JOB):].strip() for line in lines if line.startswith(_JOB)), None)
        traces = tuple(sorted({name for line in lines if line.startswith(_TRACE)
                               for name in [line[len(_TRACE):].strip()] if TRACE_NAME.match(name)}))
        return cls(job, traces)

    def text(self, command: str, window: str) -> str:
        return ("Written by lagom record: one PyTorch profiler (Kineto) trace per rank, rank-<R>.json.gz, of one "
                "job.\nlagom record removes or replaces only the files listed below, nothing else in this folder.\n"
                f"Command: {command}\nWindow: {window}.\n"
                "Read with: lagom analyze <this folder>; lagom tune <this folder>.\n"
                f"{_JOB}{self.job_id}\n" + "".join(f"{_TRACE}{name}\n" for name in self.traces))


def check_out_dir(out_dir: str | os.PathLike) -> list[Path]:
    """The folder a job may record into (made if missing); the traces of an earlier ``lagom record``
    there (its manifest's), which a complete new recording will replace.

    LagomError (nothing starts) when it is a file, a device, a FIFO or a link loop, cannot be
    created or written, or holds anything its manifest does not list."""
    path = Path(out_dir)
    kind = check_path_kind(path, f"-o {out_dir}", folder=True, expected="a folder for the ranks' traces")
    if kind is PathKind.FILE:
        raise LagomError(f"-o {out_dir}: is a file, expected a folder for the ranks' traces")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LagomError(f"-o {out_dir}: cannot create the folder: {exc.strerror or exc}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".lagom-probe-"):
            pass
    except OSError as exc:
        raise LagomError(f"-o {out_dir}: cannot write into the folder: {exc.strerror or exc}") from None
    manifest = Manifest.read(path)
    owned = set(manifest.traces) if manifest is not None else set()
    entries = sorted(path.iterdir())
    foreign = [e.name for e in entries if e.name != MANIFEST and not (e.name in owned and e.is_file())]
    if foreign:
        names = ", ".join(foreign[:NAMED_AT_MOST]) + (f" and {len(foreign) - NAMED_AT_MOST} more"
                                                      if len(foreign) > NAMED_AT_MOST else "")
        raise LagomError(f"-o {out_dir}: holds files lagom record did not write ({names}); give an empty or new "
                         "folder (lagom tune reads every trace in it as one job's ranks)")
    return [e for e in entries if e.name in owned]


def new_recording_folder(out: Path) -> Path:
    """A fresh folder beside ``out`` (same file system: the traces move into ``out`` by rename)."""
    try:
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.lagom-record-", dir=out.parent))
    except OSError as exc:
        raise LagomError(f"-o {out}: cannot create the recording's folder beside it in {out.parent}: "
                         f"{exc.strerror or exc}") from None


def recorded_traces(folder: Path) -> list[str]:
    """The complete trace files in a recording's folder (a rank's partial file is not one)."""
    try:
        return sorted(p.name for p in folder.iterdir() if TRACE_NAME.match(p.name) and p.is_file())
    except OSError:
        return []


def install(out: Path, recording: Path, job_id: str, command: str, window: str) -> tuple[list[str], int]:
    """Move a complete recording from its folder into ``out``: its traces replace those the manifest
    listed for another job (listed traces of this same job, another node's, stay), the manifest is
    rewritten, the recording's folder removed. Returns (the traces now in ``out`` from this job, how
    many of an earlier recording were removed)."""
    new = recorded_traces(recording)
    old = Manifest.read(out)
    same_job = [n for n in old.traces if old.job_id == job_id] if old is not None else []
    earlier = [n for n in old.traces if old.job_id != job_id and n not in new] if old is not None else []
    try:
        for name in new:
            os.replace(recording / name, out / name)
        for name in earlier:
            with contextlib.suppress(FileNotFoundError):
                (out / name).unlink()
        manifest = Manifest(job_id, tuple(sorted(set(same_job) | set(new))))
        fd, tmp = tempfile.mkstemp(prefix=f".{MANIFEST}.", dir=out)
        with os.fdopen(fd, "w") as fh:
            fh.write(manifest.text(command, window))
        os.replace(tmp, out / MANIFEST)
    except OSError as exc:
        raise LagomError(f"-o {out}: cannot move the recording in from {recording}: {exc.strerror or exc}") from None
    shutil.rmtree(recording, ignore_errors=True)
    replaced = len([n for n in old.traces if old.job_id != job_id]) if old is not None else 0
    return sorted(set(same_job) | set(new)), replaced
