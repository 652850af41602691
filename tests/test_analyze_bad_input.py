"""Bad input to `lagom analyze`: one line on stderr naming the file and the problem, exit 2."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import orjson
import pytest
from conftest import trace_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lagom.cli import main


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["analyze", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_line_error(rc, err, path, words):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lagom analyze: error: ")
    assert str(path) in lines[0]
    assert words in lines[0]
    assert "Traceback" not in err


def _half_a_gzip() -> bytes:
    data = trace_path("mi250_rocm_minitoy.json.gz").read_bytes()
    return data[: len(data) // 2]


_CPU_OPS = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5, "args": {}}
            for i in range(20)]


# (file name, its bytes (None: no file), words in the error)
@pytest.mark.parametrize("name, data, words", [
    pytest.param("nope.json.gz", None, "no such file", id="missing_file"),
    pytest.param("trace.json", b"this is not { json", "not valid JSON", id="not_json"),
    pytest.param("cut.json.gz", _half_a_gzip(), "truncated gzip", id="truncated_gzip"),
    pytest.param("config.json", b'{"learning_rate": 0.1, "layers": [1, 2]}', "not a PyTorch profiler trace",
                 id="json_that_is_not_a_trace"),
    pytest.param("cpu_ops_only.json", orjson.dumps({"schemaVersion": 1, "traceEvents": _CPU_OPS}),
                 "neither GPU kernels nor collectives", id="trace_with_neither_kernels_nor_collectives"),
])
def test_bad_file(capsys, tmp_path, name, data, words):
    path = tmp_path / name
    if data is not None:
        path.write_bytes(data)
    rc, _, err = _run(capsys, path)
    _assert_one_line_error(rc, err, path, words)


def test_empty_directory(capsys, tmp_path):
    rc, _, err = _run(capsys, tmp_path)
    _assert_one_line_error(rc, err, tmp_path, "no .json or .json.gz")


def test_bad_plot_target(capsys, tmp_path):
    trace = trace_path("mi250_rocm_minitoy.json.gz")
    target = tmp_path / "missing_dir" / "t.png"
    rc, _, err = _run(capsys, trace, "--plot", target)
    _assert_one_line_error(rc, err, target, "is not an existing folder")


# ---- property: no mutation of a real trace gets a traceback ----------------------------------
_BASES = {name: orjson.loads(gzip.decompress(trace_path(name).read_bytes()))
          for name in ("mi250_rocm_minitoy.json.gz", "cpu_only_rank34.json.gz")}

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12) | st.sampled_from(["[0, 1]", "Float", "nccl:all_reduce", "record_param_comms",
                                              "ProfilerStep#9", "kernel", "ncclDevKernel_Generic", "-1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _mutated_trace(draw) -> tuple[bytes, str]:
    name = draw(st.sampled_from(sorted(_BASES)))
    doc = orjson.loads(orjson.dumps(_BASES[name]))  # a fresh deep copy
    events = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["event_field", "arg", "drop_field", "replace_event", "top_level"]))
        e = events[draw(st.integers(0, len(events) - 1))]
        if what == "event_field" and isinstance(e, dict):
            e[draw(st.sampled_from(["ts", "dur", "cat", "name", "ph", "pid", "tid", "args"]))] = draw(_json_values)
        elif what == "arg" and isinstance(e, dict) and isinstance(e.get("args"), dict):
            key = draw(st.sampled_from(["stream", "correlation", "grid", "block", "External id", "Input Dims",
                                        "Input type", "Collective name", "In msg nelems", "dtype",
                                        "Process Group Ranks", "wait_on_stream", "blocks per SM"]))
            e["args"][key] = draw(_json_values)
        elif what == "drop_field" and isinstance(e, dict) and e:
            e.pop(draw(st.sampled_from(sorted(e))), None)
        elif what == "replace_event":
            events[events.index(e)] = draw(_json_values)
        else:
            doc[draw(st.sampled_from(["distributedInfo", "deviceProperties", "traceEvents",
                                      "schemaVersion"]))] = draw(_json_values)
    data = orjson.dumps(doc)
    cut = draw(st.none() | st.integers(0, len(data)))
    if cut is not None and draw(st.booleans()):
        data = data[:cut]
    return data, name


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=_mutated_trace(), gz=st.booleans())
def test_mutated_real_trace_never_gets_a_traceback(capsys, case, gz):
    data, _ = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("t.json.gz" if gz else "t.json")
        path.write_bytes(gzip.compress(data) if gz else data)
        rc = main(["analyze", str(path), "--json"])  # any exception other than LagomError fails the test
        out, err = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        assert len(err.strip().splitlines()) == 1 and str(path) in err
    else:
        assert orjson.loads(out)["ranks"]
