"""The docs' figures rendered from the runs that measured them (issue 33, item 3).

    python3 bench/figures.py                 # render every marked figure from bench/results/*.json
    python3 bench/figures.py --check         # exit 1 where a doc's figure differs from its run's JSON
    python3 bench/figures.py --run NAME ...  # run those sources (or ``all``), keep their JSON, render
    python3 bench/figures.py --list          # the sources: command, stored or not, when

A *source* is one bench command with a JSON output (:data:`SOURCES`); ``--run`` keeps what
it printed in ``bench/results/NAME.json`` (committed) with the command, the commit and the
date. A *figure* is a span of a doc between ``<!-- fig:ID -->`` and ``<!-- /fig -->`` (one
line, inside a table cell or a sentence; invisible once rendered); its text is
:data:`FIGURES`'s renderer of ID applied to the sources' JSON. ``<!-- fig:ID KEY -->`` names
one row or field of a source (:data:`KEYED`: a table row whose other cells are prose, one
cluster's geomean); a *table* is a whole markdown table between ``<!-- fig:ID -->`` and
``<!-- /fig -->`` on lines of their own, the table's last row and a blank line before the
end marker (:data:`TABLES`: header and rows, every cell from a run). Refreshing the docs after a
change is ``python3 bench/figures.py --run NAME ...``; the suite's
``tests/test_figures.py`` runs ``--check``, so a figure edited by hand, or a JSON refreshed
without rendering, fails CI. A figure not yet marked is prose: the marked ones are the
ones held to their runs.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
MARK = re.compile(r"<!-- fig:(?P<id>[a-z0-9_.]+)(?: (?P<key>[^<>]+?))? -->(?P<text>.*?)<!-- /fig -->")
# a whole table: the start marker alone on its line, the table's lines, a blank line, the end marker
BLOCK = re.compile(r"^<!-- fig:(?P<id>[a-z0-9_.]+) -->\n(?P<text>(?:\|.*\n)+)\n<!-- /fig -->$", re.MULTILINE)


@dataclass(frozen=True)
class Source:
    command: tuple[str, ...]  # run from the repository root; prints one JSON document on stdout
    what: str


SOURCES: dict[str, Source] = {
    "whatif_accuracy": Source(("python3", "bench/whatif_accuracy.py", "--json"),
                              "what-ifs on paired one-rank traces"),
    "joint_accuracy": Source(("python3", "bench/joint_accuracy.py", "--json"),
                             "rank-scoped what-ifs on paired N-rank traces"),
    "fidelity_published": Source(("python3", "bench/fidelity.py", "tests/data/fidelity/published.json", "--json"),
                                 "the simulator against the first published measurements"),
    "fidelity_contention": Source(("python3", "bench/fidelity.py", "tests/data/fidelity/contention.json", "--json"),
                                  "contention against published GPU measurements"),
    "replay_accuracy": Source(("python3", "bench/replay_accuracy.py", "--json"),
                              "the shared traces replayed under their own settings"),
    "bench_a40": Source(("python3", "-m", "lagom", "bench", "--json"),
                        "the tuner's matrix on the paper's A40 clusters (32 cells)"),
    "bench_nvlink": Source(("python3", "-m", "lagom", "bench", "--cluster", "h100-nvswitch", "--cluster",
                            "a100-nvswitch", "--json"), "the tuner's matrix on the NVLink presets (12 cells)"),
    "tuner_slope": Source(("python3", "bench/tuner_slope.py", "--evaluator", "analytic", "--json"),
                          "Lagom's evaluations against the signatures, 4-24 (15 s)"),
    "model_accuracy": Source(("python3", "bench/model_accuracy.py", "--json"),
                             "the analytic model against the simulator, calibrated (50 s)"),
    "optimum_ceiling_h100": Source(("python3", "bench/optimum_ceiling.py", "--cluster", "h100-nvswitch", "--workers",
                                    "2", "--json"), "the H100 NVLink cells' optimum by brute force (20 min)"),
    "parse_cache_speed": Source(("python3", "bench/parse_cache_speed.py", "--repeat", "3", "--json"),
                                "lagom simulate DIR on 16 ranks, then again from the trace cache (3 min)"),
}


@functools.cache  # one read of a source's JSON per process: many figures come from one file
def load(name: str) -> dict:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"figures: {path.relative_to(REPO)} is missing: python3 bench/figures.py --run {name}")
    return json.loads(path.read_text())


def output(name: str) -> object:
    return load(name)["output"]


# ---- the renderers: one per figure ID, from the sources' JSON to the doc's text -----------------
def _count(passed: int, total: int) -> str:
    return f"{passed} of {total}"


def _whatif_summary() -> str:
    rows = _rows("whatif_accuracy")
    passed = sum(1 for r in rows if r["passed"])
    scenarios = len({r["what_if"].split()[0] for r in rows})
    median = max(r["median_step_error_pct"] for r in rows)
    changes = [abs(r["predicted_change_pct"] - r["true_change_pct"]) / abs(r["true_change_pct"]) * 100
               for r in rows if abs(r["true_change_pct"]) >= 1.0]
    return (f"{_count(passed, len(rows))} in {scenarios} scenarios: median step error <= {median:.2f}%, "
            f"mean-step change within {max(changes):.1f}% of the true one")


def _joint_summary() -> str:
    rows = _rows("joint_accuracy")
    passed = sum(1 for r in rows if r["passed"])
    median = max(r["worst_median_step_error_pct"] for r in rows)
    return f"{_count(passed, len(rows))} pairs on every rank, median step error {median:.2f}%"


def _judged(name: str, split: str | None = None) -> tuple[int, int]:
    cases = output(name)["cases"]  # type: ignore[index]
    judged = [c for c in cases if c["not_judged"] is None and (split is None or c.get("split") == split)]
    return sum(1 for c in judged if c["holds"]), len(judged)


def _published_summary() -> str:
    return _count(*_judged("fidelity_published")) + " hold"


def _contention_split() -> str:
    fit, check = _judged("fidelity_contention", "fit"), _judged("fidelity_contention", "check")
    return f"fitting half {_count(*fit)} hold, checking half {_count(*check)}"


def _pr172714_pct() -> str:
    """The worst of pytorch #172714's three figures (sequential, overlap on each path) against the model."""
    cases = output("fidelity_contention")["cases"]  # type: ignore[index]
    (case,) = [c for c in cases if "pr172714" in c["id"]]
    model = {**case["model"]["overlap"], "sequential": case["model"]["sequential"]}
    measured = {**case["measured"]["overlap"], "sequential": case["measured"]["sequential"]}
    worst = max(abs(model[k] - measured[k]) / measured[k] for k in measured)
    return f"{worst * 100:.1f}%"


