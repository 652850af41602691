"""getCollInfo cost of Lagom's tuner plugin with 1,000-entry tables (target: median < 1 us).

NCCL calls getCollInfo for every collective it launches, so the lookup must be
cheap. This builds the plugin (``nccl_env.plugin_build``), compiles a C driver that
dlopens it and times getCollInfo (ABI v4, a 7x3 cost table refreshed per call) over
a cycle of queries, and prints the median ns per call for several tables side by
side, with the ratio to an empty table (the fixed cost of the call itself).

    python3 bench/plugin_lookup.py [--samples 2000] [--calls 200]
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nccl_env.knobs import Algorithm, CollectiveType, CommConfig, Protocol  # noqa: E402
from nccl_env.plugin_build import build_plugin, compile_c, find_compiler  # noqa: E402
from nccl_env.plugin_table import PluginEntry, format_table  # noqa: E402

COLLS = [CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE,
         CollectiveType.BROADCAST, CollectiveType.REDUCE]


def exact_table(n: int, rng: random.Random, colls: list[CollectiveType] = COLLS
                ) -> tuple[list[PluginEntry], list[tuple[int, int]]]:
    """What Lagom writes: one line per (collective, exact size), 8 ranks on 1 node."""
    entries, queries = [], []
    per_coll = max(1, n // len(colls))
    for coll in colls:
        sizes = rng.sample(range(1, 1 << 20), per_coll)
        for s in sizes:
            nbytes = s * 512
            entries.append(PluginEntry(coll, nbytes, nbytes, 1, 8, settings=CommConfig(
                Algorithm.RING, Protocol.SIMPLE, rng.choice([1, 2, 4, 8]), chunk_bytes=rng.choice([None, 700416]))))
            queries.append((coll.nccl_func, nbytes))
    return entries[:n], queries


def ranged_table(n: int, rng: random.Random) -> tuple[list[PluginEntry], list[tuple[int, int]]]:
    """Nested, overlapping byte ranges with mixed numPipeOps/regBuff and any-topology lines (a hand-written mess)."""
    entries = []
    for i in range(n):
        settings = CommConfig(Algorithm.TREE, Protocol.LL, 1 + i % 8)
        entries.append(PluginEntry(CollectiveType.ALLREDUCE, i * 4096, (2 * n - i) * 4096, rng.choice([None, 1]),
                                   rng.choice([None, 8]), pipe_ops=rng.choice([None, 1, 2, 7]),
                                   reg_buff=rng.choice([None, 0, 1]), settings=settings))
    queries = [(CollectiveType.ALLREDUCE.nccl_func, rng.randrange(0, 2 * n * 4096)) for _ in range(1000)]
    return entries, queries


def shapes_table(n: int, rng: random.Random) -> tuple[list[PluginEntry], list[tuple[int, int]]]:
    """Lagom's exact-size lines for four communicator shapes; the driver's communicator is one of them."""
    entries, queries = [], []
    shapes = [(1, 8), (2, 16), (1, 4), (4, 32)]
    for i in range(n):
        nodes, ranks = shapes[i % 4]
        coll = COLLS[i % 3]
        nbytes = rng.randrange(1, 1 << 20) * 512
        entries.append(PluginEntry(coll, nbytes, nbytes, nodes, ranks,
                                   settings=CommConfig(Algorithm.RING, Protocol.SIMPLE, 4)))
        if (nodes, ranks) == (1, 8):
            queries.append((coll.nccl_func, nbytes))
    return entries, queries


def run(driver: Path, plugin: Path, entries, queries, samples: int, calls: int, work: Path, name: str) -> dict:
    table = work / f"{name}.csv"
    table.write_text(format_table(entries))
    qfile = work / f"{name}.q"
    random.Random(3).shuffle(queries)
    # half hits, half misses (one byte off an exact size, or an unknown collective)
    mixed = [q for pair in zip(queries, [(c, b + 1) for c, b in queries]) for q in pair]
    qfile.write_text("\n".join(f"{c} {b}" for c, b in mixed) + "\n")
    out = subprocess.run([str(driver), str(plugin), str(table), str(qfile), str(samples), str(calls)],
                         capture_output=True, text=True, check=True).stdout
    return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", out)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=PATH.so",
                        help="another build of the plugin to time alongside this tree's")
    args = parser.parse_args()
    plugins = {"this tree": build_plugin()}
    for spec in args.compare:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"--compare wants NAME=PATH.so with an existing file, got {spec!r}")
        plugins[name] = Path(path)
    rng = random.Random(11)
    cases = [
        ("empty table", [], [(4, 1 << 20)]),
        ("10 entries, exact sizes", *exact_table(10, rng)),
        ("1,000 entries, exact sizes (Lagom's tables)", *exact_table(1000, rng)),
        ("1,000 entries, exact sizes, all allreduce", *exact_table(1000, rng, [CollectiveType.ALLREDUCE])),
        ("1,000 entries, nested ranges, mixed fields", *ranged_table(1000, rng)),
        ("1,000 entries, 4 shapes x 250 (other shapes filtered)", *shapes_table(1000, rng)),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        driver = work / "plugin_lookup_driver"
        compile_c(find_compiler(), [Path(__file__).with_name("plugin_lookup_driver.c")], driver,
                  ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ldl"])
        results = {label: [run(driver, so, e, list(q), args.samples, args.calls, work, f"t{i}")
                           for i, (_, e, q) in enumerate(cases)] for label, so in plugins.items()}
    print(f"getCollInfo per call (v4 ABI, {args.samples} samples x {args.calls} calls, half hits / half misses), "
          f"median ns (p90) per plugin build")
    print(f"{'table':54s} {'entries':>7s} " + " ".join(f"{label:>18s}" for label in plugins))
    for i, (name, _, _) in enumerate(cases):
        cells = " ".join(f"{r[i]['median_ns']:9.1f} ({r[i]['p90_ns']:6.1f})" for r in results.values())
        print(f"{name:54s} {int(results['this tree'][i]['entries']):7d} {cells}")
    worst = max(r["median_ns"] for r in results["this tree"])
    print(f"target: median < 1000 ns with 1,000 entries -> {'met' if worst < 1000 else 'NOT met'} "
          f"(this tree's slowest table {worst:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
