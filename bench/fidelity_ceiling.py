"""How many checking cases any setting of the contention mechanism's constants could make hold.

    python3 bench/fidelity_ceiling.py [CASES.json] [--samples N] [--seed S] [--no-coordinate-sweep] [--json]

CASES.json (default ``tests/data/fidelity/contention.json``) is a ``lagom.published-cases`` file
whose cases carry a ``split`` (``fit``/``check``). One *point* is one override set applied to
every preset (the mechanism, never one case): the SimParams constants below replace the
preset's value (a preset's ``sim:`` mapping included), and the two link figures are multiplied
by a factor on each preset's own value. The points: the defaults (no override), a coordinate
sweep (each constant over its levels, the others at their defaults) and a seeded random sample
of the full product of levels. At each point every case runs through the real runner
(``FidelityRunner(cluster_for=...)``, the same code ``bench/fidelity.py`` runs).

A point is *admissible* when the anchors hold there (:data:`ANCHOR_IDS` of CASES.json, every
case of :data:`ANCHOR_FILES`) and the fitting set holds at least as many cases as at the
defaults. The report: per judged checking case, how many admissible points (and points at
all) it holds at and the closest the model came (its worst figure at the best point, with the
direction of the miss); then the best admissible point's checking count and its constants,
and whether 80% of the judged checking set (issue 23's target) is reached anywhere.

``--json`` prints the same as one object. Exit status 0, 2 for a file not in the schema.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.cluster import ClusterSpec  # noqa: E402
from costmodel.sim.params import SimParams  # noqa: E402
from costmodel.sim.published_cases import Case, CaseResult, FidelityRunner, load_cases  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CASES = REPO / "tests" / "data" / "fidelity" / "contention.json"
# Cases that must keep holding at an admissible point: issue 23's anchors in the contention file
# (pytorch #172714, all three figures; arXiv 2507.03114's range) ...
ANCHOR_IDS = ("h100x8-gemm8192-fp16-ag64MiBshard-nccl-vs-zerocta-pr172714",
              "arxiv2507.03114-overlap-compute-slowdown-a100-h100-mi250-mi210")
# ... and every case of the fidelity files tests/test_fidelity.py asserts hold (PATH_VERDICTS, VERDICTS)
ANCHOR_FILES = (REPO / "tests" / "data" / "fidelity" / "paths.json",
                REPO / "tests" / "data" / "fidelity" / "published.json")
TARGET_SHARE = 0.8  # issue 23: at least 80% of the judged checking set holds
DEFAULT_SAMPLES = 600
DEFAULT_SEED = 23


@dataclass(frozen=True)
class Constant:
    """One swept constant: a SimParams field (``scale`` False: the level replaces the preset's
    value) or a link figure of ``intra_node`` (``scale`` True: the level multiplies it)."""

    name: str
    levels: tuple[float, ...]
    default: float  # today's value (SimParams default; 1.0 for a factor); the coordinate sweep's centre
    scale: bool = False


_P = SimParams()
# Levels around today's value; mem_efficiency's centre is the NVIDIA presets' 0.90 (SimParams' own is 0.85).
CONSTANTS = (
    Constant("fifo_resident_chunks", (0.25, 0.5, 0.75, 1.0), _P.fifo_resident_chunks),
    Constant("dram_bytes_per_payload_byte", (0.5, 1.0, 1.5, 2.0), _P.dram_bytes_per_payload_byte),
    Constant("fifo_dram_bytes_per_payload_byte", (1.0, 2.0, 3.0, 4.0), _P.fifo_dram_bytes_per_payload_byte),
    Constant("direct_dram_bytes_per_payload_byte", (1.0, 2.0, 3.0, 4.0), _P.direct_dram_bytes_per_payload_byte),
    Constant("mem_efficiency", (0.8, 0.85, 0.9, 0.95, 1.0), 0.9),
    Constant("launch_us", (2.5, 5.0, 10.0, 20.0, 40.0), _P.launch_us),
    Constant("intra_node.bw_gb_per_s", (0.8, 0.9, 1.0, 1.1, 1.2), 1.0, scale=True),
    Constant("intra_node.copy_engine_bw_gb_per_s", (0.8, 0.9, 1.0, 1.1, 1.2), 1.0, scale=True),
)


@dataclass(frozen=True)
class Point:
    """One override set; a constant it does not name keeps each preset's value."""

    values: tuple[tuple[str, float], ...] = ()
    origin: str = "default"  # default, coordinate or sample

    def to_json(self) -> dict:
        return dict(self.values)