def _contention_not_judged() -> str:
    cases = output("fidelity_contention")["cases"]  # type: ignore[index]
    return str(sum(1 for c in cases if c["not_judged"] is not None))


def _pr172714_error() -> str:
    return f"pytorch #172714 within {_pr172714_pct()}"


def _rows(name: str) -> list[dict]:
    """A source whose output is a list of rows."""
    rows = output(name)
    assert isinstance(rows, list)
    return rows


def _replay_exact() -> str:
    """The worst of every trace's step, collective and exposed errors under its own settings."""
    rows = _rows("replay_accuracy")
    return f"{max(max(r['max_step_error_pct'], r['comm_error_pct'], r['exposed_error_pct']) for r in rows):.2f}%"


def _replay_summary() -> str:
    rows = _rows("replay_accuracy")
    alone = max(r["explained_median_step_error_pct"] for r in rows)
    return (f"every step, collective time and exposed communication of {len(rows)} traces within {_replay_exact()}; "
            f"from the graph's dependencies alone within {alone:.2f}%")


def _bench_clusters(name: str) -> dict:
    return output(name)["summary"]["clusters"]  # type: ignore[index]


def _behind(name: str) -> str:
    cells = output(name)["cells"]  # type: ignore[index]
    behind = sum(1 for c in cells if c["speedup_vs_nccl"] < 1.0)
    return "never behind NCCL" if not behind else f"behind NCCL in {behind} of {len(cells)} cells"


def _bench_a40() -> str:
    c = _bench_clusters("bench_a40")
    hi, lo = c["high-bw"], c["low-bw"]
    return (f"geomean over NCCL x{hi['geomean_speedup_vs_nccl']:.3f} high-bw / x{lo['geomean_speedup_vs_nccl']:.3f} "
            f"low-bw, over AutoCCL x{hi['geomean_speedup_vs_autoccl']:.3f} / x{lo['geomean_speedup_vs_autoccl']:.3f}; "
            + _behind("bench_a40"))


