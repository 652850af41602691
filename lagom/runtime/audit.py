"""The audit: which collectives a job issued and whether the tuned file covered them.

Each rank's hook writes ``<run dir>/audit/rank-<R>.json`` at exit (a *part*); the
launcher merges the parts after the job ends, which works even when a rank died
before rank 0 could collect anything. Merged file (``lagom run --audit FILE``)::

    {"format": "lagom.audit", "version": 1, "config": "lagom.yaml", "ranks": 2,
     "summary": {"collectives": 40, "matched": 30, "bytes": 81920, "bytes_matched": 61440},
     "signatures": [{"collective": "allreduce", "group": "0", "group_size": 2, "nodes": 1,
                     "bytes": 4096, "count": 20, "ranks": [0, 1], "entry": 0,
                     "set": {"channels": 2}}, ...],
     "per_rank": {"0": {"pid": 123, "summary": {...}, "signatures": [...],
                        "process_groups": [...], "warnings": [...]}, ...}}

``entry`` is the index of the first matching entry in the config's ``collectives``
list (null: unmatched, NCCL decides). Counts are every collective the rank issued, seen at
the c10d dispatcher ops whoever issued them (:mod:`lagom.runtime.c10d_observer`).

Under ``lagom run --online`` the document also has ``"online": {"steps_spent",
"evaluations", "epochs", "per_rank": {"0": [plan hash of each epoch, ...], ...}, "result":
"kept" | "reverted", "reason" (after a revert: why), "summary"}`` and each rank's part
an ``online`` entry: its epochs as
[epoch, plan hash, first step], per epoch the plugin table's per-entry call counts as
the plugin counted them, and its ``summary``: its calls matched against the plan in
force (a call is matched when its signature is one the online plans set: every plan
of the online space sets the same signatures), not against the seed file's entries.
The summary lines then say what the online run did (:func:`online_summary_line`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, astuple, dataclass
from pathlib import Path

from lagom.files.output_paths import write_output
from nccl_env.errors import LagomError

AUDIT_FORMAT = "lagom.audit"
VERSION = 1
AUDIT_PART_DIR = "audit"


@dataclass(frozen=True)
class SignatureCount:
    """Calls of one signature on one rank (or summed over ranks once merged)."""

    collective: str
    group: str
    group_size: int
    nodes: int | None
    bytes: int
    count: int
    entry: int | None  # index of the matching tuned entry, None = unmatched

    @property
    def matched(self) -> bool:
        return self.entry is not None

    def key(self) -> tuple:
        return (self.collective, self.group, self.group_size, self.nodes, self.bytes)


@dataclass(frozen=True)
class Summary:
    collectives: int
    matched: int
    bytes: int
    bytes_matched: int

    @classmethod
    def of(cls, counts: Iterable[SignatureCount],
           matched_by: Callable[[SignatureCount], bool] | None = None) -> Summary:
        """Totals; a call counts as matched when ``matched_by`` says so (default: it matched a tuned entry)."""
        total = matched = nbytes = nbytes_matched = 0
        for c in counts:
            total += c.count
            nbytes += c.count * c.bytes
            if (c.matched if matched_by is None else matched_by(c)):
                matched += c.count
                nbytes_matched += c.count * c.bytes
        return cls(total, matched, nbytes, nbytes_matched)

    def to_dict(self) -> dict:
        return asdict(self)


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.0f}%" if whole else "-"


def summary_line(who: str, summary: Summary) -> str:
    """``lagom: rank 0: 40 collectives, 30 matched a tuned entry (75%), 60.0 KiB of 80.0 KiB covered (75%)``."""
    return (
        f"lagom: {who}: {summary.collectives} collectives, {summary.matched} matched a tuned entry "
        f"({_pct(summary.matched, summary.collectives)}), {_size(summary.bytes_matched)} of "
        f"{_size(summary.bytes)} covered ({_pct(summary.bytes_matched, summary.bytes)})"
    )


def online_summary_line(who: str, online: dict) -> str:
    """``lagom: rank 0: online tuning kept its result: 4 epochs, 57 steps spent, 12 measured plans; 40 collectives,
    30 of a tuned signature (75%), ...``: what the run did, and the calls the plan in force covered."""
    result = online.get("result") or ""
    done = {"kept": "kept its result", "reverted": "reverted to the seed"}.get(
        result, f"ended ({result or 'unfinished'})")
    if online.get("reason"):
        done += f" ({online['reason']})"
    summary = Summary(**online["summary"]) if online.get("summary") else Summary(0, 0, 0, 0)
    epochs = online.get("epochs") or 0  # a rank's part lists them, the merged document counts them
    epochs = len(epochs) if isinstance(epochs, list) else epochs
    return (
        f"lagom: {who}: online tuning {done}: {epochs} epochs, "
        f"{online.get('steps_spent') or 0} steps spent, "
        f"{online.get('evaluations') or 0} measured plans; {summary.collectives} collectives, "
        f"{summary.matched} of a tuned signature ({_pct(summary.matched, summary.collectives)}), "
        f"{_size(summary.bytes_matched)} of "
        f"{_size(summary.bytes)} covered ({_pct(summary.bytes_matched, summary.bytes)})"
    )


def rank_part(rank: int, counts: list[SignatureCount], process_groups: list[dict], warnings: list[str],
              online: dict | None = None) -> dict:
    ordered = sorted(counts, key=lambda c: (c.group, c.collective, c.bytes))
    part = {
        "rank": rank,
        "pid": os.getpid(),
        "summary": Summary.of(ordered).to_dict(),
        "signatures": [asdict(c) for c in ordered],
        "process_groups": process_groups,
        "warnings": warnings,
    }
    if online is not None:
        part["online"] = online
    return part


def merge_online(parts: list[dict]) -> dict | None:
    """The audit's ``online`` section: the decider's (rank 0's) counts and result, and per
    rank the plan hash of each epoch (equal lists: the ranks agreed); each rank's
    epochs with their first step, and its tables' per-entry call counts, stay in its part."""
    online = {str(p.get("rank")): p["online"] for p in parts if "online" in p}
    if not online:
        return None
    decider = online.get("0", {})
    summaries = [Summary(**part["summary"]) for part in online.values() if part.get("summary")]
    return {
        "steps_spent": decider.get("steps_spent"),
        "evaluations": decider.get("evaluations"),
        "epochs": len(decider.get("epochs", [])),
        "per_rank": {rank: [epoch[1] for epoch in part.get("epochs", [])] for rank, part in online.items()},
        "result": decider.get("result") or None,
        **({"reason": decider["reason"]} if decider.get("reason") else {}),
        "summary": Summary(*(sum(column) for column in zip(*(astuple(s) for s in summaries), strict=True))).to_dict()
        if summaries else None,
    }


def write_rank_part(run_dir: str | Path, part: dict) -> Path:
    """Write one rank's part atomically (rename), so a merge never reads half a file."""
    folder = Path(run_dir) / AUDIT_PART_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank-{part['rank']}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(part, indent=1))
    os.replace(tmp, path)
    return path


