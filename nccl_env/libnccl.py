"""Find the NCCL library this Python would use and ask it for its version.

Search order: ``$LAGOM_LIBNCCL`` (an explicit path), torch's own ``torch/lib``,
the ``nvidia-nccl-cu12`` wheel (``nvidia/nccl/lib/libnccl.so.2``), then the system
(``ctypes.util.find_library`` and the usual CUDA paths). ``ncclGetVersion`` needs
no GPU, so this works on a CPU-only machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import mmap
import os
from dataclasses import dataclass
from pathlib import Path

from nccl_env.errors import LagomError
from nccl_env.rules import NcclVersion

SYSTEM_PATHS = (
    "/usr/lib/x86_64-linux-gnu/libnccl.so.2",
    "/usr/lib/aarch64-linux-gnu/libnccl.so.2",
    "/usr/local/cuda/lib64/libnccl.so.2",
    "/usr/lib64/libnccl.so.2",
    "/usr/local/lib/libnccl.so.2",
)


@dataclass(frozen=True)
class LibNccl:
    """A libnccl file and where it was found (``env``, ``torch``, ``nvidia-nccl-cu12``, ``system``)."""

    path: Path
    source: str


def _package_dir(name: str) -> Path | None:
    """Directory of an importable package, without importing it (torch is slow to import)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def candidates() -> list[LibNccl]:
    """Every libnccl found, in search order (the first is the one used)."""
    found: list[LibNccl] = []
    explicit = os.environ.get("LAGOM_LIBNCCL")
    if explicit:
        found.append(LibNccl(Path(explicit), "env"))
    torch_dir = _package_dir("torch")
    if torch_dir is not None:
        found += [LibNccl(p, "torch") for p in sorted((torch_dir / "lib").glob("libnccl*.so*"))]
    nvidia_nccl = _package_dir("nvidia.nccl")
    if nvidia_nccl is not None:
        lib = nvidia_nccl / "lib" / "libnccl.so.2"
        if lib.exists():
            found.append(LibNccl(lib, "nvidia-nccl-cu12"))
    system = ctypes.util.find_library("nccl")
    paths = [system] if system else []
    paths += [p for p in SYSTEM_PATHS if Path(p).exists()]
    for p in paths:
        found.append(LibNccl(Path(p), "system"))
    seen: set[str] = set()
    unique = []
    for candidate in found:
        key = str(candidate.path)
        if key not in seen:
            seen.add(key)
            unique.append(candidate)
    return unique


def find_libnccl() -> LibNccl:
    """The libnccl to use; LagomError when none is found."""
    found = candidates()
    if not found:
        raise LagomError("no libnccl found (not in torch/lib, no nvidia-nccl-cu12 wheel, none on the system); "
                         "pip install nvidia-nccl-cu12 or set LAGOM_LIBNCCL")
    return found[0]


def nccl_version(path: str | Path) -> NcclVersion:
    """Load ``path`` and call ``ncclGetVersion``; LagomError (one line) when that fails."""
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise LagomError(f"{path}: cannot load: {str(exc).splitlines()[0]}") from None
    try:
        get_version = lib.ncclGetVersion
    except AttributeError:
        raise LagomError(f"{path}: has no ncclGetVersion (not an NCCL library?)") from None
    code = ctypes.c_int(0)
    get_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
    get_version.restype = ctypes.c_int
    rc = get_version(ctypes.byref(code))
    if rc != 0:
        raise LagomError(f"{path}: ncclGetVersion returned error {rc}")
    return NcclVersion.from_code(code.value)


def strings_present(path: str | Path, names: list[str]) -> dict[str, bool]:
    """Which of ``names`` occur as NUL-terminated strings in the library file (NCCL_PARAM names are literals)."""
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return {name: data.find(name.encode() + b"\0") >= 0 for name in names}
    except (OSError, ValueError) as exc:
        raise LagomError(f"{path}: cannot read: {exc}") from None
