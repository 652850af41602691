"""The largest sizes Lagom takes from a spec string or a file, checked before anything is built from them.

A spec string or a workload file is a few bytes that can ask for anything: a job of
10^11 ranks, a collective of an exabyte, a billion layers. Each size has a bound here,
checked where the input is read (``traces.generate`` for specs, ``traces.workload_io``
for workload files, ``costmodel.cluster`` for cluster files) before any list, op or
group is made from it; beyond a bound the input is refused in one line (LagomError).
A trace file is checked against the memory at hand before it is read
(:func:`check_fits_memory`), and read no further than :func:`trace_json_limit_bytes`
(a gzip stream's bytes counted as they are decompressed: its trailer may lie).
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from nccl_env.errors import LagomError

# Llama 3 405B was trained on 16,384 H100 GPUs (Meta, "The Llama 3 Herd of Models", 2024);
# eight times that leaves room. A process group lists its ranks, so this bounds memory too.
MAX_RANKS = 131_072
MAX_NODES = MAX_RANKS
# GB200 NVL72 (72 GPUs on one NVLink domain) is the largest node NCCL treats as one; 1024 leaves room.
MAX_GPUS_PER_NODE = 1024
# More than any GPU's memory (H200: 141 GB, B200: 192 GB): no rank's collective buffer is larger.
MAX_MESSAGE_BYTES = 1 << 40
# Ops in one workload. Measured on the 2-core development machine: tp:phi2:tp=8,dp=2,steps=50
# (76,883 ops) builds and simulates in 6 s and 193 MB, so 10^6 ops is about 2.5 GB and 80 s; the
# largest shared trace has 7,747 ops.
MAX_OPS = 1_000_000
# Thread blocks of one kernel per grid axis: CUDA's x limit (y and z stop at 65535 on a GPU; the
# generator lays a GEMM's rows on y and may pass that for long sequences, so x's limit bounds all three).
MAX_GRID_AXIS = 2**31 - 1

# Memory to read a trace, per byte of its JSON. Measured: the chunked reader peaks at 3.9x on
# a100_w16_sendrecv_3streams_rank0 (25.8 MB of JSON) and keeps 0.5-5.7x of the smaller traces.
TRACE_MEMORY_PER_JSON_BYTE = 4.0
TRACE_KEPT_PER_JSON_BYTE = 1.0  # what each file of a folder keeps while the next is read
# A workload JSON is parsed whole into dataclasses: 15.4x its size (tp:phi2:tp=8,dp=2,steps=10, 7.8 MB).
WORKLOAD_MEMORY_PER_JSON_BYTE = 16.0
# Profiler JSON compresses 13-23x with gzip (the shared traces); 5x is a floor no real trace goes under,
# used to tell a gzip trailer's size modulo 2^32 apart from the true size of a trace over 4 GiB.
GZIP_RATIO_FLOOR = 5
# The most JSON one trace or workload file is read to, whatever the memory at hand: 16x the largest
# shared trace (a100_w16_sendrecv_3streams_rank0, 25.8 MB of JSON) would still be far under it.
MAX_TRACE_JSON_BYTES = 64 << 30
# deflate's largest ratio is 1032:1 (zlib FAQ): a gzip file under 4 GiB / 1032 holds less than 4 GiB.
DEFLATE_MAX_RATIO = 1032


def check_bound(what: str, value: int, bound: int, where: str) -> None:
    """LagomError ``"{where}: {what}={value} is over Lagom's bound of {bound}"`` when ``value > bound``
    (the bounds and their reasons: this module)."""
    if value > bound:
        raise LagomError(f"{where}: {what}={value:,} is over Lagom's bound of {bound:,}")


def trace_json_limit_bytes(per_json_byte: float = TRACE_MEMORY_PER_JSON_BYTE) -> int:
    """How many bytes of JSON one file is read to (decompressed, for gzip): :data:`MAX_TRACE_JSON_BYTES`,
    lowered to what the memory at hand can parse at ``per_json_byte``."""
    free = available_memory_bytes()
    limit = MAX_TRACE_JSON_BYTES
    if free is not None:
        limit = min(limit, int(free / per_json_byte))
    return limit


def json_bytes(path: Path) -> int:
    """The bytes of JSON in a trace or workload file: its size, or for gzip the size the trailer
    records (modulo 2^32), raised by 4 GiB steps to at least :data:`GZIP_RATIO_FLOOR` x the file
    where the file is large enough for the trailer to have wrapped."""
    size = path.stat().st_size
    if not path.is_file():  # a FIFO or a device: never opened here (the reader refuses it)
        return size
    try:
        with path.open("rb") as fh:
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            (isize,) = struct.unpack("<I", fh.read(4))
    except OSError:
        return size
    if size * DEFLATE_MAX_RATIO >= 1 << 32:  # large enough to hold 4 GiB of JSON: the trailer may have wrapped
        while isize < size * GZIP_RATIO_FLOOR:
            isize += 1 << 32
    return isize


def process_limit_left_bytes() -> int | None:
    """What this process's own limits leave it (``ulimit -v``: RLIMIT_AS less its address space now;
    ``ulimit -d``: RLIMIT_DATA less its data segment now); None where neither is set or it cannot tell."""
    try:
        import resource
    except ImportError:  # not on Linux/Unix: no such limits
        return None
    left: list[int] = []
    for name, field in (("RLIMIT_AS", "VmSize:"), ("RLIMIT_DATA", "VmData:")):
        soft, _hard = resource.getrlimit(getattr(resource, name))
        if soft == resource.RLIM_INFINITY:
            continue
        used = 0
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(field):
                    used = int(line.split()[1]) * 1024
                    break
        left.append(max(0, soft - used))
    return min(left) if left else None


def available_memory_bytes() -> int | None:
    """Memory this process can still take: /proc/meminfo's MemAvailable, lowered to the cgroup's
    limit less its use where one is set (a container) and to what the process's own limits leave it
    (:func:`process_limit_left_bytes`); None where none says."""
    found: list[int] = []
    own = process_limit_left_bytes()
    if own is not None:
        found.append(own)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
                break
    except (OSError, ValueError, IndexError):
        pass
    if not found:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            found.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_fits_memory(files: Iterable[Path], origin: str | Path, per_json_byte: float,
                      available: int | None = None) -> None:
    """LagomError when reading ``files`` (one input: a file, or a folder's files read one after the
    other) would take more memory than is available, estimated from their JSON sizes before reading."""
    sizes = []
    for f in files:
        try:
            sizes.append(json_bytes(f))
        except OSError:
            continue  # the reader says what is wrong with it
    if not sizes:
        return
    needed = max(sizes) * per_json_byte + (sum(sizes) - max(sizes)) * TRACE_KEPT_PER_JSON_BYTE
    free = available_memory_bytes() if available is None else available
    if free is not None and needed > free:
        raise LagomError(f"{origin}: {sum(sizes) / 1e9:,.1f} GB of JSON needs about {needed / 1e9:,.1f} GB of "
                         f"memory to read, more than the {free / 1e9:,.1f} GB available here")
