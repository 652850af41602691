"""``lagom simulate``'s work without the command line: ``simulate(SimulateRequest(...))``
(lagom/orchestration/simulation.py) on a generated spec, the bundled traces and a folder of
ranks; its result is what ``lagom simulate --json`` prints, byte for byte, and its lines what
the command prints on stderr; a bad request raises the LagomError the command prints."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import EXAMPLES, TEST_DATA, run_cli

from lagom.orchestration.simulation import SimulateRequest, SimulateResult, simulate
from nccl_env.errors import LagomError

FSDP_TRACE = str(EXAMPLES / "fsdp8_a100_2ch_synthetic.json.gz")  # 8 ranks' FSDP step, recorded settings
GLOO_RANKS = str(TEST_DATA / "gloo_ddp_w2")  # a folder of two ranks: replayed jointly


def _cli_matches(capsys, result: SimulateResult, *argv: str) -> None:
    """``lagom simulate ARGV --json`` prints the result's JSON and its lines, byte for byte."""
    code, out, err = run_cli(capsys, "simulate", *argv, "--json")
    assert code == 0
    assert out == json.dumps(result.to_dict()) + "\n"
    assert err == "".join(line + "\n" for line in result.lines)


def test_a_spec_and_a_set_what_if(capsys):
    base = simulate(SimulateRequest("fsdp:llama3-8b:gpus=8", cluster="h100-nvswitch", noise=0.0))
    lean = simulate(SimulateRequest("fsdp:llama3-8b:gpus=8", cluster="h100-nvswitch", noise=0.0,
                                    set_config="channels=2"))
    assert base.evaluations == 1 and base.cluster == "h100-nvswitch" and base.evaluator == "sim"
    assert base.timing.steps == [] and base.fidelity is None and base.measured is None and base.joint is None
    assert "steps" not in base.to_dict() and base.to_dict()["ops"] == base.ops > base.collectives > 0
    assert base.timing.iteration_us >= max(base.timing.compute_us, base.timing.comm_us)
    # two channels move the same bytes slower: more communication, a longer iteration
    assert lean.timing.comm_us > base.timing.comm_us and lean.timing.iteration_us > base.timing.iteration_us
    assert lean.whatif and not base.whatif
    _cli_matches(capsys, lean, "fsdp:llama3-8b:gpus=8", "--cluster", "h100-nvswitch", "--noise", "0",
                 "--set", "channels=2")


def test_a_trace_replayed_as_recorded_and_as_a_what_if(capsys, tmp_path):
    own = simulate(SimulateRequest(FSDP_TRACE))
    assert own.cluster == "a100-nvswitch" and own.notes[0].startswith("cluster a100-nvswitch: the preset")
    assert own.measured is None and own.fidelity is not None and own.fidelity.median_step_error_pct < 1.0
    assert "whatif" not in own.to_dict() and len(own.timing.steps) == own.fidelity.steps > 1
    out = tmp_path / "half.json.gz"
    half = simulate(SimulateRequest(FSDP_TRACE, scale=("comm=0.5",), export_trace=str(out)))
    assert half.measured is not None and half.whatif
    # the measured figures are the trace's, the same as the replay of its own settings gives
    assert half.measured["comm_us"] == pytest.approx(own.timing.comm_us, abs=1e-3)
    assert half.timing.comm_us == pytest.approx(half.measured["comm_us"] / 2, rel=0.01)
    assert half.timing.iteration_us < half.measured["iteration_us"]
    assert half.fidelity == own.fidelity  # the fidelity stays the replay under the trace's own times
    assert half.export_trace == out and out.stat().st_size > 0
    assert half.lines[-1] == f"prediction written to {out} (--scale comm=0.5)"
    assert half.to_dict()["export_trace"] == str(out) and half.to_dict()["whatif"] is True
    _cli_matches(capsys, own, FSDP_TRACE)
    _cli_matches(capsys, half, FSDP_TRACE, "--scale", "comm=0.5", "--export-trace", str(out))


