"""Reading a user's input file: the one-line LagomError every loader gives for a file it cannot read.

A missing file, an unreadable one and (for :func:`read_yaml`) one that is
not YAML each raise :class:`~nccl_env.errors.LagomError` naming the file; what the
content must be is the caller's to check, with :func:`check_keys` for the keys of a
mapping (every loader's "unknown key, did you mean ...") and :func:`check_not_empty` for
a name given as "" (which ``Path`` would read as the current folder).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path

import yaml

from nccl_env.errors import LagomError


def check_not_empty(text: object, what: str) -> None:
    """LagomError for an empty name: ``Path("")`` is the current folder, which no loader means."""
    if isinstance(text, str) and not text.strip():
        raise LagomError(f"{what}: an empty file name")


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


def check_keys(mapping: dict, known: Iterable[str], where: str) -> None:
    """LagomError ``"{where}: unknown key 'colectives' (did you mean 'collectives'?)"`` for the first key of
    ``mapping`` not in ``known``; the suggestion is the closest known key, when one is close."""
    names = list(known)
    for key in mapping:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(names)})"
            raise LagomError(f"{where}: unknown key {key!r}{hint}")
