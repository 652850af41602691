"""Reading a user's input file: the one-line LagomError every loader gives for a file it cannot read.

A missing file, an unreadable one and (for :func:`read_yaml`) one that is not YAML each
raise :class:`~nccl_env.errors.LagomError` naming the file; what the content must be is
the caller's to check.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from nccl_env.errors import LagomError


def read_text(path: Path) -> str:
    """The file's text; LagomError ("PATH: no such file" / "PATH: cannot read: ...") otherwise."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise LagomError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise LagomError(f"{path}: cannot read: {exc}") from None


def read_yaml(path: Path) -> object:
    """The file parsed as YAML; LagomError with the parser's first line when it is not YAML."""
    text = read_text(path)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "parse error"
        raise LagomError(f"{path}: not valid YAML: {first}") from None
