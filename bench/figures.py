"""The docs' figures rendered from the runs that measured them (issue 33, item 3).

    python3 bench/figures.py                 # render every marked figure from bench/results/*.json
    python3 bench/figures.py --check         # exit 1 where a doc's figure differs from its run's JSON
    python3 bench/figures.py --run NAME ...  # run those sources (or ``all``), keep their JSON, render
    python3 bench/figures.py --list          # the sources: command, stored or not, when

A *source* is one bench command with a JSON output (:data:`SOURCES`); ``--run`` keeps what
it printed in ``bench/results/NAME.json`` (committed) with the command, the commit and the
date. A *figure* is a span of a doc between ``<!-- fig:ID -->`` and ``<!-- /fig -->`` (one
line, inside a table cell or a sentence; invisible once rendered); its text is
:data:`FIGURES`'s renderer of ID applied to the sources' JSON. Refreshing the docs after a
change is ``python3 bench/figures.py --run NAME ...``; the suite's
``tests/test_figures.py`` runs ``--check``, so a figure edited by hand, or a JSON refreshed
without rendering, fails CI. A figure not yet marked is prose: the marked ones are the
ones held to their runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
MARK = re.compile(r"<!-- fig:(?P<id>[a-z0-9_.]+) -->(?P<text>.*?)<!-- /fig -->")


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
    "parse_cache_speed": Source(("python3", "bench/parse_cache_speed.py", "--json"),
                                "lagom simulate DIR on 16 ranks, then again from the trace cache"),
}


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
    rows = output("whatif_accuracy")
    assert isinstance(rows, list)
    passed = sum(1 for r in rows if r["passed"])
    scenarios = len({r["what_if"].split()[0] for r in rows})
    median = max(r["median_step_error_pct"] for r in rows)
    changes = [abs(r["predicted_change_pct"] - r["true_change_pct"]) / abs(r["true_change_pct"]) * 100
               for r in rows if abs(r["true_change_pct"]) >= 1.0]
    return (f"{_count(passed, len(rows))} in {scenarios} scenarios: median step error <= {median:.2f}%, "
            f"mean-step change within {max(changes):.1f}% of the true one")


def _joint_summary() -> str:
    rows = output("joint_accuracy")
    assert isinstance(rows, list)
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


def _pr172714_error() -> str:
    cases = output("fidelity_contention")["cases"]  # type: ignore[index]
    (case,) = [c for c in cases if "pr172714" in c["id"]]
    model = {**case["model"]["overlap"], "sequential": case["model"]["sequential"]}
    measured = {**case["measured"]["overlap"], "sequential": case["measured"]["sequential"]}
    worst = max(abs(model[k] - measured[k]) / measured[k] for k in measured)
    return f"pytorch #172714 within {worst * 100:.1f}%"


def _replay_summary() -> str:
    rows = output("replay_accuracy")
    assert isinstance(rows, list)
    worst = max(max(r["max_step_error_pct"], r["comm_error_pct"], r["exposed_error_pct"]) for r in rows)
    alone = max(r["explained_median_step_error_pct"] for r in rows)
    return (f"every step, collective time and exposed communication of {len(rows)} traces within {worst:.2f}%; "
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
            f"the cache, then {r['after_touch_s']:.1f} s after one file was touched; the outputs "
            f"{'the same bytes' if r['same_output'] else 'DIFFERENT'}; load average {r['load']}")


FIGURES: dict[str, Callable[[], str]] = {
    "replay.summary": _replay_summary,
    "bench.a40": _bench_a40,
    "bench.nvlink": _bench_nvlink,
    "whatif.summary": _whatif_summary,
    "joint.summary": _joint_summary,
    "fidelity.published": _published_summary,
    "fidelity.contention_split": _contention_split,
    "fidelity.pr172714": _pr172714_error,
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
    """``text`` with every marked figure rendered; the differences, one line each."""
    differences: list[str] = []

    def one(match: re.Match) -> str:
        fig = match.group("id")
        if fig not in FIGURES:
            raise SystemExit(f"figures: {where}: unknown figure {fig!r} (known: {', '.join(FIGURES)})")
        now = FIGURES[fig]()
        if now != match.group("text"):
            differences.append(f"{where}: {fig}: the doc says {match.group('text')!r}, its run gives {now!r}")
        return f"<!-- fig:{fig} -->{now}<!-- /fig -->"

    return MARK.sub(one, text), differences


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
        marked += len(MARK.findall(text))
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
