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