def test_a_folder_of_ranks_replayed_jointly(capsys):
    job = simulate(SimulateRequest(GLOO_RANKS, cluster="a100-nvswitch"))
    assert job.joint is not None and sorted(job.joint.ranks) == [0, 1] and job.evaluations == 2
    assert job.figures_of.startswith("gloo_ddp_w2: 2 ranks, the job's step")
    assert job.lines[-1].startswith("2 ranks replayed jointly") and sorted(job.to_dict()["ranks"]) == ["0", "1"]
    one = simulate(SimulateRequest(GLOO_RANKS, cluster="a100-nvswitch", scale=("comm=0.5@1",)))
    # rank 1's collectives halved: the job's step moves off the measured one (its waits move with them)
    assert one.measured is not None and one.measured["comm_us"] == pytest.approx(job.timing.comm_us, abs=1e-3)
    assert abs(one.timing.comm_us - one.measured["comm_us"]) > 100.0
    _cli_matches(capsys, one, GLOO_RANKS, "--cluster", "a100-nvswitch", "--scale", "comm=0.5@1")
    alone = simulate(SimulateRequest(GLOO_RANKS, cluster="a100-nvswitch", rank=1))
    assert alone.joint is None and alone.rank == 1 and alone.figures_of.endswith("(rank 1)")


def test_a_request_is_data():
    request = SimulateRequest("fsdp:phi2:gpus=8", cluster="high-bw")
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.seed = 3
    assert simulate(request).to_dict() == simulate(dataclasses.replace(request)).to_dict()  # same seed, same figures


@pytest.mark.parametrize("request_, argv", [
    (SimulateRequest("fsdp:phi2:gpus=8", cluster="high-bw", scale=("comm=0.5",)),
     ["fsdp:phi2:gpus=8", "--cluster", "high-bw", "--scale", "comm=0.5"]),
    (SimulateRequest("fsdp:phi2:gpus=8", cluster="high-bw", set_config="channels=999"),
     ["fsdp:phi2:gpus=8", "--cluster", "high-bw", "--set", "channels=999"]),
    (SimulateRequest("fsdp:phi2:gpus=8"), ["fsdp:phi2:gpus=8"]),
    (SimulateRequest(FSDP_TRACE, noise=0.02), [FSDP_TRACE, "--noise", "0.02"]),
    (SimulateRequest(FSDP_TRACE, scale=("comm=0.5@9",)), [FSDP_TRACE, "--scale", "comm=0.5@9"]),
    (SimulateRequest("fsdp:phi2:gpus=8", cluster="high-bw", seed=-1),
     ["fsdp:phi2:gpus=8", "--cluster", "high-bw", "--seed", "-1"]),
])
def test_a_bad_request_raises_what_the_command_prints(capsys, request_, argv):
    with pytest.raises(LagomError) as refused:
        simulate(request_)
    code, out, err = run_cli(capsys, "simulate", *argv)
    assert code == 2 and out == "" and err == f"lagom simulate: error: {refused.value}\n"


def test_lines_reach_say_before_a_later_refusal(capsys):
    """A warning found before a refusal is said first, as the command prints it."""
    said: list[str] = []
    request = SimulateRequest("fsdp:phi2:gpus=32", cluster="high-bw", scale=("comm=0.5",))
    with pytest.raises(LagomError, match=r"^--scale: applies to a trace's measured times"):
        simulate(request, say=said.append)
    assert said == ["warning: the workload has a process group of 32 ranks but high-bw has 16 GPUs (2 x 8): its "
                    "collectives are modelled on 4 nodes of this kind"]
    code, _, err = run_cli(capsys, "simulate", "fsdp:phi2:gpus=32", "--cluster", "high-bw", "--scale", "comm=0.5")
    assert code == 2 and err.splitlines()[0] == said[0] and err.splitlines()[1].startswith("lagom simulate: error:")
    result = simulate(dataclasses.replace(request, scale=()))
    assert result.warnings == [said[0].removeprefix("warning: ")] and result.notes == []
