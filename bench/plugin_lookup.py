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

from nccl_env.knobs import Algorithm, CollectiveType, Protocol  # noqa: E402
from nccl_env.plugin_build import build_plugin, compile_c, find_compiler  # noqa: E402
from nccl_env.plugin_table import PluginEntry, format_table  # noqa: E402

COLLS = [CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER, CollectiveType.ALLREDUCE,
         CollectiveType.BROADCAST, CollectiveType.REDUCE]


def exact_table(n: int, rng: random.Random) -> tuple[list[PluginEntry], list[tuple[int, int]]]:
    """What Lagom writes: one line per (collective, exact size), 8 ranks on 1 node."""
    entries, queries = [], []
    per_coll = max(1, n // len(COLLS))
    for coll in COLLS:
        sizes = rng.sample(range(1, 1 << 20), per_coll)
        for s in sizes:
            nbytes = s * 512
            entries.append(PluginEntry(coll, nbytes, nbytes, Algorithm.RING, Protocol.SIMPLE,
                                       rng.choice([1, 2, 4, 8]), 1, 8, chunk_bytes=rng.choice([None, 700416])))
            queries.append((coll.nccl_func, nbytes))
    return entries[:n], queries


def ranged_table(n: int, rng: random.Random) -> tuple[list[PluginEntry], list[tuple[int, int]]]:
    """Nested, overlapping byte ranges with mixed numPipeOps/regBuff and any-topology lines (a hand-written mess)."""
    entries = []
    for i in range(n):
        entries.append(PluginEntry(CollectiveType.ALLREDUCE, i * 4096, (2 * n - i) * 4096, Algorithm.TREE, Protocol.LL,
                                   1 + i % 8, rng.choice([None, 1]), rng.choice([None, 8]),
                                   pipe_ops=rng.choice([None, 1, 2, 7]), reg_buff=rng.choice([None, 0, 1])))
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
        entries.append(PluginEntry(coll, nbytes, nbytes, Algorithm.RING, Protocol.SIMPLE, 4, nodes, ranks))
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
    args = parser.parse_args()
    plugin = build_plugin()
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        driver = work / "plugin_lookup_driver"
        compile_c(find_compiler(), [Path(__file__).with_name("plugin_lookup_driver.c")], driver,
                  ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-ldl"])
        cases = [
            ("empty table", [], [(4, 1 << 20)]),
            ("10 entries, exact sizes", *exact_table(10, rng)),
            ("1,000 entries, exact sizes (Lagom's tables)", *exact_table(1000, rng)),
            ("1,000 entries, nested ranges, mixed fields", *ranged_table(1000, rng)),
            ("1,000 entries, 4 shapes x 250 (other shapes filtered)", *shapes_table(1000, rng)),
        ]
        results = [(name, run(driver, plugin, e, q, args.samples, args.calls, work, f"t{i}"))
                   for i, (name, e, q) in enumerate(cases)]
    base = results[0][1]["median_ns"]
    print(f"getCollInfo per call (v4 ABI, {args.samples} samples x {args.calls} calls, half hits / half misses)")
    print(f"{'table':48s} {'entries':>7s} {'median ns':>10s} {'p90 ns':>8s} {'x empty':>8s}")
    for name, r in results:
        print(f"{name:48s} {int(r['entries']):7d} {r['median_ns']:10.1f} {r['p90_ns']:8.1f} "
              f"{r['median_ns'] / base:8.2f}")
    lagom = max(results[2][1]["median_ns"], results[4][1]["median_ns"])
    scan = results[3][1]["median_ns"]
    print(f"target: median < 1000 ns with 1,000 entries -> {'met' if max(lagom, scan) < 1000 else 'NOT met'} "
          f"(Lagom's tables {lagom:.0f} ns, nested ranges {scan:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
