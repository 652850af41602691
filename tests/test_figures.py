"""bench/figures.py: every marked figure in the README and docs is what its run's JSON gives, and a
figure edited by hand fails the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _check(*docs: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, "bench/figures.py", "--check"] + (["--docs", *map(str, docs)] if docs else [])
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_every_marked_figure_is_its_runs():
    done = _check()
    assert done.returncode == 0, done.stdout + done.stderr
    marked = int(done.stdout.split("figures: ")[-1].split()[0])
    assert marked >= 5, done.stdout  # the README's figure table holds marked figures


def test_a_figure_changed_by_hand_fails(tmp_path):
    readme = (REPO / "README.md").read_text()
    start = readme.index("<!-- fig:joint.summary -->") + len("<!-- fig:joint.summary -->")
    edited = tmp_path / "README.md"
    edited.write_text(readme[:start] + "8 of 7" + readme[start + len("7 of 7"):])
    done = _check(edited)
    assert done.returncode == 1
    assert "joint.summary: the doc says '8 of 7 pairs" in done.stdout, done.stdout


def _edited(tmp_path: Path, doc: str, old: str, new: str) -> Path:
    """A copy of ``doc`` with ``old`` (once, inside a marked figure) replaced by ``new``."""
    text = (REPO / doc).read_text()
    assert text.count(old) == 1, old
    edited = tmp_path / Path(doc).name
    edited.write_text(text.replace(old, new))
    return edited


def test_a_docs_row_changed_by_hand_fails(tmp_path):
    """A keyed figure (one row of docs/replay.md's joint table, named by its what-if) is held to its row."""
    row = "<!-- fig:joint.row moe comm=1.5 -->+14.2% | +14.2% | 0.00%<!-- /fig -->"
    done = _check(_edited(tmp_path, "docs/replay.md", row, row.replace("+14.2% | +14.2%", "+14.2% | +14.3%")))
    assert done.returncode == 1
    assert "joint.row moe comm=1.5: the doc says '+14.2% | +14.3% | 0.00%'" in done.stdout, done.stdout


def test_a_docs_table_changed_by_hand_fails(tmp_path):
    """A whole table (docs/tuner.md's 32 bench cells) is held to its run, cell by cell."""
    cell = "| low-bw | `fsdp:phi2:gpus=8` | 4 | 819,383 | 816,653 | 1.003 |"
    done = _check(_edited(tmp_path, "docs/tuner.md", cell, cell.replace("1.003", "1.030")))
    assert done.returncode == 1
    assert "bench.a40.cells: the doc's table differs from its run" in done.stdout, done.stdout
    assert "1.030" in done.stdout and "1.003" in done.stdout


def test_a_table_losing_a_row_fails(tmp_path):
    row = "| cpu_ahead compute x1.6 | 100.0% | +56.76% | +56.76% | 0.00% |\n"
    done = _check(_edited(tmp_path, "docs/replay.md", row, ""))
    assert done.returncode == 1
    assert "whatif.table: the doc's table differs from its run: 16 -> 17 lines" in done.stdout, done.stdout


def test_docs_figures_are_marked():
    """The docs' figure tables are held to their runs, not only the README's."""
    for doc, figures in {"docs/replay.md": ("replay.table", "whatif.table", "joint.row"),
                         "docs/tuner.md": ("bench.a40.cells", "bench.a40.clusters"),
                         "docs/performance.md": ("whatif.summary", "joint.summary", "bench.field")}.items():
        text = (REPO / doc).read_text()
        for fig in figures:
            assert f"<!-- fig:{fig}" in text, (doc, fig)


def test_a_key_naming_no_row_is_one_line(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("| a | <!-- fig:joint.row straggler comm=3 -->+15.8% | +15.8% | 0.00%<!-- /fig --> |\n")
    done = _check(doc)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "joint.row: no row 'straggler comm=3' in its source" in done.stderr, done.stderr