def read_parts(run_dir: str | Path) -> list[dict]:
    """Every rank part under ``run_dir``, by rank; unreadable parts are skipped."""
    parts = []
    for path in sorted((Path(run_dir) / AUDIT_PART_DIR).glob("rank-*.json")):
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(parts, key=lambda p: p.get("rank", 0))


def merge_parts(parts: list[dict], entries_set: list[dict] | None = None, config_path: str = "") -> dict:
    """One audit document from the rank parts. ``entries_set[i]`` is entry i's ``set``."""
    merged: dict[tuple, dict] = {}
    all_counts: list[SignatureCount] = []
    for part in parts:
        for raw in part.get("signatures", []):
            c = SignatureCount(**raw)
            all_counts.append(c)
            row = merged.get(c.key())
            if row is None:
                row = merged[c.key()] = {**asdict(c), "count": 0, "ranks": []}
                if c.entry is not None and entries_set is not None and c.entry < len(entries_set):
                    row["set"] = entries_set[c.entry]
            row["count"] += c.count
            row["ranks"].append(part.get("rank"))
    signatures = sorted(merged.values(), key=lambda r: (r["group"], r["collective"], r["bytes"]))
    document = {
        "format": AUDIT_FORMAT,
        "version": VERSION,
        "config": config_path,
        "ranks": len(parts),
        "summary": Summary.of(all_counts).to_dict(),
        "signatures": signatures,
        "per_rank": {str(p.get("rank")): {k: v for k, v in p.items() if k != "rank"} for p in parts},
    }
    online = merge_online(parts)
    if online is not None:
        document["online"] = online
    return document


def write_audit(path: str | os.PathLike, document: dict) -> Path:
    """Write the merged audit atomically (its first key, ``"format": "lagom.audit"``, marks it as Lagom's)."""
    path = Path(path)
    try:
        write_output(path, json.dumps(document, indent=1) + "\n")
    except LagomError as exc:
        raise LagomError(f"{path}: cannot write the audit ({exc})") from None
    return path