def _bench_nvlink() -> str:
    c = _bench_clusters("bench_nvlink")
    return (f"geomean over NCCL x{c['h100-nvswitch']['geomean_speedup_vs_nccl']:.3f} on H100 / "
            f"x{c['a100-nvswitch']['geomean_speedup_vs_nccl']:.3f} on A100")


def _parse_cache_speed() -> str:
    r = output("parse_cache_speed")
    assert isinstance(r, dict)
    return (f"{r['first_s']:.1f} s, then {r['second_s']:.1f} s (x{r['second_over_first']:.2f} of the first) from "
            f"the cache, then {r['after_touch_s']:.1f} s after one file was touched (the fastest of "
            f"{r.get('repeat', 1)} each); the outputs {'the same bytes' if r['same_output'] else 'DIFFERENT'}; "
            f"load average {r['load']}")


# ---- keyed figures: one row or field of a source, named in the marker ---------------------------
def _pct(x: float) -> str:
    return f"{x:+.1f}%"


def _one(rows: object, key: str, **fields: str) -> dict:
    """The one row of ``rows`` whose ``fields`` are these; a marker's key naming none is a KeyError."""
    assert isinstance(rows, list)
    found = [r for r in rows if all(r[k] == v for k, v in fields.items())]
    if len(found) != 1:
        raise KeyError(key)
    return found[0]


def _joint_row(what_if: str) -> str:
    """docs/replay.md's "Every rank at once" row: the true change (median over ranks), the predicted range, the
    worst median step error."""
    r = _one(output("joint_accuracy"), what_if, what_if=what_if)
    low, high = sorted((min(r["predicted_change_pct"]), max(r["predicted_change_pct"])), key=abs)
    predicted = _pct(low) if f"{low:.1f}" == f"{high:.1f}" else f"{low:+.1f} to {high:+.1f}%"
    return (f"{_pct(statistics.median(r['true_change_pct']))} | {predicted} | "
            f"{r['worst_median_step_error_pct']:.2f}%")


def _bench_field(key: str) -> str:
    """``SOURCE CLUSTER FIELD``: one figure of a bench summary's cluster, a ratio as x1.074, a gap in percent as
    0.14."""
    name, cluster, field = key.split()
    value = _bench_clusters(name)[cluster][field]
    return f"{value * 100:.2f}" if field.startswith("max_gap") else f"x{value:.3f}"


def _bench_worst(key: str) -> str:
    """``SOURCE FIELD``: the worst cell of a bench run by one ratio (every cell it ran), as x0.999."""
    name, field = key.split()
    return f"x{min(c[field] for c in output(name)['cells']):.3f}"  # type: ignore[index]


def _bench_row(key: str) -> str:
    """``SOURCE CLUSTER WORKLOAD``: an NVLink cell's bench columns in docs/tuner.md (NCCL us .. evals)."""
    name, cluster, workload = key.split()
    c = _one(output(name)["cells"], key, cluster=cluster, workload=workload)  # type: ignore[index]
    paths = "; ".join(f"{group}: {path}" for group, path in c["lagom_paths"].items()) or "-"
    return (f"{c['nccl_us']:,.0f} | {c['lagom_us']:,.0f} | {c['speedup_vs_nccl']:.3f} | "
            f"{c['speedup_vs_autoccl']:.3f} | {c['speedup_vs_optuna']:.3f} | {paths} | {c['lagom_evaluations']}")


def _replay_all_median(trace: str) -> str:
    """One trace's all-median step error (docs/replay.md's prose on the largest trace)."""
    return _share(_one(_rows("replay_accuracy"), trace, trace=f"{trace}.json.gz")["all_median_step_error_pct"])


def _ceiling_row(key: str) -> str:
    """``SOURCE WORKLOAD``: an NVLink cell's optimum columns in docs/tuner.md (knob-only us .. Lagom above optimum)."""
    name, workload = key.split()
    c = _one(output(name)["cells"], key, workload=workload)  # type: ignore[index]
    best, best_sm = c["optimum_us"], c["optimum_without_paths_us"]
    return (f"{c['lagom_knob_only_us']:,.0f} | {best_sm:,.0f} | {best:,.0f} | x{best_sm / best:.3f} | "
            f"+{(c['lagom_us'] / best - 1) * 100:.2f}%")


