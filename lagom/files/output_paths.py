"""Where a command writes: checked before any work, replaced whole or not at all, never a user's own file.

Every file a ``lagom`` command writes goes through :func:`check_output` before the
command does any work (reads a trace, tunes, starts the job) and through
:func:`write_output` at the end:

- refused, one line naming the flag and the file (LagomError, exit 2): an empty name, a
  folder, a device, a FIFO, a socket, a symbolic-link loop (:func:`nccl_env.files.check_path_kind`:
  nothing is opened), a folder that does not exist or in which no file can be created
  (tried, not guessed from permission bits), a path that is one of the command's inputs
  (compared resolved, through symbolic and hard links) or lies inside an input folder
  (the next read of that folder would take it for one of its files);
- an existing file is replaced only when Lagom wrote it, recognised by its format's
  marker (:class:`OutputFormat`), or when ``--force`` is given;
- the target's state (missing, or its device, inode, size and time) is remembered at the
  check and compared just before the rename: a file that appeared or changed during the
  work (the user's, another command's) is not replaced without ``--force``; the new
  output is kept beside it (``NAME.new``) and one line says so;
- the write goes to a temporary file in the same folder, renamed over the target
  (``os.replace``): a Ctrl-C or a full disk leaves the old file or the new one, never
  half of one; a symbolic link keeps pointing where it did and its target is replaced.
"""

from __future__ import annotations

import contextlib
import enum
import gzip
import io
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from nccl_env.errors import LagomError
from nccl_env.files import PathKind, check_path_kind, path_kind

MARKER_SCAN_BYTES = 8192  # how much of a file's head and tail the marker is looked for in


class OutputFormat(enum.Enum):
    """What a command writes, and the bytes that say Lagom wrote a file of that kind.

    The marker is looked for in the first and last :data:`MARKER_SCAN_BYTES` of the file:
    YAML and CSV files carry it on their first line, JSON files in their first key,
    plots in their metadata (PNG ``Software``, SVG title: the head; PDF ``Creator``: the tail).
    """

    TUNED_CONFIG = ("a tuned config", (b"format: lagom.tuned-config",))
    AUDIT = ("an audit", (b'"format": "lagom.audit"',))
    PLUGIN_TABLE = ("a plugin table", (b"# Lagom tuner plugin table",))
    CLUSTER = ("a cluster file", (b"# Lagom cluster file",))
    MEASUREMENTS = ("a measurements file", (b'"format": "lagom.calibration-measurements"',))
    PLOT = ("a plot", (b"lagom-nccl",))
    EXPORTED_TRACE = ("a trace Lagom exported", (b'"lagom_export":',))  # lagom.files.trace_export's last key

    def __init__(self, label: str, markers: tuple[bytes, ...]) -> None:
        self.label = label
        self.markers = markers

    def written_by_lagom(self, path: Path) -> bool:
        """Whether the file at ``path`` carries this format's marker (an exported trace may be
        gzip: its JSON's tail is read through it)."""
        if self is OutputFormat.EXPORTED_TRACE:
            try:
                with gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb") as fh:
                    tail = b""
                    while chunk := fh.read(1 << 20):
                        tail = (tail + chunk)[-MARKER_SCAN_BYTES:]
            except (OSError, EOFError, gzip.BadGzipFile):
                return False
            return any(m in tail for m in self.markers)
        try:
            with path.open("rb") as fh:
                head = fh.read(MARKER_SCAN_BYTES)
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(len(head), size - MARKER_SCAN_BYTES))
                tail = fh.read(MARKER_SCAN_BYTES)
        except OSError:
            return False
        return any(m in head or m in tail for m in self.markers)


# What every plot Lagom writes carries in its metadata (matplotlib's ``metadata=``).
PLOT_METADATA = {".png": {"Software": "lagom-nccl"}, ".svg": {"Creator": "lagom-nccl"},
                 ".pdf": {"Creator": "lagom-nccl"}}

# A folder ``lagom run --workdir`` laid out holds this file (the launcher's own files may be replaced there).
RUN_FOLDER_MARKER = ".lagom-run"


