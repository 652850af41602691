"""Build small synthetic Kineto traces for tests (the shape PyTorch's profiler writes)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson


class TraceBuilder:
    """Events are added with explicit times; ``write`` produces a .json or .json.gz file."""

    def __init__(self, rank: int | None = 0, world_size: int = 2, categories: dict | None = None,
                 device: str = "Test GPU", sm_count: int | None = 108, device_props: dict | None = None,
                 devices: int = 1, **distributed) -> None:
        """``distributed``: more ``distributedInfo`` fields (``nccl_version``, ``pg_config``);
        ``device_props``: more ``deviceProperties`` fields (``totalGlobalMem``, ``computeMajor``), listed
        for ``devices`` devices (a process that sees its node's 8 GPUs lists 8)."""
        self.events: list[dict] = []
        self.device = device
        self.sm_count = sm_count
        self.device_props = device_props or {}
        self.devices = devices
        self.distributed = distributed
        self.metadata: dict = {}  # more top-level fields, e.g. baseTimeNanoseconds
        self.corr = 1000
        self.ext = 1
        self.rank = rank
        self.world_size = world_size
        self.cat = {"kernel": "kernel", "runtime": "cuda_runtime", "cpu": "cpu_op", "memcpy": "gpu_memcpy"}
        self.cat.update(categories or {})

    def step(self, n: int, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                            "ts": ts, "dur": dur, "args": {}})

    def cpu(self, name: str, ts: float, dur: float, **args) -> dict:
        self.ext += 1
        event = {"ph": "X", "cat": self.cat["cpu"], "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                 "args": {"External id": self.ext, **args}}
        self.events.append(event)
        return event

    def kernel(self, name: str, stream: int, ts: float, dur: float, launch_ts: float | None = None,
               grid=(108, 1, 1), block=(256, 1, 1), cat: str | None = None, **args) -> int:
        """A GPU op and its launching runtime call (1 us, at ``launch_ts`` or ts - 5)."""
        self.corr += 1
        launch_ts = ts - 5 if launch_ts is None else launch_ts
        self.events.append({"ph": "X", "cat": self.cat["runtime"], "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                            "ts": launch_ts, "dur": 1, "args": {"correlation": self.corr, "External id": self.ext}})
        kargs = {"stream": stream, "correlation": self.corr, "device": 0, "External id": self.ext,
                 "grid": list(grid), "block": list(block), "registers per thread": 32, "shared memory": 1024,
                 "blocks per SM": grid[0] / 108, "est. achieved occupancy %": 50, **args}
        self.events.append({"ph": "X", "cat": cat or self.cat["kernel"], "name": name, "pid": 0, "tid": stream,
                            "ts": ts, "dur": dur, "args": kargs})
        return self.corr

    def doc(self) -> dict:
        out: dict = {"schemaVersion": 1, "traceEvents": self.events,
                     "deviceProperties": [{"id": i, "name": self.device, "numSms": self.sm_count, **self.device_props}
                                          for i in range(self.devices)], **self.metadata}
        if self.rank is not None:
            out["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size,
                                      **self.distributed}
        return out

    def write(self, path: Path) -> Path:
        data = orjson.dumps(self.doc())
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path


def write_rank_copies(source: Path, ranks: int, folder: Path, shift_us: float = 0.0) -> list[Path]:
    """``ranks`` copies of a real trace as the distinct ranks of one job: ``folder/rank{r}.json``
    with ``distributedInfo.rank`` r and a world of at least ``ranks``; copy r's times moved
    ``r * shift_us`` later (ranks that launch their collectives at different times). Written as
    Kineto writes: the metadata first, as ``"rank": r`` (HTA finds a file's rank by that
    pattern), then one event per line."""
    raw = source.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = doc.pop("traceEvents")
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    world = max(int(info.get("world_size") or 0), ranks)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [orjson.dumps(e) for e in events]
    paths = []
    for r in range(ranks):
        shift = r * shift_us
        if shift:
            lines = [orjson.dumps({**e, "ts": e["ts"] + shift})
                     if isinstance(e, dict) and isinstance(e.get("ts"), (int, float)) else orjson.dumps(e)
                     for e in events]
        meta = json.dumps({**doc, "distributedInfo": {**info, "rank": r, "world_size": world}})
        paths.append(folder / f"rank{r}.json")
        paths[-1].write_bytes(meta[:-1].encode() + b', "traceEvents": [\n' + b",\n".join(lines) + b"\n]}\n")
    return paths
