"""The simulator against measurements other people made, case by case.

    python3 bench/fidelity.py CASES.json [--json]

CASES.json is a ``lagom.published-cases`` file (``../shared/fidelity/published.json``;
schema in docs/simulator.md). Each case's quantity is asked of the simulator with noise
off (``costmodel.sim.published_cases``) and printed beside the measurement: one row per case, one per
point of a channel sweep. ``--json`` prints ``{"cases": [{"id", "kind", "holds", "model",
"measured", "detail"}]}``.

Exit status: 0 when every case holds, 1 when one does not, 2 for a file not in the schema
(one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.sim.published_cases import CaseResult, load_cases, run_cases  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402

_HEADER = ("holds", "model", "measured", "tolerance", "case")


def table(results: list[CaseResult]) -> str:
    """The rows of every case, columns aligned; the case label last (ids are long)."""
    lines = [_HEADER]
    for result in results:
        lines += [({True: "yes", False: "NO", None: ""}[r.holds], r.model, r.measured, r.tolerance,
                   f"{r.label} ({result.kind})" if i == 0 else r.label) for i, r in enumerate(result.rows)]
    widths = [max(len(line[c]) for line in lines) for c in range(len(_HEADER) - 1)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + "  " + line[-1] for line in lines]
    held = sum(r.holds for r in results)
    out.append(f"{held} of {len(results)} case{'s' if len(results) != 1 else ''} hold")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", help="a lagom.published-cases JSON file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        results = run_cases(load_cases(args.cases))
    except LagomError as exc:
        print(f"fidelity: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"cases": [r.to_json() for r in results]}, indent=1))
    else:
        print(table(results))
    return 0 if all(r.holds for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
