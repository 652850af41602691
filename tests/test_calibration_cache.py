"""The analytic model's calibration against a preset's simulator is kept in the cache folder
(lagom.orchestration.tuning.calibrated_cluster): made once, even by two commands at once, and made
again when the kept file is damaged."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO_ROOT

from costmodel.cluster import load_cluster
from lagom.orchestration.tuning import calibrated_cluster

BUDGET = 20  # measurements: a small fit (about a second), its own cache key
CALIBRATE = ("from lagom.orchestration.tuning import calibrated_cluster\n"
             f"c = calibrated_cluster('low-bw', budget={BUDGET}, log=print)\n"
             "print('fitted', sorted(c.model.items()))\n")


def test_two_commands_at_once_fit_once_and_read_the_same_fit(tmp_path):
    env = {**os.environ, "LAGOM_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", CALIBRATE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    said = [line for out, _ in outs for line in out.splitlines() if line.startswith("calibrating")]
    assert said == [f"calibrating the analytic model against sim:low-bw ({BUDGET} measurements)"]  # one fit
    fitted = {line for out, _ in outs for line in out.splitlines() if line.startswith("fitted")}
    assert len(fitted) == 1  # the second read the first's fit
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert len(kept) == 1 and kept[0].startswith("calibrated-low-bw-")
    assert not list(tmp_path.glob("*.tmp"))


def test_a_damaged_fit_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path))
    said: list[str] = []
    first = calibrated_cluster("low-bw", budget=BUDGET, log=said.append)
    (path,) = tmp_path.glob("calibrated-low-bw-*.yaml")
    assert calibrated_cluster("low-bw", budget=BUDGET, log=said.append) == first and len(said) == 1  # kept
    path.write_text("gpu: [not, a, cluster\n")
    again = calibrated_cluster("low-bw", budget=BUDGET, log=said.append)
    assert len(said) == 2 and again.model == first.model  # fitted again: the simulator is deterministic
    assert load_cluster(path).model == first.model
