"""Compile Lagom's tuner plugin (nccl_env/plugin/*.c) into a shared library, cached by source hash.

The cache is Lagom's one cache folder (:func:`nccl_env.cache.cache_dir`:
``$LAGOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/lagom``, else ``~/.cache/lagom``); the
file name carries a hash of the sources and the compile command, so an edited source
or another compiler gives a new build and an unchanged one is reused. No NCCL headers or libnccl are needed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from nccl_env.cache import cache_dir
from nccl_env.errors import LagomError

PLUGIN_DIR = Path(__file__).resolve().parent / "plugin"
LIBRARY_STEM = "libnccl-tuner-lagom"
CFLAGS = ["-std=c11", "-O2", "-fPIC", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread"]
# Warnings fail only the tests' build: on a user's machine a newer compiler's new warning must not mean "no plugin".
STRICT_FLAGS = ["-Werror"]
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]


class PluginBuildError(LagomError):
    """No usable C compiler, or the plugin did not compile (one line)."""


def plugin_sources() -> list[Path]:
    """The C sources compiled into the plugin (headers are hashed too)."""
    return sorted(PLUGIN_DIR.glob("*.c"))


def find_compiler(cc: str | None = None) -> str:
    """Absolute path of the C compiler: ``cc``, else ``$CC``, else ``cc``/``gcc``/``clang`` on PATH.

    Raises PluginBuildError when the named or found compiler does not exist.
    """
    wanted = cc or os.environ.get("CC")
    candidates = [wanted] if wanted else ["cc", "gcc", "clang"]
    for name in candidates:
        found = shutil.which(name)
        if found:
            return str(Path(found).resolve())
    if wanted:
        raise PluginBuildError(f"C compiler {wanted!r} not found (set CC or pass --cc to a working compiler)")
    raise PluginBuildError("no C compiler found on PATH (tried cc, gcc, clang); install one or set CC")


def source_hash(extra: list[str]) -> str:
    """Hash of every plugin source/header plus the compile command ``extra``."""
    h = hashlib.sha256()
    for path in sorted(PLUGIN_DIR.glob("*.[ch]")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update("\0".join(extra).encode())
    return h.hexdigest()[:16]


def compile_c(compiler: str, sources: list[Path], output: Path, flags: list[str]) -> None:
    """Run ``compiler flags sources -o output`` atomically; PluginBuildError with the first error line."""
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=output.name + ".", dir=output.parent)
    except OSError as exc:
        raise PluginBuildError(f"cannot write to plugin cache {output.parent}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        cmd = [compiler, *flags, *map(str, sources), "-o", str(tmp)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except OSError as exc:
            raise PluginBuildError(f"cannot run C compiler {compiler}: {exc.strerror or exc}") from None
        except subprocess.TimeoutExpired:
            raise PluginBuildError(f"C compiler {compiler} took more than 300 s") from None
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if "error" in ln] or (
                proc.stderr or proc.stdout or "no output"
            ).splitlines()
            raise PluginBuildError(f"plugin does not compile with {compiler}: "
                                   f"{lines[0].strip() if lines else 'no output'}")
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)


def build_plugin(force: bool = False, cc: str | None = None, strict: bool = False) -> Path:
    """Build (or reuse) the tuner plugin; returns the absolute path of the ``.so``.

    ``strict`` (the tests) makes warnings errors. Raises PluginBuildError (one line)
    when there is no compiler or the source does not compile.
    """
    compiler = find_compiler(cc)
    flags = [*CFLAGS, *(STRICT_FLAGS if strict else []), "-shared"]
    digest = source_hash([compiler, *flags])
    out = (cache_dir() / f"{LIBRARY_STEM}-{digest}.so").resolve()
    if out.exists() and not force:
        return out
    compile_c(compiler, plugin_sources(), out, flags)
    return out