def _ceiling_field(key: str) -> str:
    """``SOURCE FIELD``: a ceiling run's geomean, as x1.048."""
    name, field = key.split()
    return f"x{output(name)[field]:.3f}"  # type: ignore[index]


def _calibrated(cluster: str) -> dict:
    return _one(output("model_accuracy"), cluster, cluster=cluster, model="calibrated")


def _model_mape(cluster: str) -> str:
    """The calibrated model's MAPE of iteration / compute / collective time on one cluster, in percent."""
    r = _calibrated(cluster)
    return " / ".join(f"{r[f'{part}_mape_pct']:.2f}" for part in ("iteration", "compute", "collective"))


KEYED: dict[str, Callable[[str], str]] = {
    "fidelity.contention_judged": lambda split: _count(*_judged("fidelity_contention", split)),
    "model_accuracy.mape": _model_mape,
    "model_accuracy.compute": lambda cluster: f"{_calibrated(cluster)['compute_mape_pct']:.2f}",
    "ceiling.row": _ceiling_row,
    "ceiling.field": _ceiling_field,
    "joint.row": _joint_row,
    "replay.all_median": _replay_all_median,
    "bench.field": _bench_field,
    "bench.row": _bench_row,
    "bench.worst": _bench_worst,
}


# ---- figures in the docs' prose ------------------------------------------------------------------
def _joint_change_points() -> str:
    rows = _rows("joint_accuracy")
    worst = max(abs(p - statistics.median(r["true_change_pct"])) for r in rows for p in r["predicted_change_pct"])
    return f"{worst:.1f} points"


def _replay_explained_range() -> str:
    alone = [r["explained_median_step_error_pct"] for r in _rows("replay_accuracy")]
    return f"{min(alone):.2f}-{max(alone):.2f}%"


def _a40_strategy_ranges() -> str:
    c = _bench_clusters("bench_a40")
    ranges = {s: (min(c[k]["speedup_vs_nccl_range_by_strategy"][s][0] for k in ("low-bw", "high-bw")),
                  max(c[k]["speedup_vs_nccl_range_by_strategy"][s][1] for k in ("low-bw", "high-bw")))
              for s in ("fsdp", "tp", "ep")}
    paper = {"fsdp": "1.10-1.33", "tp": "1.08-1.16", "ep": "1.07-1.08"}  # the Lagom paper's ranges (docs/tuner.md)
    return ", ".join(f"{s.upper()} {lo:.3f}-{hi:.3f} ({paper[s]})" for s, (lo, hi) in ranges.items())


def _slope() -> dict:
    return output("tuner_slope")  # type: ignore[return-value]


def _slope_space() -> str:
    sizes = [r["space_points"] for r in _slope()["rows"]]
    return " to ".join(f"{x:.0e}".replace("e+", "e") for x in (sizes[0], sizes[-1]))


# ---- whole tables: header and rows ---------------------------------------------------------------
def _table(header: list[str], rows: list[list[str]]) -> str:
    return "".join("| " + " | ".join(cells) + " |\n" for cells in [header, *rows]).replace(
        "\n", "\n" + "|---" * len(header) + "|\n", 1)


def _whatif_table() -> str:
    rows = _rows("whatif_accuracy")
    return _table(["what-if", "GPU busy", "true change", "predicted", "median step error"],
                  [[r["what_if"], f"{r['gpu_busy_pct']:.1f}%", f"{r['true_change_pct']:+.2f}%",
                    f"{r['predicted_change_pct']:+.2f}%", f"{r['median_step_error_pct']:.2f}%"] for r in rows])


def _share(pct: float) -> str:
    return f"{pct:.1f}%" if pct >= 10 else f"{pct:.2f}%"


def _replay_table() -> str:
    rows = _rows("replay_accuracy")

    def comm(r: dict, field: str) -> str:  # a trace with no collective has no collective error
        return f"{r[field]:.2f}%" if r["measured_comm_ms_per_step"] > 0 else "-"

    def idle(r: dict) -> str:
        ms, step = r["unexplained_idle_ms_per_step"], r["measured_step_ms"]
        return f"{ms:.1f} of {step:.0f}" if ms and step >= 10 else f"{ms:.1f} of {step:.1f}" if ms else "0.0"

    return _table(["trace", "complete steps", "median step error", "worst", "collectives", "exposed", "explained",
                   "unexplained idle (ms/step)", "all-median"],
                  [[r["trace"].removesuffix(".json.gz"), str(r["steps"]), f"{r['median_step_error_pct']:.2f}%",
                    f"{r['max_step_error_pct']:.2f}%", comm(r, "comm_error_pct"), comm(r, "exposed_error_pct"),
                    f"{r['explained_median_step_error_pct']:.2f}%", idle(r),
                    _share(r["all_median_step_error_pct"])] for r in rows])


