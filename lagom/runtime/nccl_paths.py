"""Which path NCCL took for each collective, from NCCL's own TUNING log (``lagom run --audit``).

Neither torch nor the tuner plugin sees it: NCCL picks a copy-engine collective or a
symmetric kernel before it would ask a plugin (``nccl_env.rules``). What is observable is
NCCL's INFO log at ``NCCL_DEBUG_SUBSYS=TUNING``, where the rank 0 of each communicator
writes one line per collective it plans (NVIDIA/nccl, format strings at v2.30.7-1):

- ``AllGather [Copy Engine]: 536870912 Bytes -> cudaMemcpy[; CE synchronization with NVLS]``
  (ce_coll.cc, from 2.29; 2.28 writes no line for a copy-engine collective at all);
- ``AllGather [Hierarchical CE]: N Bytes -> RMA proxy + CE`` (across nodes, from 2.30.6);
- ``AllGather [Symmetric]: N Bytes -> Kernel AllGather_ST nchannels 9 nthreads 512 nWorks 1``
  (scheduler/symmetric_sched.cc, from 2.28; 2.27 without ``nWorks``);
- ``AllGather: N Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}`` (enqueue.cc):
  NCCL's SM kernels, on ``Hi - Lo + 1`` channels.

With ``--audit`` and a tuned file that puts a group on a path, ``lagom run`` sets
``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=TUNING`` and ``NCCL_DEBUG_FILE`` (one file per
process in the run folder: NCCL expands ``%h`` and ``%p``) unless the user set any of the
three, reads the files after the job and adds ``nccl_paths`` to the audit; NCCL's
warnings, which the file takes from stderr, are repeated on stderr.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

LOG_DIR = "nccl-log"
DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")

_CE = re.compile(r"NCCL INFO (\w+) \[Copy Engine\]: (\d+) Bytes -> cudaMemcpy")
_HIER_CE = re.compile(r"NCCL INFO (\w+) \[Hierarchical CE\]: (\d+) Bytes -> RMA proxy")
_SYMMETRIC = re.compile(r"NCCL INFO (\w+) \[Symmetric\]: (\d+) Bytes -> Kernel (\S+) nchannels (\d+) nthreads (\d+)")
_KERNEL = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\S+) proto (\S+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
_WARN = re.compile(r"NCCL WARN ")

COPY_ENGINE = "copy engine"
SYMMETRIC = "symmetric kernel"
KERNEL = "sm kernel"


def observation_env(run_dir: Path) -> dict[str, str]:
    """The env that makes NCCL write its TUNING lines to one file per process in the run folder."""
    folder = run_dir / LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "TUNING", "NCCL_DEBUG_FILE": str(folder / "nccl.%h.%p.log")}


@dataclass(frozen=True)
class PathLine:
    """One collective NCCL planned: its function (NCCL's name), bytes, path and CTAs (0: none)."""

    function: str
    bytes: int
    path: str  # COPY_ENGINE | SYMMETRIC | KERNEL
    ctas: int
    kernel: str = ""  # the symmetric kernel, or "ALGO/PROTO" for NCCL's SM kernels


def parse_line(line: str) -> PathLine | None:
    """The collective a TUNING line describes, or None for any other line."""
    m = _CE.search(line) or _HIER_CE.search(line)
    if m:
        return PathLine(m.group(1), int(m.group(2)), COPY_ENGINE, 0)
    m = _SYMMETRIC.search(line)
    if m:
        return PathLine(m.group(1), int(m.group(2)), SYMMETRIC, int(m.group(4)), m.group(3))
    m = _KERNEL.search(line)
    if m:
        lo, hi = int(m.group(5)), int(m.group(6))
        return PathLine(m.group(1), int(m.group(2)), KERNEL, hi - lo + 1, f"{m.group(3)}/{m.group(4)}")
    return None


@dataclass
class PathReport:
    """What the logs of one run say: per (function, bytes, path, ctas, kernel) the lines seen."""

    files: int = 0
    counts: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        by_path: Counter = Counter()
        for line, n in self.counts.items():
            by_path[line.path] += n
        rows = [{"function": line.function, "bytes": line.bytes, "path": line.path, "ctas": line.ctas,
                 "kernel": line.kernel, "count": n}
                for line, n in sorted(self.counts.items(), key=lambda kv: (kv[0].function, kv[0].bytes, kv[0].path))]
        return {
            "observed_from": "NCCL's TUNING log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=TUNING): rank 0 of each "
                             "communicator writes one line per collective it plans; NCCL 2.28 writes none for a "
                             "copy-engine collective",
            "files": self.files,
            "by_path": dict(sorted(by_path.items())),
            "collectives": rows,
        }


def read_logs(run_dir: Path) -> PathReport:
    """Every NCCL log file of the run folder, read line by line."""
    report = PathReport()
    folder = run_dir / LOG_DIR
    if not folder.is_dir():
        return report
    for path in sorted(folder.iterdir()):
        if not path.is_file():
            continue
        report.files += 1
        with path.open(errors="replace") as handle:
            for line in handle:
                parsed = parse_line(line)
                if parsed is not None:
                    report.counts[parsed] += 1
                elif _WARN.search(line):
                    report.warnings.append(line.rstrip("\n"))
    return report


def summary_line(report: PathReport) -> str:
    """One line: how many collectives NCCL planned on each path."""
    by_path: Counter = Counter()
    for line, n in report.counts.items():
        by_path[line.path] += n
    if not by_path:
        return (f"NCCL wrote no TUNING line in {report.files} log file(s) (NCCL 2.28 writes none for a copy-engine "
                "collective; or the job ran no NCCL collective)")
    parts = ", ".join(f"{n} on {path}s" if path != COPY_ENGINE else f"{n} on the copy engines"
                      for path, n in sorted(by_path.items()))
    return f"NCCL's log: {parts}"
