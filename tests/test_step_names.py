"""Steps that share a name (traces/exec_graph_build.py ``_steps``, issue 32): a trace whose
``ProfilerStep#N`` annotations repeat a name (two profiler sessions in one file, a writer that
restarts its count) keeps each step apart, the later named "... (repeat N)", and says so; before,
the second was dropped and its time merged into the first's period."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import kineto_world as kw
import pytest
from conftest import run_cli

from traces.kineto import read_trace


def _traces(tmp_path: Path) -> tuple[Path, Path]:
    """One kineto_world trace as written, and again with its last two steps named as the two before."""
    p = kw.SCENARIOS["comm_bound"]
    plain = kw.write_trace(kw.simulate(p), tmp_path / "plain.json.gz")
    doc = json.loads(gzip.decompress(plain.read_bytes()))
    names = sorted({e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")},
                   key=lambda n: int(n.split("#")[1]))
    renamed = dict(zip(names[-2:], names[-4:-2]))
    for e in doc["traceEvents"]:
        if e.get("name") in renamed:
            e["name"] = renamed[e["name"]]
    repeated = tmp_path / "repeated.json.gz"
    repeated.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return plain, repeated


def test_steps_that_share_a_name_are_kept_apart(tmp_path: Path) -> None:
    plain, repeated = _traces(tmp_path)
    a, b = read_trace(plain)[0], read_trace(repeated)[0]
    assert a.exec_graph is not None and b.exec_graph is not None
    first, again = a.exec_graph.steps, b.exec_graph.steps
    assert len(again) == len(first) >= 5
    assert [(s.start_us, s.end_us) for s in again] == [(s.start_us, s.end_us) for s in first]
    names = [s.name for s in again]
    assert len(set(names)) == len(names) and names[-2:] == [f"{n} (repeat 2)" for n in names[-4:-2]]
    assert a.input_warnings == []
    assert len(b.input_warnings) == 1 and "annotate more than one step: each kept apart" in b.input_warnings[0]


@pytest.mark.slow
def test_simulate_reports_every_step_of_repeated_names(tmp_path: Path, capsys) -> None:
    plain, repeated = _traces(tmp_path)
    code, out, _ = run_cli(capsys, "simulate", str(plain), "--json")
    assert code == 0
    steps = json.loads(out)["steps"]
    code, out, err = run_cli(capsys, "simulate", str(repeated), "--json")
    assert code == 0 and "annotate more than one step" in err
    again = json.loads(out)["steps"]
    assert len(again) == len(steps)
    assert [s["iteration_us"] for s in again] == pytest.approx([s["iteration_us"] for s in steps])
