"""``lagom tune``'s work without the command line: ``tune(TuneRequest(...))`` (lagom/orchestration/tune_workload.py).

The result must be what the command prints: its JSON dict equal to ``lagom tune --json``'s for
the same input (but the wall time), its notes and warnings the command's stderr lines, in
order, and a bad request refused with the command's message before any work.
"""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
from conftest import EXAMPLES, run_cli

from lagom.orchestration.tune_workload import Told, TuneRequest, tune
from nccl_env.errors import LagomError

SPEC = "fsdp:llama3-8b:gpus=8"
TRACE = EXAMPLES / "fsdp8_a100_2ch_synthetic.json.gz"


class Heard:
    """A progress that keeps what it hears: the lines told, and the search's evaluations so far."""

    def __init__(self) -> None:
        self.told: list[tuple[Told, str]] = []
        self.searches: list[tuple[str, int | None]] = []
        self.done: list[int] = []

    def tell(self, kind: Told, text: str) -> None:
        self.told.append((kind, text))

    @contextmanager
    def search(self, label, total):
        self.searches.append((label, total))
        yield self.done.append


def _without_wall_time(summary: dict) -> dict:
    return {k: v for k, v in json.loads(json.dumps(summary)).items() if k != "elapsed_s"}


def _cli_json(capsys, *argv: str) -> tuple[dict, list[str]]:
    code, out, err = run_cli(capsys, "tune", *argv, "--json")
    assert code == 0, err
    return _without_wall_time(json.loads(out)), err.splitlines()


@pytest.mark.slow  # the analytic model's calibration, then the search twice
def test_a_spec_request_gives_the_commands_json(tmp_path, capsys):
    output = tmp_path / "lagom.yaml"
    heard = Heard()
    result = tune(TuneRequest(SPEC, cluster="h100-nvswitch", budget=30, output=str(output)), progress=heard)
    assert not output.exists()  # the caller writes the file
    assert result.tuned_us <= result.baseline_us and result.tuned_us > 0
    assert result.plan is result.outcome.result.plan
    assert result.rows and {r.signature.collective.value for r in result.rows} == {"allgather", "reducescatter"}
    assert result.fidelity is None and result.joint is None  # a generated workload: no replay, one rank
    assert heard.searches == [("tuning (lagom, evaluations)", 30)]
    assert heard.done and heard.done == sorted(heard.done) and heard.done[-1] <= 30  # the budget caps the method
    cli, _ = _cli_json(capsys, SPEC, "--cluster", "h100-nvswitch", "--budget", "30", "-o", str(output))
    assert _without_wall_time(result.to_dict()) == cli
    assert output.exists()


@pytest.mark.slow  # the calibration and the trace's replay, twice
def test_a_trace_request_gives_the_commands_json_notes_and_warnings(tmp_path, capsys):
    output, export = tmp_path / "t.yaml", tmp_path / "pred.json.gz"
    heard = Heard()
    request = TuneRequest(str(TRACE), budget=40, output=str(output), export_trace=str(export), with_autoccl=False)
    result = tune(request, progress=heard)
    assert result.from_trace and result.cluster.name.startswith("a100")  # the preset for the trace's GPU
    assert result.export_path == export and not export.exists()  # the caller exports
    assert result.tuned_us <= result.baseline_us
    assert result.fidelity is not None and len(result.to_dict()["steps"]) == len(result.outcome.baseline.steps) > 0
    assert result.notes and any("NCCL 2.21.5 from the trace" in n for n in result.notes)
    # what progress heard is what the result keeps, in the order the command prints it
    assert [t for k, t in heard.told if k is Told.NOTE] == result.notes
    assert [t for k, t in heard.told if k is Told.WARNING] == result.warnings
    cli, err = _cli_json(capsys, str(TRACE), "--budget", "40", "-o", str(output), "--export-trace", str(export),
                         "--no-autoccl")
    assert _without_wall_time(result.to_dict()) == cli
    said = [f"{k.value}{t}" for k, t in heard.told if k is not Told.LINE]
    assert [line for line in err if line.startswith(("note: ", "warning: "))] == said


@pytest.mark.parametrize("request_, flags", [
    (TuneRequest(SPEC, min_gain=-0.5), ["--min-gain", "-0.5"]),
    (TuneRequest(SPEC, budget=0), ["--budget", "0"]),
    (TuneRequest(SPEC, seed=-1), ["--seed", "-1"]),
    (TuneRequest(SPEC, cluster="low-bw", export_trace="e.json.gz"), ["--cluster", "low-bw", "--export-trace",
                                                                    "e.json.gz"]),
])
def test_a_bad_request_is_refused_with_the_commands_message(tmp_path, capsys, monkeypatch, request_, flags):
    monkeypatch.chdir(tmp_path)
    heard = Heard()
    with pytest.raises(LagomError) as refused:
        tune(request_, progress=heard)
    assert heard.searches == []  # before the search
    code, _, err = run_cli(capsys, "tune", SPEC, *flags)
    assert code == 2 and err == f"lagom tune: error: {refused.value}\n"
    assert not (tmp_path / "lagom.yaml").exists()
