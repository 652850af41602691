"""The simulator against measurements other people made, case by case.

    python3 bench/fidelity.py CASES.json [--json]
    python3 bench/fidelity.py SHARED.json --write-split OUT.json   # the project's copy, with its split

CASES.json is a ``lagom.published-cases`` file (``../shared/fidelity/published.json``,
``contention.json``; schema in docs/simulator.md). Each case's quantity is asked of the
simulator with noise off (``costmodel.sim.published_cases``) and printed beside the
measurement: one row per figure (a point of a sweep or of a rate curve, a policy of an
overlap). A case the simulator cannot be asked (a cluster no preset models, a field its
source does not state) is printed as *not judged*, with the reason. When the cases carry a
``split`` (``fit``/``check``), each set's result is printed apart, with the fitting set's
worst miss. ``--json`` prints ``{"cases": [{"id", "kind", "holds", "model", "measured",
"detail", "split", "not_judged", "cluster"}]}``. Every case's first row names the cluster it was
judged on (a preset with the case's nodes and NCCL, or one built from what the case states).

``--write-split OUT`` copies CASES.json to OUT with a ``split`` field per case, decided from
the cases alone by ``published_cases.assign_splits`` (kind, GPU, strong before weak, id).

Exit status: 0 when every judged case holds, 1 when one does not, 2 for a file not in the
schema (one line on stderr naming the problem).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.sim.published_cases import CaseResult, assign_splits, load_cases, run_cases  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402
from nccl_env.files import read_text  # noqa: E402

_HEADER = ("holds", "model", "measured", "tolerance", "case")
_VERDICT = {True: "yes", False: "NO", None: ""}


def table(results: list[CaseResult]) -> str:
    """The rows of every case, columns aligned; the case label last (ids are long)."""
    lines = [_HEADER]
    for result in results:
        tag = f" [{result.split}]" if result.split else ""
        where = f" on {result.cluster}" if result.cluster else ""
        lines += [(_VERDICT[r.holds] if result.not_judged is None else "-", r.model, r.measured, r.tolerance,
                   f"{r.label} ({result.kind}){tag}{where}" if i == 0 else r.label) for i, r in enumerate(result.rows)]
    widths = [max(len(line[c]) for line in lines) for c in range(len(_HEADER) - 1)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(line[:-1], widths)) + "  " + line[-1] for line in lines]
    out += summary(results)
    return "\n".join(out)


def _figures(result: CaseResult) -> list:
    """The judged figures of a case: its points or quantities, or the case's own row when it is one figure."""
    inner = [r for r in result.rows[1:] if r.holds is not None]
    return inner or [r for r in result.rows[:1] if r.holds is not None]


def _held(results: list[CaseResult]) -> str:
    judged = [r for r in results if r.holds is not None]
    held = sum(r.holds is True for r in judged)
    share = f" ({held / len(judged):.0%})" if judged else ""
    not_judged = len(results) - len(judged)
    figures = [f for r in judged for f in _figures(r)]
    figures_held = sum(f.holds is True for f in figures)
    return (f"{held} of {len(judged)} judged case{'s' if len(judged) != 1 else ''} hold{share}"
            + (f", {figures_held} of {len(figures)} figures" if len(figures) > len(judged) else "")
            + (f"; {not_judged} not judged" if not_judged else ""))


def nccl_estimate_line(results: list[CaseResult]) -> list[str]:
    """The judged busbw_curve cases again, with NCCL's own estimate for its pick as the model (the
    ceiling a re-statement of NCCL's tuning model could reach on them), or nothing without such cases."""
    curves = [r for r in results if r.kind == "busbw_curve" and r.holds is not None]
    if not curves:
        return []
    held = sum(bool(r.detail.get("nccl_estimate_holds")) for r in curves)
    points = sum(len(r.model) for r in curves)
    points_held = sum(int(r.detail.get("nccl_estimate_points_held", 0)) for r in curves)
    sim_held = sum(r.holds is True for r in curves)
    sim_points = sum(bool(pt.get("holds")) for r in curves for pt in r.model)
    return [f"NCCL's own estimate as the model: {held} of {len(curves)} busbw curves hold, "
            f"{points_held} of {points} points (the simulator: {sim_held} of {len(curves)}, "
            f"{sim_points} of {points})"]


def summary(results: list[CaseResult]) -> list[str]:
    """One line for the file; with a split, one per set and the fitting set's worst miss; a line
    for NCCL's own estimate where the file has busbw curves."""
    if not any(r.split for r in results):
        return [_held(results), *nccl_estimate_line(results)]
    lines = []
    for split, name in (("fit", "fitting set"), ("check", "checking set")):
        part = [r for r in results if r.split == split]
        lines.append(f"{name}: {_held(part)}")
        if split == "fit":
            worst = max(((r, r.worst_row) for r in part if r.worst_row is not None and r.holds is not None),
                        key=lambda pair: abs(pair[1].error or 0.0), default=None)
            if worst is not None:
                case, row = worst
                where = f"{case.id} /{row.label}" if row.label != case.id else case.id
                lines.append(f"  worst miss of the fitting set: {where}: model {row.model} against {row.measured} "
                             f"({(row.error or 0.0):+.0%})")
    unsplit = [r for r in results if r.split is None]
    if unsplit:
        lines.append(f"no split: {_held(unsplit)}")
    return lines + nccl_estimate_line(results)


def write_split(source: str, out: str) -> None:
    data = json.loads(read_text(Path(source)))
    cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise LagomError(f"{source}: not a lagom.published-cases file (no list of cases)")
    splits = assign_splits(cases)
    data["cases"] = [{**c, "split": splits[str(c.get("id"))]} for c in cases]
    Path(out).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", help="a lagom.published-cases JSON file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--write-split", metavar="OUT", help="copy the file to OUT with a split field per case")
    args = parser.parse_args(argv)
    try:
        if args.write_split:
            write_split(args.cases, args.write_split)
            return 0
        results = run_cases(load_cases(args.cases))
    except LagomError as exc:
        print(f"fidelity: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"cases": [r.to_json() for r in results]}, indent=1))
    else:
        print(table(results))
    return 0 if all(r.holds is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