def _by_name(name: str) -> Constant:
    return next(c for c in CONSTANTS if c.name == name)


def cluster_for(point: Point) -> Callable[[ClusterSpec], ClusterSpec]:
    """The preset rewritten by the point's overrides (FidelityRunner's seam)."""
    sim = {name: value for name, value in point.values if not _by_name(name).scale}
    factors = {name: value for name, value in point.values if _by_name(name).scale}
    link = factors.get("intra_node.bw_gb_per_s", 1.0)
    copy_engine = factors.get("intra_node.copy_engine_bw_gb_per_s", 1.0)

    def rewrite(cluster: ClusterSpec) -> ClusterSpec:
        intra = cluster.intra_node
        if link != 1.0 or copy_engine != 1.0:  # the copy engines' own figure, or the link's where it has none
            intra = replace(intra, bw_gb_per_s=intra.bw_gb_per_s * link,
                            copy_engine_bw_gb_per_s=intra.copy_engine_bw * copy_engine)
        return replace(cluster, sim={**cluster.sim, **sim}, intra_node=intra)

    return rewrite


def grid(samples: int, seed: int, coordinate: bool = True) -> list[Point]:
    """The defaults, the coordinate sweep, then ``samples`` distinct random points of the product."""
    points = [Point()]
    if coordinate:
        points += [Point(((c.name, level),), "coordinate") for c in CONSTANTS for level in c.levels
                   if level != c.default]
    total = math.prod(len(c.levels) for c in CONSTANTS)
    rng = random.Random(seed)
    seen: set[int] = set()
    while len(seen) < min(samples, total):
        index = rng.randrange(total)
        if index in seen:
            continue
        seen.add(index)
        values = []
        for c in CONSTANTS:
            index, level = divmod(index, len(c.levels))
            values.append((c.name, c.levels[level]))
        points.append(Point(tuple(values), "sample"))
    return points


# ---- one point ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Miss:
    """A case at one point: held figures, and its worst failing figure (none when it holds)."""

    holds: bool
    figures_held: int
    figures: int
    distance: float  # |error| of the worst failing figure; 0 when the case holds
    label: str = ""
    model: str = ""
    measured: str = ""
    error: float = 0.0  # signed: > 0 the model is above the measurement


def miss_of(result: CaseResult) -> Miss:
    judged = [r for r in result.rows if r.error is not None]
    failing = [r for r in judged if r.holds is False]
    held = sum(r.holds is True for r in judged)
    if not failing:
        return Miss(bool(result.holds), held, len(judged), 0.0)
    worst = max(failing, key=lambda r: abs(r.error or 0.0))
    label = worst.label.strip() if worst.label != result.id else ""
    return Miss(bool(result.holds), held, len(judged), abs(worst.error or 0.0), label, worst.model, worst.measured,
                worst.error or 0.0)


@dataclass
class PointResult:
    point: Point
    misses: dict[str, Miss]  # judged case id (every file) -> how it did
    anchors_hold: bool = False
    fit_held: int = 0
    check_held: int = 0
    admissible: bool = False


def run_point(point: Point, cases: list[Case], anchors: list[Case]) -> tuple[dict[str, Miss], dict[str, bool | None]]:
    """Every case at the point: (judged id -> Miss, id -> the runner's verdict) on one runner."""
    runner = FidelityRunner(cluster_for=cluster_for(point))
    misses: dict[str, Miss] = {}
    verdicts: dict[str, bool | None] = {}
    for case in [*cases, *anchors]:
        result = runner.run(case)
        verdicts[case.id] = result.holds
        if result.holds is not None:
            misses[case.id] = miss_of(result)
    return misses, verdicts