def check_output(flag: str, value: str | os.PathLike, fmt: OutputFormat, inputs: Iterable[tuple[str, object]] = (),
                 force: bool = False) -> Path:
    """The path to write ``value`` (``flag``'s argument) to, checked as the module doc says.

    ``inputs``: (what, path) pairs the command reads, e.g. ``("WORKLOAD", args.workload)``;
    values that are not existing paths (a spec string, a preset name, None) are skipped."""
    text = os.fspath(value)
    if not text.strip():
        raise LagomError(f"{flag}: an empty file name")
    path = Path(text)
    kind = check_path_kind(path, f"{flag} {text}", folder=True, expected="a file name")
    if kind is PathKind.FOLDER:
        raise LagomError(f"{flag} {text}: is a folder, expected a file name")
    folder = path.parent
    if check_path_kind(folder, f"{flag} {text}: its folder {folder}", folder=True, file=False) is not PathKind.FOLDER:
        raise LagomError(f"{flag} {text}: {folder} is not an existing folder")
    for what, given in inputs:
        relation = _relation_to_input(path, given)
        if relation == "same":
            raise LagomError(f"{flag} {text}: is also this command's input ({what} {given}); "
                             "give the output another name")
        if relation == "inside":
            raise LagomError(f"{flag} {text}: is inside this command's input folder ({what} {given}), which "
                             "the next read would take as one of its files; give a name outside it")
    _check_writable(flag, text, Path(os.path.realpath(path)).parent)
    if kind is PathKind.FILE and not force and not fmt.written_by_lagom(path):
        raise LagomError(f"{flag} {text}: exists and is not {fmt.label} Lagom wrote; "
                         "give --force to overwrite it, or another name")
    _CHECKED[os.path.realpath(path)] = (_state(path), force)
    return path


# Each output checked in this process: its resolved path -> (its state at the check, --force given).
_CHECKED: dict[str, tuple[tuple[int, int, int, int] | None, bool]] = {}


def _state(path: str | os.PathLike) -> tuple[int, int, int, int] | None:
    """What tells a file apart from the one seen before: device, inode, size, modification time (ns);
    None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _relation_to_input(output: Path, given: object) -> str | None:
    """"same" when ``output`` is the input ``given`` (through symbolic and hard links, or one of the
    files a folder input holds), "inside" when it lies in an input folder, else None."""
    if given is None or isinstance(given, bool):
        return None
    text = os.fspath(given) if isinstance(given, (str, os.PathLike)) else None
    if not text:
        return None
    candidate = Path(text)
    try:
        kind = path_kind(candidate)
        if kind is PathKind.FOLDER:  # a folder of traces: the files its reader reads, and any file put there
            members = [p for p in candidate.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz"))]
        elif kind is PathKind.FILE:
            members = [candidate]
        else:
            return None
    except OSError:
        return None
    target = os.path.realpath(output)
    for member in members:
        if os.path.realpath(member) == target:
            return "same"
        with contextlib.suppress(OSError):
            if output.exists() and os.path.samefile(member, output):  # a hard link
                return "same"
    if kind is PathKind.FOLDER and Path(target).parent == Path(os.path.realpath(candidate)):
        return "inside"
    return None


def _check_writable(flag: str, text: str, folder: Path) -> None:
    """Create (and remove) a file in ``folder``: permission bits do not tell for root or a read-only mount."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".lagom-probe-", dir=folder)
    except OSError as exc:
        raise LagomError(f"{flag} {text}: cannot write in {folder}: {exc.strerror or exc}") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)


def write_output(path: str | os.PathLike, data: str | bytes, flag: str = "") -> Path:
    """Write ``data`` to ``path`` atomically (see the module doc); the path written (a link's target).

    LagomError naming ``flag`` and the path when the write fails."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    check_path_kind(path, where, expected="a file name")  # a FIFO or link loop made since the check: never written
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    payload = data.encode() if isinstance(data, str) else data
    try:
        mode = target.stat().st_mode & 0o777
    except OSError:
        mode = 0o666 & ~_umask()
    tmp_name = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.chmod(tmp_name, mode)
        checked = _CHECKED.get(os.path.realpath(path))
        if checked is not None and not checked[1] and _state(target) != checked[0]:
            kept = _keep_beside(tmp_name, target)
            tmp_name = None
            raise LagomError(f"{where}: appeared or changed since this command checked it (another program "
                             f"wrote it); not replaced: the new one is {kept} (give --force to replace)")
        os.replace(tmp_name, target)
        tmp_name = None
        _CHECKED.pop(os.path.realpath(path), None)
    except OSError as exc:
        raise LagomError(f"{where}: cannot write: {exc.strerror or exc}") from None
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    return target


def _keep_beside(tmp_name: str, target: Path) -> Path:
    """The written temporary file under ``NAME.new`` (``NAME.new2``, ... when taken), never replacing one."""
    for n in range(1, 1000):
        kept = target.with_name(f"{target.name}.new{n if n > 1 else ''}")
        try:
            os.link(tmp_name, kept)
        except FileExistsError:
            continue
        os.unlink(tmp_name)
        return kept
    return Path(tmp_name)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_figure(fig: object, path: str | os.PathLike, flag: str, **savefig_kwargs: object) -> Path:
    """A matplotlib figure written as :func:`write_output` writes, with the metadata that marks it as
    Lagom's (:data:`PLOT_METADATA`); the format is the name's suffix (.png, .svg, .pdf)."""
    suffix = Path(path).suffix.lower()
    buffer = io.BytesIO()
    fig.savefig(buffer, format=suffix.lstrip("."), metadata=PLOT_METADATA.get(suffix), **savefig_kwargs)  # type: ignore[attr-defined]
    return write_output(path, buffer.getvalue(), flag)
