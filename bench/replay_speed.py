"""The replay's speed against an earlier commit's, side by side in one run (issue 25, part 7).

    python3 bench/replay_speed.py [TRACE] [--old-commit a24a977 | --old-tree DIR] [--copies 1,4] [--rounds 2]
                                  [--no-tune]

The earlier commit is exported (``git archive``) into a temporary folder (or ``--old-tree``
names a folder holding it already) and every measurement
runs in a fresh process with ``PYTHONPATH`` at one tree or the other, alternating old and new
for ``--rounds`` rounds; the figure per tree is the median over rounds. For each size of the
trace (its events repeated ``--copies`` times, as ``bench/trace_scaling.py`` does; 1 is the
trace itself):

* ``evaluate``: one evaluation under a new plan once the replay's data are built (analytic
  mechanism, CPU ms: the median of 21 plans, channels 2-16 three times over);
* ``tune``: ``lagom tune TRACE --json`` as a user runs it (the AutoCCL comparison included):
  wall seconds, CPU seconds and peak resident memory of the command's process (its
  ``ru_maxrss``). A first, untimed run per tree fills the caches a user's second run finds
  (the analytic model's calibration, numba's compiled kernels); ``tune, cold kernels`` is the
  new tree with numba's cache empty (a first run after an install or a change to the kernels).

Times on a shared machine move by +-30%: the ratio of the medians is the figure to read.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from trace_scaling import DEFAULT_TRACE, repeated  # noqa: E402

_EVALUATE = r'''
import json, sys, time
from traces.kineto import read_trace  # the one name both the old tree and this one have
from costmodel.analytic.evaluator import AnalyticEvaluator
from costmodel.cluster import load_cluster
from nccl_env.knobs import CommConfig
from nccl_env.plan import Plan
w = read_trace(sys.argv[1])[0]
mechanism = AnalyticEvaluator(load_cluster("a100-nvswitch"))
try:  # the replay as a layer; before it, the evaluators replayed a trace themselves
    from costmodel.replay.trace_evaluator import ReplayEvaluator
    ev = ReplayEvaluator(mechanism, 8)
except ImportError:
    ev = mechanism
ev.evaluate(w, Plan())
times = []
for _ in range(3):
    for channels in (2, 3, 4, 6, 8, 12, 16):
        t = time.process_time()
        ev.evaluate(w, Plan(default=CommConfig(channels=channels)))
        times.append(time.process_time() - t)
print(json.dumps({"ms": sorted(times)[len(times) // 2] * 1e3}))
'''

_TUNE = r'''
import json, resource, subprocess, sys, time
t = time.perf_counter()
done = subprocess.run([sys.executable, "-m", "lagom", "tune", sys.argv[1], "-o", sys.argv[2], "--force", "--json"],
                      capture_output=True, text=True)
wall = time.perf_counter() - t
if done.returncode:
    sys.exit(done.stderr)
child = resource.getrusage(resource.RUSAGE_CHILDREN)
out = json.loads(done.stdout)
print(json.dumps({"wall_s": wall, "cpu_s": child.ru_utime + child.ru_stime, "peak_mib": child.ru_maxrss / 1024,
                  "tuned_us": out["tuned_us"], "autoccl_us": out["autoccl_us"], "evaluations": out["evaluations"]}))
'''


def run(code: str, tree: Path, args: list[str], env_extra: dict[str, str] | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), **(env_extra or {})}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=str(tree),
                          env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    args = sys.argv[1:]
    positional = [a for a in args if not a.startswith("--") and not a[0].isdigit()
                  and (args.index(a) == 0
                       or args[args.index(a) - 1] not in ("--old-commit", "--old-tree", "--copies", "--rounds"))]
    source = Path(positional[0]) if positional else ROOT.parent.parent / "shared" / "traces" / DEFAULT_TRACE
    if not source.is_file():
        source = Path("/work/shared/traces") / DEFAULT_TRACE
    if not source.is_file():
        print(f"{source}: no such trace (give one: python3 bench/replay_speed.py TRACE)", file=sys.stderr)
        return 2
    commit = args[args.index("--old-commit") + 1] if "--old-commit" in args else "a24a977"
    copies = [int(x) for x in args[args.index("--copies") + 1].split(",")] if "--copies" in args else [1]
    rounds = int(args[args.index("--rounds") + 1]) if "--rounds" in args else 2
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        old = tmp / "old"
        if "--old-tree" in args:
            old = Path(args[args.index("--old-tree") + 1])
            commit = str(old)
        else:
            old.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        trees = {"old": old, "new": ROOT}
        print(f"{source.name}; old = {commit}, new = {ROOT}; medians of {rounds} rounds, old and new alternating")
        for n in copies:
            path = source if n == 1 else tmp / f"x{n}.json.gz"
            if n != 1:
                repeated(source, n, path)
            raw = gzip.decompress(path.read_bytes())
            print(f"x{n}: {len(orjson.loads(raw)['traceEvents']):,} events, {len(raw) / 1e6:.0f} MB of JSON")
            del raw
            results: dict[str, dict[str, list[dict]]] = {name: {} for name in trees}
            if "--no-tune" not in args:
                for name, tree in trees.items():  # untimed: calibration and compiled kernels cached
                    run(_TUNE, tree, [str(path), str(tmp / f"{name}.yaml")])
            for _ in range(rounds):
                for name, tree in trees.items():
                    results[name].setdefault("evaluate", []).append(run(_EVALUATE, tree, [str(path)]))
                    if "--no-tune" not in args:
                        results[name].setdefault("tune", []).append(run(_TUNE, tree, [str(path), str(tmp / "t.yaml")]))
            if "--no-tune" not in args:
                cold = run(_TUNE, ROOT, [str(path), str(tmp / "t.yaml")], {"NUMBA_CACHE_DIR": str(tmp / f"numba{n}")})

            def med(name: str, stage: str, key: str, results: dict[str, dict[str, list[dict]]] = results) -> float:
                return statistics.median(r[key] for r in results[name][stage])

            o, w = med("old", "evaluate", "ms"), med("new", "evaluate", "ms")
            print(f"  one evaluation: old {o:.2f} ms, new {w:.2f} ms CPU: x{o / w:.1f}")
            if "--no-tune" not in args:
                for name in trees:
                    r = results[name]["tune"][-1]
                    print(f"  tune, {name}: {med(name, 'tune', 'wall_s'):.2f} s wall, "
                          f"{med(name, 'tune', 'cpu_s'):.2f} s CPU, peak {med(name, 'tune', 'peak_mib'):.0f} MiB; "
                          f"tuned {r['tuned_us']:.3f} us, AutoCCL {r['autoccl_us']:.3f} us, "
                          f"{r['evaluations']} evaluations")
                print(f"  tune, cold kernels (new): {cold['wall_s']:.2f} s wall, {cold['cpu_s']:.2f} s CPU, "
                      f"peak {cold['peak_mib']:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
