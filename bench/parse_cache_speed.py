"""Traces parsed once (traces/parse_cache.py): ``lagom simulate DIR`` run twice on the same folder, then
once more after one file was touched, side by side in one run (issue 33, item 2).

    python3 bench/parse_cache_speed.py [--ranks 16] [--source NAME] [--repeat N] [--json]

The folder holds ``--ranks`` copies of one shared trace (default the 20 MB
a100_w16_sendrecv_3streams_rank0) as the distinct ranks of one job (tests/kineto_builder.py
``write_rank_copies``), in a temporary folder with a cache folder of its own
(``LAGOM_CACHE_DIR``). Each run is ``python3 -m lagom simulate DIR --json`` in a fresh
process: wall seconds, and whether its output is the first run's byte for byte. The second
run reads every parse from the cache; the third re-reads the touched file only. ``--repeat N``
does it all N times, each on a fresh cache folder, and reports each run's fastest of the N (on
a shared machine the others' load only ever adds), with every time in ``runs``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from analyze_vs_hta import shared_traces_dir  # noqa: E402
from kineto_builder import write_rank_copies  # noqa: E402


def _simulate(folder: Path, cache: Path) -> tuple[float, str]:
    env = {**os.environ, "LAGOM_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO_ROOT)}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "lagom", "simulate", str(folder), "--json"], capture_output=True,
                          text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"lagom simulate failed: {done.stderr.strip().splitlines()[-1:]}")
    return wall, done.stdout


def _three(source: Path, ranks: int, tmp: Path) -> tuple[float, float, float, bool]:
    """First run, second run, run after one file was touched, on a fresh folder and cache; outputs the same."""
    folder, cache = tmp / "ranks", tmp / "cache"
    write_rank_copies(source, ranks, folder)
    first, out1 = _simulate(folder, cache)
    second, out2 = _simulate(folder, cache)
    touched = sorted(folder.iterdir())[0]
    os.utime(touched)
    third, out3 = _simulate(folder, cache)
    return first, second, third, out1 == out2 == out3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--source", default="a100_w16_sendrecv_3streams_rank0.json.gz")
    parser.add_argument("--repeat", type=int, default=1, help="do it N times, report each run's fastest")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = []
    for _ in range(max(1, args.repeat)):
        with tempfile.TemporaryDirectory(prefix="parse-cache-") as tmp:
            runs.append(_three(shared_traces_dir() / args.source, args.ranks, Path(tmp)))
    first, second, third = (min(r[i] for r in runs) for i in range(3))
    row = {"ranks": args.ranks, "first_s": round(first, 2), "second_s": round(second, 2),
           "after_touch_s": round(third, 2), "second_over_first": round(second / first, 3),
           "same_output": all(r[3] for r in runs), "load": round(os.getloadavg()[0], 1),
           "repeat": len(runs), "runs": [[round(t, 2) for t in r[:3]] for r in runs]}
    if args.json:
        print(json.dumps(row, indent=1))
    else:
        fastest = " (the fastest of each)" if len(runs) > 1 else ""
        print(f"{args.ranks} ranks: first {first:.1f} s, second {second:.1f} s (x{second / first:.2f} of the first), "
              f"after touching one file {third:.1f} s{fastest}; outputs the same: {row['same_output']}; "
              f"load average {row['load']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