def _a40_cells_table() -> str:
    cells = [c for c in output("bench_a40")["cells"] if c["cluster"] in ("low-bw", "high-bw")]  # type: ignore[index]
    return _table(["cluster", "workload", "sigs", "NCCL us", "Lagom us", "vs NCCL", "vs AutoCCL", "vs Optuna",
                   "vs exhaustive", "above bound", "headroom", "evals"],
                  [[c["cluster"], f"`{c['workload']}`", str(c["signatures"]), f"{c['nccl_us']:,.0f}",
                    f"{c['lagom_us']:,.0f}", f"{c['speedup_vs_nccl']:.3f}", f"{c['speedup_vs_autoccl']:.3f}",
                    f"{c['speedup_vs_optuna']:.3f}",
                    "-" if c["gap_to_exhaustive"] is None else f"+{c['gap_to_exhaustive'] * 100:.1f}%",
                    f"+{c['gap_to_lower_bound'] * 100:.1f}%", f"{c['headroom_vs_nccl']:.3f}",
                    str(c["lagom_evaluations"])] for c in cells])


def _a40_clusters_table() -> str:
    c = _bench_clusters("bench_a40")
    return _table(["cluster", "vs NCCL", "vs AutoCCL", "vs Optuna (equal budget)", "worst cell vs NCCL",
                   "max gap to exhaustive", "headroom"],
                  [[k, f"{c[k]['geomean_speedup_vs_nccl']:.3f}", f"{c[k]['geomean_speedup_vs_autoccl']:.3f}",
                    f"{c[k]['geomean_speedup_vs_optuna']:.3f}", f"{c[k]['min_speedup_vs_nccl']:.3f}",
                    f"+{c[k]['max_gap_to_exhaustive'] * 100:.1f}%", f"{c[k]['geomean_headroom_vs_nccl']:.3f}"]
                   for k in ("low-bw", "high-bw")])


def _model_accuracy_table() -> str:
    rows = _rows("model_accuracy")
    label = {"defaults": "hardware defaults", "start": "perturbed start", "calibrated": "calibrated"}

    def ranking(r: dict) -> str:  # the defaults' rows as the doc always gave them: the count alone
        within, gap = f"{r['windows_within_2pct']}/{r['windows']}", r["ranking_gap_max_pct"]
        return within if r["model"] == "defaults" else f"{within} (max gap {gap:.{1 if gap >= 1 else 2}f}%)"

    return _table(["cluster", "model", "iteration MAPE", "compute MAPE", "collective MAPE", "ranking within 2%"],
                  [[r["cluster"], label[r["model"]], f"{r['iteration_mape_pct']:.2f}%", f"{r['compute_mape_pct']:.2f}%",
                    f"{r['collective_mape_pct']:.2f}%", ranking(r)] for r in rows])


TABLES: dict[str, Callable[[], str]] = {
    "model_accuracy.table": _model_accuracy_table,
    "whatif.table": _whatif_table,
    "replay.table": _replay_table,
    "bench.a40.cells": _a40_cells_table,
    "bench.a40.clusters": _a40_clusters_table,
}


FIGURES: dict[str, Callable[[], str]] = {
    "replay.summary": _replay_summary,
    "bench.a40": _bench_a40,
    "bench.nvlink": _bench_nvlink,
    "whatif.summary": _whatif_summary,
    "joint.summary": _joint_summary,
    "fidelity.published": _published_summary,
    "fidelity.contention_split": _contention_split,
    "fidelity.pr172714": _pr172714_error,
    "joint.change_points": _joint_change_points,
    "replay.explained_range": _replay_explained_range,
    "replay.exact": _replay_exact,
    "bench.a40.strategies": _a40_strategy_ranges,
    "fidelity.published_cases": lambda: _count(*_judged("fidelity_published")),
    "fidelity.pr172714_pct": _pr172714_pct,
    "fidelity.contention_not_judged": _contention_not_judged,
    "tuner_slope.evaluations": lambda: ", ".join(str(r["lagom_evaluations"]) for r in _slope()["rows"]),
    "tuner_slope.slope": lambda: f"{_slope()['fits']['lagom']['slope']:.1f}",
    "tuner_slope.quadratic": lambda: f"{_slope()['fits']['lagom']['quadratic']:+.3f}",
    "tuner_slope.space": _slope_space,
    "tuner_slope.autoccl": lambda: f"~{statistics.mean(r['autoccl_evaluations'] for r in _slope()['rows']):.0f}",
    "parse_cache.speed": _parse_cache_speed,
}


