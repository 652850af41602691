"""Reading and writing Workload JSON files (``.json`` or ``.json.gz``)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from nccl_env.errors import LagomError
from traces.workload import Workload


def save_workload(workload: Workload, path: str | Path) -> None:
    data = orjson.dumps(workload.to_dict(), option=orjson.OPT_INDENT_2)
    path = Path(path)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def is_workload_file(path: str | Path) -> bool:
    """True when the file's first bytes say it is a Lagom workload (cheap sniff)."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            head = fh.read(4096)
    except (OSError, EOFError):
        return False
    return b'"lagom.workload"' in head


def load_workload(path: str | Path) -> Workload:
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        return Workload.from_dict(orjson.loads(raw))
    except FileNotFoundError:
        raise LagomError(f"{path}: no such file") from None
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise LagomError(f"{path}: cannot read: {exc}") from None
    except orjson.JSONDecodeError as exc:
        raise LagomError(f"{path}: not valid JSON: {exc}") from None
    except (KeyError, ValueError, TypeError) as exc:
        raise LagomError(f"{path}: not a valid Lagom workload: {exc}") from None