# ---- the sweep ----------------------------------------------------------------------------------


@dataclass
class Sweep:
    points: list[PointResult]
    fit_ids: list[str]
    check_ids: list[str]
    anchor_ids: list[str]
    default_verdicts: dict[str, bool | None]  # every case of CASES.json at the defaults
    not_judged: dict[str, str] = field(default_factory=dict)

    @property
    def admissible(self) -> list[PointResult]:
        return [p for p in self.points if p.admissible]

    @property
    def default(self) -> PointResult:
        return self.points[0]

    def best(self) -> PointResult | None:
        """The admissible point with the most checking cases held (then fitting cases, then checking
        figures held, then the fewest constants moved, then the checking set's summed distance)."""
        return max(self.admissible, default=None,
                   key=lambda p: (p.check_held, p.fit_held, sum(p.misses[c].figures_held for c in self.check_ids),
                                  -len(p.point.values), -sum(p.misses[c].distance for c in self.check_ids)))

    def blocked_by(self, case_id: str) -> dict[str, int]:
        """At the points where the case holds but which are not admissible: what failed, and how often
        (an anchor's id, or "fitting set" when it held fewer cases than at the defaults)."""
        counts: dict[str, int] = {}
        floor = self.default.fit_held
        for p in self.points:
            if p.admissible or not p.misses[case_id].holds:
                continue
            failed = [a for a in self.anchor_ids if not (a in p.misses and p.misses[a].holds)]
            failed += ["fitting set"] if p.fit_held < floor else []
            for what in failed:
                counts[what] = counts.get(what, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def sweep(cases_path: str | Path, points: list[Point], anchor_files: tuple[Path, ...] = ANCHOR_FILES) -> Sweep:
    cases = load_cases(cases_path)
    splits = {c.id: c.split for c in cases}
    if "check" not in splits.values():
        raise LagomError(f"{cases_path}: no case has split 'check' (write one with bench/fidelity.py --write-split)")
    missing = [a for a in ANCHOR_IDS if a not in splits]
    anchors = [c for path in anchor_files for c in load_cases(path)]
    anchor_ids = [a for a in ANCHOR_IDS if a in splits] + [c.id for c in anchors]
    results: list[PointResult] = []
    default_verdicts: dict[str, bool | None] = {}
    for point in points:
        misses, verdicts = run_point(point, cases, anchors)
        if not results:
            default_verdicts = {c.id: verdicts[c.id] for c in cases}
        results.append(PointResult(point, misses))
    judged = set(results[0].misses)
    fit_ids = [c.id for c in cases if c.split == "fit" and c.id in judged]
    check_ids = [c.id for c in cases if c.split == "check" and c.id in judged]
    fit_floor = sum(results[0].misses[c].holds for c in fit_ids)
    for r in results:
        r.anchors_hold = all(a in r.misses and r.misses[a].holds for a in anchor_ids)
        r.fit_held = sum(r.misses[c].holds for c in fit_ids)
        r.check_held = sum(r.misses[c].holds for c in check_ids)
        r.admissible = r.anchors_hold and r.fit_held >= fit_floor
    not_judged = {c.id: c.not_judged or "" for c in cases if c.id not in judged}
    if missing:
        not_judged.update({a: "anchor not in this file" for a in missing})
    return Sweep(results, fit_ids, check_ids, anchor_ids, default_verdicts, not_judged)


# ---- the report ---------------------------------------------------------------------------------


def _closest(points: list[PointResult], case_id: str) -> PointResult | None:
    return min(points, default=None, key=lambda p: (p.misses[case_id].distance, -p.misses[case_id].figures_held))


def _direction(miss: Miss) -> str:
    return "model high" if miss.error > 0 else "model low"


def _coordinate(s: Sweep, case_id: str) -> dict[str, dict[str, float]]:
    """Per constant of the coordinate sweep: the case's signed miss at each level (0: holds; the
    default point at the constant's centre), to show which constant moves it and which way."""
    out: dict[str, dict[str, float]] = {}
    at_default = s.default.misses[case_id]
    for c in CONSTANTS:
        levels = {f"{c.default:g}": round(math.copysign(at_default.distance, at_default.error), 4)}
        for p in s.points:
            if p.point.origin == "coordinate" and p.point.values[0][0] == c.name:
                m = p.misses[case_id]
                levels[f"{p.point.values[0][1]:g}"] = round(math.copysign(m.distance, m.error), 4)
        if len(levels) > 1:
            out[c.name] = dict(sorted(levels.items(), key=lambda kv: float(kv[0])))
    return out


def report(s: Sweep) -> dict:
    admissible = s.admissible
    cases = []
    for case_id in s.check_ids:
        near = _closest(admissible, case_id)
        near_any = _closest(s.points, case_id)
        entry: dict = {"id": case_id, "holds_default": s.default.misses[case_id].holds,
                       "holds_at": sum(p.misses[case_id].holds for p in admissible),
                       "holds_at_any": sum(p.misses[case_id].holds for p in s.points),
                       "blocked_by": s.blocked_by(case_id)}
        for key, where in (("closest", near), ("closest_any", near_any)):
            if where is not None:
                m = where.misses[case_id]
                entry[key] = {"holds": m.holds, "figures_held": m.figures_held, "figures": m.figures,
                              "distance": round(m.distance, 4), "figure": m.label, "model": m.model,
                              "measured": m.measured, "error": round(m.error, 4),
                              "direction": "" if m.holds else _direction(m), "point": where.point.to_json()}
        entry["coordinate"] = _coordinate(s, case_id)
        cases.append(entry)
    best = s.best()
    union = [c for c in s.check_ids if any(p.misses[c].holds for p in admissible)]
    unbound = max(s.points, key=lambda p: (p.check_held, p.fit_held))  # no anchor, no fitting floor
    need = math.ceil(TARGET_SHARE * len(s.check_ids))
    return {
        "constants": [{"name": c.name, "levels": list(c.levels), "default": c.default,
                       "applies": "factor on each preset's value" if c.scale else "replaces each preset's value"}
                      for c in CONSTANTS],
        "points": len(s.points), "admissible": len(admissible),
        "anchors": s.anchor_ids,
        "fit": {"judged": len(s.fit_ids), "held_default": s.default.fit_held},
        "check": {"judged": len(s.check_ids), "held_default": s.default.check_held, "target": need,
                  "best_point": None if best is None else {"held": best.check_held, "fit_held": best.fit_held,
                                                           "constants": best.point.to_json(),
                                                           "holding": [c for c in s.check_ids
                                                                       if best.misses[c].holds]},
                  "held_anywhere": union,
                  "best_point_unconstrained": {"held": unbound.check_held, "fit_held": unbound.fit_held,
                                               "anchors_hold": unbound.anchors_hold,
                                               "constants": unbound.point.to_json()},
                  "held_anywhere_unconstrained": [c for c in s.check_ids if any(p.misses[c].holds for p in s.points)],
                  "target_reached": best is not None and best.check_held >= need},
        "cases": cases,
        "never_hold": [c["id"] for c in cases if c["holds_at"] == 0],
        "not_judged": s.not_judged,
        "default_verdicts": s.default_verdicts,
        "grid": [{"origin": p.point.origin, "constants": p.point.to_json(), "admissible": p.admissible,
                  "anchors_hold": p.anchors_hold, "fit_held": p.fit_held, "check_held": p.check_held,
                  "check_holding": [c for c in s.check_ids if p.misses[c].holds]}
                 for p in s.points],
    }


def _fmt_point(values: dict) -> str:
    if not values:
        return "the defaults (no override)"
    return ", ".join(f"{k}{' x' if _by_name(k).scale else '='}{v:g}" for k, v in values.items())


def table(out: dict) -> str:
    lines = [f"{out['points']} points ({out['admissible']} admissible: the {len(out['anchors'])} anchors hold and "
             f"the fitting set holds >= {out['fit']['held_default']} of {out['fit']['judged']})", ""]
    header = ("default", "held at", "of all", "closest (admissible)", "model", "measured", "case")
    rows = [header]
    for c in out["cases"]:
        near = c.get("closest", {})
        if not near:
            where, model, measured = "no admissible point", "", ""
        elif near["holds"]:
            where, model, measured = f"holds ({near['figures_held']}/{near['figures']} figures)", "", ""
        else:
            figure = f" at {near['figure']}" if near["figure"] else ""
            where = (f"{near['figures_held']}/{near['figures']} figures; {near['direction']} "
                     f"{near['error']:+.0%}{figure}")
            model, measured = near["model"], near["measured"]
        rows.append(("yes" if c["holds_default"] else "NO", f"{c['holds_at']}/{out['admissible']}",
                     f"{c['holds_at_any']}/{out['points']}", where, model, measured, c["id"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows]
    check = out["check"]
    lines.append("")
    lines.append(f"checking set at the defaults: {check['held_default']} of {check['judged']} judged cases hold")
    best = check["best_point"]
    if best is None:
        lines.append("no admissible point")
    else:
        lines.append(f"best admissible point: {best['held']} of {check['judged']} "
                     f"({best['held'] / max(check['judged'], 1):.0%}), fitting set {best['fit_held']} of "
                     f"{out['fit']['judged']}: {_fmt_point(best['constants'])}")
    lines.append(f"held at some admissible point (not necessarily the same): {len(check['held_anywhere'])} of "
                 f"{check['judged']}")
    free = check["best_point_unconstrained"]
    lines.append(f"without the anchors and the fitting floor: best point {free['held']} of {check['judged']} "
                 f"(fitting set {free['fit_held']}); held at some point: "
                 f"{len(check['held_anywhere_unconstrained'])} of {check['judged']}")
    lines.append(f"issue 23's target ({check['target']} of {check['judged']}, 80%): "
                 f"{'reached' if check['target_reached'] else 'not reached by any point of the grid'}")
    if out["never_hold"]:
        lines.append(f"never holding at an admissible point: {len(out['never_hold'])} (closest above); the "
                     f"constant that moves each most in the coordinate sweep, its worst figure's miss per level:")
    for c in out["cases"]:
        if c["id"] in out["never_hold"] and c["coordinate"]:
            name, levels = max(c["coordinate"].items(), key=lambda kv: max(kv[1].values()) - min(kv[1].values()))
            spread = " ".join(f"{level}:{miss:+.0%}" for level, miss in levels.items())
            lines.append(f"  {c['id']}: {name} {spread}")
    for c in out["cases"]:
        if c["blocked_by"]:
            what = ", ".join(f"{k} ({v})" for k, v in list(c["blocked_by"].items())[:3])
            lines.append(f"  {c['id']} holds at {c['holds_at_any'] - c['holds_at']} inadmissible points; "
                         f"there failed: {what}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="?", default=str(DEFAULT_CASES), help="a published-cases file with splits")
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="random points of the product")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--no-coordinate-sweep", action="store_true", help="skip the one-constant-at-a-time points")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    try:
        if args.samples < 0:
            raise LagomError(f"--samples must be >= 0, got {args.samples}")
        out = report(sweep(args.cases, grid(args.samples, args.seed, not args.no_coordinate_sweep)))
    except LagomError as exc:
        print(f"fidelity_ceiling: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1) if args.json else table(out))
    return 0


__all__ = ["CONSTANTS", "Point", "cluster_for", "grid", "main", "report", "sweep"]

if __name__ == "__main__":
    sys.exit(main())