# ---- the commands -----------------------------------------------------------------------------
def run_source(name: str) -> None:
    source = SOURCES[name]
    print(f"figures: running {name}: {' '.join(source.command)}", file=sys.stderr, flush=True)
    done = subprocess.run(list(source.command), cwd=REPO, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # fidelity.py exits 1 when a case misses: still a result
        raise SystemExit(f"figures: {name} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    try:
        printed = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"figures: {name} printed no JSON document") from None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    RESULTS.mkdir(exist_ok=True)
    record = {"source": name, "command": list(source.command), "commit": commit,
              "date": datetime.date.today().isoformat(), "output": printed}
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")


def render(text: str, where: str) -> tuple[str, list[str]]:
    """``text`` with every marked figure and table rendered; the differences, one line each."""
    differences: list[str] = []

    def now(fig: str, key: str | None, known: dict) -> str:
        if fig not in known:
            raise SystemExit(f"figures: {where}: unknown figure {fig!r} (known: {', '.join(known)})")
        try:
            return known[fig](key) if key is not None else known[fig]()
        except (KeyError, ValueError):
            raise SystemExit(f"figures: {where}: {fig}: no row {key!r} in its source") from None

    def one(match: re.Match) -> str:
        fig, key = match.group("id"), match.group("key")
        text = now(fig, key, KEYED if key is not None else FIGURES)
        if text != match.group("text"):
            differences.append(f"{where}: {fig}{' ' + key if key else ''}: the doc says {match.group('text')!r}, "
                               f"its run gives {text!r}")
        return f"<!-- fig:{fig}{' ' + key if key else ''} -->{text}<!-- /fig -->"

    def table(match: re.Match) -> str:
        fig = match.group("id")
        text = now(fig, None, TABLES)
        if text != match.group("text"):
            was, new = match.group("text").splitlines(), text.splitlines()
            changed = [f"{a!r} -> {b!r}" for a, b in zip(was, new) if a != b] or [f"{len(was)} -> {len(new)} lines"]
            differences.append(f"{where}: {fig}: the doc's table differs from its run: {'; '.join(changed[:3])}")
        return f"<!-- fig:{fig} -->\n{text}\n<!-- /fig -->"

    return MARK.sub(one, BLOCK.sub(table, text)), differences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 where a doc's figure differs from its JSON")
    parser.add_argument("--run", nargs="+", metavar="NAME", help="run these sources (or 'all') first")
    parser.add_argument("--list", action="store_true", help="list the sources")
    parser.add_argument("--docs", nargs="+", type=Path, help="the docs to render or check (default: README, docs/)")
    args = parser.parse_args(argv)
    if args.list:
        for name, source in SOURCES.items():
            record = load(name) if (RESULTS / f"{name}.json").is_file() else None
            stamp = f"{record['date']} at {record['commit']}" if record else "not run"
            print(f"{name:22} {' '.join(source.command):70} {stamp}")
        return 0
    if args.run:
        names = list(SOURCES) if args.run == ["all"] else args.run
        for name in names:
            if name not in SOURCES:
                raise SystemExit(f"figures: unknown source {name!r} (known: {', '.join(SOURCES)})")
            run_source(name)
    every: list[str] = []
    marked = 0
    for doc in args.docs or DOCS:
        text = doc.read_text()
        marked += len(MARK.findall(text)) + len(BLOCK.findall(text))
        rendered, differences = render(text, str(doc.relative_to(REPO) if doc.is_relative_to(REPO) else doc))
        every += differences
        if not args.check and rendered != text:
            doc.write_text(rendered)
    if args.check:
        for line in every:
            print(line)
        print(f"figures: {marked} marked figures, {len(every)} differ from their runs")
        return 1 if every else 0
    print(f"figures: {marked} marked figures rendered, {len(every)} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
