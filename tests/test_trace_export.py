"""--export-trace: a prediction written as a Kineto trace reads back as what was predicted.

Round trip: ``lagom analyze`` on the export gives the replay's per-step step time,
collective time and exposed communication within 0.1%; HTA parses it when installed.
"""

from __future__ import annotations

import gzip
import importlib.util
import json

import pytest
from conftest import trace_path

from lagom.cli import main

W2 = "a100_w2_allreduce_broadcast.json.gz"  # bundled: traces/examples
W16 = "a100_w16_sendrecv_3streams_rank0.json.gz"  # ../shared only


def _steps(rows: list[dict]) -> list[tuple[str, float, float, float]]:
    return [(r["name"], r["iteration_us"], r["comm_us"], r["exposed_comm_us"]) for r in rows]


def _simulate_and_analyze(capsys, trace, tmp_path, *what: str) -> tuple[list, list, dict]:
    out = tmp_path / "predicted.json.gz"
    assert main(["simulate", str(trace), "--cluster", "a100-nvswitch", *what, "--export-trace", str(out),
                 "--json"]) == 0
    predicted = json.loads(capsys.readouterr().out)
    assert predicted["export_trace"] == str(out)
    assert main(["analyze", str(out), "--json"]) == 0
    read_back = json.loads(capsys.readouterr().out)["ranks"][0]
    return _steps(predicted["steps"]), _steps(read_back["steps"]), json.loads(gzip.decompress(out.read_bytes()))


# the bundled trace is paced by its CPU (78% idle): only a large what-if moves its steps
@pytest.mark.parametrize("name, what", [(W2, ["--scale", "compute=8"]), (W2, ["--scale", "comm=30"]),
                                        (W16, ["--scale", "comm=0.5"])])
def test_analyze_on_an_export_reads_back_the_prediction(capsys, tmp_path, name, what):
    predicted, read_back, doc = _simulate_and_analyze(capsys, trace_path(name), tmp_path, *what)
    assert [p[0] for p in predicted] == [r[0] for r in read_back]
    for p, r in zip(predicted, read_back):
        for a, b in zip(p[1:], r[1:]):
            assert b == pytest.approx(a, rel=1e-3, abs=0.5)
    assert main(["simulate", str(trace_path(name)), "--cluster", "a100-nvswitch", "--json"]) == 0
    measured = _steps(json.loads(capsys.readouterr().out)["steps"])
    assert [m[1] for m in measured] != [p[1] for p in predicted]  # the prediction really moved the steps
    assert doc["lagom_export"]["predicted"] == " ".join(what)  # what the file predicts, said in it
    assert doc["distributedInfo"] and doc["deviceProperties"]  # the original's metadata


def test_the_export_keeps_the_original_layout(capsys, tmp_path):
    source = trace_path(W2)
    _, _, doc = _simulate_and_analyze(capsys, source, tmp_path, "--scale", "compute=8")
    original = json.loads(gzip.decompress(source.read_bytes()))

    def layout(d: dict) -> list[tuple]:
        return sorted((str(e.get("ph")), str(e.get("cat")), str(e.get("name")), str(e.get("pid")), str(e.get("tid")))
                      for e in d["traceEvents"] if isinstance(e, dict))

    assert layout(doc) == layout(original)
    moved = sum(1 for a, b in zip(original["traceEvents"], doc["traceEvents"]) if a.get("ts") != b.get("ts"))
    assert moved > 100  # kernels and the CPU calls after the host syncs they waited on


def test_export_paths_are_checked_before_any_work(tmp_path):
    source = trace_path(W2)
    assert main(["simulate", str(source), "--export-trace", str(source)]) == 2  # the input itself
    assert main(["simulate", str(source), "--export-trace", str(tmp_path / "x.png")]) == 2
    assert main(["simulate", "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--export-trace",
                 str(tmp_path / "x.json")]) == 2
    mine = tmp_path / "mine.json.gz"
    mine.write_bytes(source.read_bytes())  # a trace of the user's own, not an export
    assert main(["simulate", str(source), "--export-trace", str(mine)]) == 2
    assert mine.read_bytes() == source.read_bytes()  # refused before any work: untouched
    out = tmp_path / "predicted.json.gz"
    for _ in range(2):  # a trace Lagom exported is replaced without --force
        assert main(["simulate", str(source), "--scale", "comm=2", "--export-trace", str(out)]) == 0
    assert main(["simulate", str(source), "--export-trace", str(mine), "--force"]) == 0
    assert mine.read_bytes() != source.read_bytes()


@pytest.mark.skipif(importlib.util.find_spec("hta") is None, reason="HTA (holistictraceanalysis) is not installed")
def test_hta_parses_an_export(capsys, tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    assert main(["simulate", str(trace_path(W2)), "--cluster", "a100-nvswitch", "--scale", "comm=2",
                 "--export-trace", str(folder / "rank0.json.gz"), "--json"]) == 0
    capsys.readouterr()
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(folder))
    overlap = analysis.get_comm_comp_overlap(visualize=False)
    assert list(overlap["rank"]) == [0] and 0 < float(overlap["comp_comm_overlap_pctg"].iloc[0]) <= 100
