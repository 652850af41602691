"""The CPU's time between calls as a what-if, on paired traces (tests/kineto_world.py).

``--scale cpu=F`` must give the second run of a program whose CPU gaps took F times as
long; ``--unprofiled-cpu`` must find that F itself from the step times ``lagom record``
writes (here: the first run as the profiled steps, the second as the unprofiled ones).
The replay scales each call's own time as well as the gaps between calls, which the
generator's world does not: within 1.5% per step at F 0.7-1.5 (docs/replay.md).
"""

from __future__ import annotations

import gzip
import json

import kineto_world as kw
import pytest

from lagom.cli import main


def _steps(capsys, *argv: str) -> tuple[list[dict], str]:
    assert main(["simulate", *argv, "--json"]) == 0
    out = capsys.readouterr()
    return json.loads(out.out)["steps"], out.err


@pytest.mark.parametrize("scenario, cpu", [("cpu_paced", 0.7), ("cpu_paced_1thread", 1.5), ("mixed", 1.5),
                                           ("mixed", 0.7), ("cpu_ahead", 0.7)])
def test_scaling_the_cpu_predicts_the_run_whose_cpu_took_that_long(tmp_path, capsys, scenario, cpu):
    first, _, truth = kw.paired(kw.SCENARIOS[scenario], tmp_path, cpu=cpu)
    steps, _ = _steps(capsys, str(first), "--scale", f"cpu={cpu}")
    verdict = kw.verdict(truth, [s["iteration_us"] for s in steps])
    assert verdict.median_step_error <= 0.015, verdict
    assert verdict.change_ok, verdict


def _recorded(path, profiled_us: list[float], unprofiled_us: list[float]) -> None:
    """Write the lagomRecord metadata lagom record would (docs/record.md) into a trace."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    doc["lagomRecord"] = {"format": "lagom.record", "version": 1, "job_id": "pair", "clock": "cuda_events",
                          "step_time_us": {"unprofiled": {"device": unprofiled_us, "host": unprofiled_us},
                                           "profiled": {"device": profiled_us, "host": profiled_us}}}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


@pytest.mark.parametrize("scenario", ["cpu_paced", "mixed"])
def test_unprofiled_cpu_finds_the_scale_that_gives_the_unprofiled_steps(tmp_path, capsys, scenario):
    first, _, truth = kw.paired(kw.SCENARIOS[scenario], tmp_path, cpu=0.7)
    _recorded(first, [s.iteration_us for s in truth.first.steps], [s.iteration_us for s in truth.second.steps])
    steps, err = _steps(capsys, str(first), "--unprofiled-cpu")
    assert "--unprofiled-cpu: the CPU's time between calls x" in err
    verdict = kw.verdict(truth, [s["iteration_us"] for s in steps])
    assert verdict.median_step_error <= 0.02, verdict
    plain, _ = _steps(capsys, str(first))
    assert [s["measured_iteration_us"] for s in plain] == [s["measured_iteration_us"] for s in steps]


def test_unprofiled_cpu_needs_recorded_step_times(tmp_path, capsys):
    first, _, _ = kw.paired(kw.SCENARIOS["cpu_paced"], tmp_path, cpu=0.7)
    assert main(["simulate", str(first), "--unprofiled-cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs the step times lagom record writes" in err[0]
