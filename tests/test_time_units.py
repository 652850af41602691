"""A trace's time unit (traces/time_units.py, issue 32): the Chrome trace format's ``ts`` and
``dur`` are microseconds whatever ``displayTimeUnit`` says (Kineto writes "ns" over
microseconds when built with DISPLAY_TRACE_IN_NS), but some writers put nanoseconds there
under "ns": read as microseconds, such a trace was a step 1,000 times too long on collectives
1,000 times too slow, without a word."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_cli

from traces.kineto import read_trace

FSDP = EXAMPLES / "fsdp8_a100_2ch_synthetic.json.gz"


def _rewritten(tmp_path: Path, factor: float, unit: str | None) -> Path:
    """The example trace with its times x ``factor`` and ``displayTimeUnit`` ``unit``."""
    doc = json.loads(gzip.decompress(FSDP.read_bytes()))
    for e in doc["traceEvents"]:
        for key in ("ts", "dur"):
            if isinstance(e.get(key), int | float):
                e[key] = round(e[key] * factor, 3)
    if unit is None:
        doc.pop("displayTimeUnit", None)
    else:
        doc["displayTimeUnit"] = unit
    path = tmp_path / f"x{factor:g}_{unit}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _figures(path: Path) -> tuple[list[float], list[str]]:
    w = read_trace(path)[0]
    return sorted(c.duration_us for c in w.collectives), w.input_warnings


def test_nanosecond_times_under_ns_are_read_as_nanoseconds(tmp_path: Path) -> None:
    measured, warnings = _figures(FSDP)
    assert warnings == []
    found, said = _figures(_rewritten(tmp_path, 1e3, "ns"))
    assert found == pytest.approx(measured, abs=1e-3)
    assert len(said) == 1 and 'displayTimeUnit is "ns"' in said[0] and "read as nanoseconds" in said[0]
    assert "the median GPU kernel lasts 112.6 ms" in said[0]


def test_microsecond_times_under_ns_stay_microseconds(tmp_path: Path) -> None:
    """Kineto's DISPLAY_TRACE_IN_NS: "ns" for the viewer, times in microseconds: read as written."""
    measured, _ = _figures(FSDP)
    found, said = _figures(_rewritten(tmp_path, 1.0, "ns"))
    assert found == pytest.approx(measured, abs=1e-3) and said == []


@pytest.mark.parametrize("factor, named", [(1e3, "the median GPU kernel lasts 112.6 ms"),
                                           (1e-3, "TB/s, ten times any GPU link")])
def test_implausible_times_without_a_hint_are_one_warning(factor: float, named: str, tmp_path: Path) -> None:
    found, said = _figures(_rewritten(tmp_path, factor, None))
    assert len(said) == 1 and named in said[0] and "are its times in another unit?" in said[0], said


@pytest.mark.slow
def test_analyze_prints_the_time_unit_warning(tmp_path: Path, capsys) -> None:
    path = _rewritten(tmp_path, 1e3, "ns")
    code, _, err = run_cli(capsys, "analyze", str(path))
    assert code == 0 and 'displayTimeUnit is "ns"' in err and "read as nanoseconds" in err
