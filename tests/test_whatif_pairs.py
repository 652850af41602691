"""What-ifs judged against paired traces (issue 17, item 3).

tests/kineto_world.py runs one program twice, the second time with every collective's
(or compute kernel's) GPU time x F, and knows each run's per-step GPU period from its
own simulation. ``lagom simulate FIRST --scale comm=F`` must give the second run's
steps: median per-step error <= 2%, and the mean step's change within 15% of the true
change. Where the true change is nil (a CPU-paced step, where faster collectives save
nothing), a prediction within 0.2% of the step counts as nil. The grid
(kineto_world.WHATIF_GRID) covers the CPU far ahead of the GPU, CPU-paced and mixed
steps, one and two launching threads, with and without ``cuda_sync`` events, F below
and above 1. ``bench/whatif_accuracy.py`` prints the same figures as a table.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
from pathlib import Path

import kineto_world as kw
import pytest

from lagom.cli import main


def simulate_steps(trace: Path, *extra: str) -> list[dict]:
    """``lagom simulate TRACE --json [extra]``'s per-step list."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["simulate", str(trace), "--json", *extra])
    except SystemExit as exc:  # argparse refused the arguments
        code = exc.code
    assert code == 0, err.getvalue()
    return json.loads(out.getvalue())["steps"]


def by_truth(steps: list[dict], truth: kw.RunTruth) -> list[dict]:
    """The simulated steps in the truth's order, matched by ProfilerStep name."""
    named = {s["name"]: s for s in steps}
    missing = [t.name for t in truth.steps if t.name not in named]
    assert not missing, f"simulate reports no {missing}; it has {sorted(named)}"
    return [named[t.name] for t in truth.steps]


@pytest.mark.parametrize("whatif", kw.WHATIF_GRID, ids=lambda w: w.label.replace(" ", "-"))
def test_the_replay_predicts_the_second_run(whatif: kw.WhatIf, tmp_path: Path) -> None:
    first, _, truth = kw.paired(kw.SCENARIOS[whatif.scenario], tmp_path, comm=whatif.comm, compute=whatif.compute)
    steps = by_truth(simulate_steps(first, "--scale", whatif.scale_arg), truth.second)
    true_steps = truth.second.steps
    judged = kw.verdict(truth, [s["iteration_us"] for s in steps])
    errors = [round(abs(s["iteration_us"] - t.iteration_us) / t.iteration_us, 4) for s, t in zip(steps, true_steps)]
    assert judged.median_step_error <= kw.MAX_MEDIAN_STEP_ERROR, errors
    assert judged.change_ok, f"mean step change: predicted {judged.predicted_change:+.2%}, true {truth.change:+.2%}"
    # the step's collective time and its exposed part follow, each within 2% of the step
    for key, attr in (("comm_us", "comm_us"), ("exposed_comm_us", "exposed_comm_us")):
        off = [abs(s[key] - getattr(t, attr)) / t.iteration_us for s, t in zip(steps, true_steps)]
        assert statistics.median(off) <= kw.MAX_MEDIAN_STEP_ERROR, (key, [round(e, 4) for e in off])


@pytest.mark.parametrize("scenario", ["cpu_ahead_nosync", "mixed", "cpu_paced_1thread"])
def test_the_measured_step_is_the_gpu_period(scenario: str, tmp_path: Path) -> None:
    """With the recorded settings the replay's "measured" step is the GPU's period
    (first GPU op launched in ProfilerStep#N to the first launched in #N+1), not the
    CPU annotation's span."""
    run = kw.simulate(kw.SCENARIOS[scenario])
    truth = kw.truth(run)
    steps = by_truth(simulate_steps(kw.write_trace(run, tmp_path / "t.json.gz")), truth)
    for s, t in zip(steps, truth.steps):
        assert s["measured_iteration_us"] == pytest.approx(t.iteration_us, abs=0.01), s["name"]
        assert s["iteration_us"] == pytest.approx(t.iteration_us, rel=1e-3), s["name"]
