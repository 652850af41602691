"""Rank-scoped what-ifs judged against paired N-rank traces (issue 26).

    python3 bench/joint_accuracy.py [--seed N] [--json]

tests/kineto_ranks.py runs a job of four ranks (hosts' clocks off by 0, 310, -240 and
470 us) twice, the second time with one rank's compute slower or faster or every
collective's transfer F times as long. ``lagom simulate FIRST_DIR --scale ...`` (every
rank replayed at once) must give every rank's steps of the second run: per pair, the
true change of the mean step, the predicted change on each rank, the median per-step
error (the worst rank's) and the verdict of tests/test_joint_replay.py (median error <=
2%, change within 15% of the true one, on every rank). With ``--rank``-style one-rank
replays (``--one-rank``) each rank is replayed alone under the same what-if instead:
what the joint replay adds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import kineto_ranks as kr  # noqa: E402
import kineto_world as kw  # noqa: E402

from lagom.cli import main as lagom_main  # noqa: E402

# (program, comm factor, {rank: compute factor}): tests/test_joint_replay.py's pairs
PAIRS: list[tuple[str, float, dict[int, float]]] = [
    ("straggler", 1.0, {2: 1 / 1.45}), ("straggler", 2.0, {}),
    ("pipeline", 1.0, {2: 1.3}), ("pipeline", 2.0, {}), ("pipeline", 1.0, {0: 0.6}),
    ("moe", 1.0, {1: 0.7}), ("moe", 1.5, {}),
    # issue 32's held-out pipelines, peers as PyTorch 2.5+ writes them: 1F1B in two-rank groups,
    # and one pipeline group strided over 32 ranks (stage 1 is rank 8)
    ("pipeline_1f1b", 1.0, {1: 1.3}), ("pipeline_strided", 1.0, {1: 1.3}),
]


def scale_args(comm: float, compute: dict[int, float], p: kr.RankProgram) -> list[str]:
    """The what-if as ``--scale`` flags: ``compute`` keyed by stage, flagged by its global rank."""
    out = [f"comm={comm:g}"] if comm != 1.0 else []
    out += [f"compute={f:.6g}@{p.global_rank(r)}" for r, f in compute.items()]
    return [x for a in out for x in ("--scale", a)]


def simulate(folder: Path, argv: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = lagom_main(["simulate", str(folder), "--json", "--jobs", "1", *argv])
    if code != 0:
        raise SystemExit(f"lagom simulate {folder} {' '.join(argv)}: exit {code}")
    return json.loads(out.getvalue())


def judge(name: str, comm: float, compute: dict[int, float], folder: Path, seed: int, one_rank: bool) -> dict:
    p = kr.PROGRAMS[name]
    first, _, truth = kr.paired_ranks(p, folder, comm=comm, compute=compute, seed=seed)
    flags = scale_args(comm, compute, p)
    label = f"{name} " + " ".join(a for a in flags if a != "--scale")
    ranks = [p.global_rank(r) for r in range(p.ranks)]
    if one_rank:
        per_rank = {str(r): simulate(first, ["--rank", str(r), *flags])["steps"] for r in ranks}
    else:
        per_rank = {r: v["steps"] for r, v in simulate(first, flags)["ranks"].items()}
    verdicts = []
    for r, pair in zip(ranks, truth.ranks):
        steps = {s["name"]: s for s in per_rank[str(r)]}
        verdicts.append(kw.verdict(pair, [steps[t.name]["iteration_us"] for t in pair.second.steps]))
    return {"what_if": label, "true_change_pct": [round(100 * v.true_change, 2) for v in verdicts],
            "predicted_change_pct": [round(100 * v.predicted_change, 2) for v in verdicts],
            "worst_median_step_error_pct": round(100 * max(v.median_step_error for v in verdicts), 2),
            "passed": all(v.passed for v in verdicts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the programs' jitter seed (default 0)")
    parser.add_argument("--one-rank", action="store_true", help="replay each rank alone (--rank N) instead")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="joint-") as tmp:
        rows = [judge(n, c, f, Path(tmp), args.seed, args.one_rank) for n, c, f in PAIRS]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'what-if':30} {'true change (4 ranks)':>30} {'predicted':>30} {'worst median error':>18}  verdict")
    for r in rows:
        true = " ".join(f"{x:+.1f}%" for x in r["true_change_pct"])
        pred = " ".join(f"{x:+.1f}%" for x in r["predicted_change_pct"])
        print(f"{r['what_if']:30} {true:>30} {pred:>30} {r['worst_median_step_error_pct']:17.2f}%  "
              f"{'pass' if r['passed'] else 'FAIL'}")
    print(f"{sum(r['passed'] for r in rows)} of {len(rows)} pairs pass on every rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
