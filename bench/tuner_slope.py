"""Lagom's evaluations against the number of signatures, on workloads of growing size.

Workload k chains k small FSDP jobs of different widths (4 signatures each: AllGather
and ReduceScatter of a layer and of the embedding), so the signatures grow 4, 8, ...
Tuned for NCCL 2.30.3, where every knob but threads is per collective (one unit per
signature), with ``--evaluator`` (sim, noise 0, by default). Prints evaluations per
workload, the least-squares slope (evaluations per signature), and the same for
AutoCCL and exhaustive's space size, side by side.

    python3 bench/tuner_slope.py [--max-k 6] [--evaluator sim|analytic] [--cluster low-bw] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import load_cluster  # noqa: E402
from lagom.args.knob_args import parse_nccl_version_arg  # noqa: E402
from lagom.orchestration import tuning  # noqa: E402
from nccl_env.rules import NcclVersion  # noqa: E402
from traces.generate import generate_workload  # noqa: E402
from traces.workload import Dependency, Op, Workload  # noqa: E402
from tuner import AutoCCL, LagomSearch  # noqa: E402


def concat_workloads(parts: list[Workload]) -> Workload:
    """One iteration running ``parts`` one after another (op ids shifted, each part after the last)."""
    out = replace(parts[0], compute_ops=[], collectives=[], dependencies=[], groups={}, source="concat")
    offset = 0
    prev_last: list[int] = []
    t0 = 0.0
    for part in parts:
        ops: list[Op] = [*part.compute_ops, *part.collectives]
        shift = {o.op_id: o.op_id + offset for o in ops}
        span_start = min(o.start_us for o in ops)
        first_ids = [o.op_id + offset for o in ops if o.start_us == span_start]
        for o in part.compute_ops:
            out.compute_ops.append(replace(o, op_id=shift[o.op_id], start_us=o.start_us - span_start + t0))
        for c in part.collectives:
            out.collectives.append(replace(c, op_id=shift[c.op_id], start_us=c.start_us - span_start + t0))
        out.dependencies += [replace(d, before=shift[d.before], after=shift[d.after]) for d in part.dependencies]
        out.dependencies += [Dependency(b, a) for b in prev_last for a in first_ids]
        out.groups.update(part.groups)
        last_end = max(o.end_us for o in ops)
        prev_last = [o.op_id + offset for o in ops if o.end_us == last_end]
        t0 += last_end - span_start
        offset = max(shift.values()) + 1
    out.compute_ops.sort(key=lambda o: o.start_us)
    out.collectives.sort(key=lambda o: o.start_us)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-k", type=int, default=6)
    parser.add_argument("--evaluator", choices=tuning.EVALUATORS, default="sim")
    parser.add_argument("--cluster", default="low-bw")
    parser.add_argument("--nccl-version", type=parse_nccl_version_arg, default=NcclVersion(2, 30, 3))
    parser.add_argument("--json", action="store_true", help="print the rows and fits as JSON (no times)")
    args = parser.parse_args()
    say = (lambda *a: None) if args.json else print
    cluster = tuning.with_nccl_version(load_cluster(args.cluster), args.nccl_version)
    widths = [1024 + 256 * i for i in range(args.max_k)]
    parts = [generate_workload(f"fsdp:hidden={h},layers=4,ffn={4 * h},heads=16,vocab=32000:gpus=8") for h in widths]
    rows = []
    table = []
    say(f"{'k':>2} {'signatures':>10} {'units':>5} {'lagom evals':>11} {'autoccl evals':>13} {'space points':>14} "
          f"{'lagom s':>8}")
    for k in range(1, args.max_k + 1):
        workload = concat_workloads(parts[:k])
        space = tuning.space_for(workload, cluster)
        started = time.perf_counter()
        lagom = LagomSearch().tune(workload, tuning.make_evaluator(args.evaluator, cluster), space)
        seconds = time.perf_counter() - started
        autoccl = AutoCCL().tune(workload, tuning.make_evaluator(args.evaluator, cluster), space)
        rows.append((len(space.signatures), lagom.evaluations, autoccl.evaluations))
        table.append({"k": k, "signatures": len(space.signatures), "units": len(space.resource_units),
                      "lagom_evaluations": lagom.evaluations, "autoccl_evaluations": autoccl.evaluations,
                      "space_points": float(space.size())})
        say(f"{k:>2} {len(space.signatures):>10} {len(space.resource_units):>5} {lagom.evaluations:>11} "
              f"{autoccl.evaluations:>13} {space.size():>14.3g} {seconds:>8.1f}")
    xs = [r[0] for r in rows]
    fits = {}
    for name, col in (("lagom", 1), ("autoccl", 2)):
        ys = [r[col] for r in rows]
        slope, intercept = np.polyfit(xs, ys, 1)
        quad = np.polyfit(xs, ys, 2)[0] if len(xs) > 2 else 0.0
        fits[name] = {"slope": round(float(slope), 4), "intercept": round(float(intercept), 4),
                      "quadratic": round(float(quad), 5)}
        say(f"{name}: evaluations ~ {slope:.2f} x signatures + {intercept:.1f} (quadratic term {quad:+.3f})")
    if args.json:
        print(json.dumps({"evaluator": args.evaluator, "cluster": args.cluster, "nccl_version": str(args.nccl_version),
                          "rows": table, "fits": fits}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
