"""What-if accuracy on paired traces: ``lagom simulate FIRST --scale comm=F`` (or
``compute=F``) against the second run of the same program (issue 17, item 3).

    python3 bench/whatif_accuracy.py [--seed N] [--json]

The pairs come from tests/kineto_world.py (the generator the test suite uses; it sits
in tests/ beside its own tests and is imported from there, as mypy reads it with
MYPYPATH=tests): an FSDP-like step on 8 x A100 with NCCL 2.21.5, run once as recorded
and once with every collective's (compute kernel's) GPU time x F, the truth of each
run from the generator's own event simulation. Per what-if of
``kineto_world.WHATIF_GRID``: the GPU's busy share in the first run, the true change of
the mean step, the predicted one, the median per-step error against the second run, and
the verdict of tests/test_whatif_pairs.py (median error <= 2%, change within 15% of the
true one, or within 0.2% of the step where the true change is nil). A what-if that
``lagom simulate`` refuses prints its one-line error instead.
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

import kineto_world as kw  # noqa: E402

from lagom.cli import main as lagom_main  # noqa: E402


def simulate(trace: Path, scale: str) -> tuple[list[dict] | None, str]:
    """``lagom simulate TRACE --scale SCALE --json``'s steps, or None and its error line."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = lagom_main(["simulate", str(trace), "--scale", scale, "--json"])
    except SystemExit as exc:  # argparse refused the arguments
        code = exc.code
    if code != 0:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, lines[-1] if lines else f"exit {code}"
    return json.loads(out.getvalue())["steps"], ""


def judge(whatif: kw.WhatIf, folder: Path, seed: int) -> dict:
    program = kw.SCENARIOS[whatif.scenario]
    first, _, truth = kw.paired(program, folder, comm=whatif.comm, compute=whatif.compute, seed=seed)
    row: dict = {"what_if": whatif.label, "gpu_busy_pct": round(truth.first.gpu_busy_pct, 1),
                 "true_change_pct": round(100 * truth.change, 2), "predicted_change_pct": None,
                 "median_step_error_pct": None, "passed": False, "error": ""}
    steps, error = simulate(first, whatif.scale_arg)
    if steps is None:
        row["error"] = error
        return row
    named = {s.get("name"): s for s in steps}
    missing = [t.name for t in truth.second.steps if t.name not in named]
    if missing:
        row["error"] = f"no step named {missing[0]} in simulate's output"
        return row
    judged = kw.verdict(truth, [named[t.name]["iteration_us"] for t in truth.second.steps])
    row.update(predicted_change_pct=round(100 * judged.predicted_change, 2),
               median_step_error_pct=round(100 * judged.median_step_error, 2), passed=judged.passed)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="the programs' jitter seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="whatif-") as tmp:
        rows = [judge(w, Path(tmp), args.seed) for w in kw.WHATIF_GRID]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'what-if':32} {'GPU busy':>8} {'true change':>11} {'predicted':>10} {'median step error':>17}  verdict")
    for r in rows:
        if r["error"]:
            print(f"{r['what_if']:32} {r['gpu_busy_pct']:7.1f}% {r['true_change_pct']:+10.2f}% {'-':>10} {'-':>17}"
                  f"  {r['error']}")
            continue
        print(f"{r['what_if']:32} {r['gpu_busy_pct']:7.1f}% {r['true_change_pct']:+10.2f}% "
              f"{r['predicted_change_pct']:+9.2f}% {r['median_step_error_pct']:16.2f}%  "
              f"{'pass' if r['passed'] else 'FAIL'}")
    print(f"{sum(r['passed'] for r in rows)} of {len(rows)} what-ifs pass (median step error <= 2%, "
          f"change within 15% of the true change)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
