"""Figures that must agree, on every trace the suite can read (issue 24, "figures that disagree").

Per trace, once (in-process, cached per module): ``lagom analyze --json``, ``lagom simulate
--json`` with and without ``--scale comm=0.5`` (the what-if exported as a trace), ``lagom
analyze --json`` on that export, and ``lagom tune --json``. Asserted:

- one count per collective: analyze counts every collective of its span once, simulate every
  collective of the trace once, the export holds the same collectives in the same steps, and a
  gloo DDP job (tests/data/gloo_ddp_w2, whose every all-reduce the trace holds twice: c10d's
  hand-over and gloo's worker span) shows its two buckets once per step everywhere;
- every total is its rows' sum or mean, within the rounding of the printed digits;
- steps tile: each step's period ends where the next one's begins, in the trace and in the
  export (its ``ProfilerStep#N`` annotations too);
- a what-if's summary and rows are the what-if's, with the measured figures beside them, labelled.

Traces whose tune is refused (no NCCL collective with a size: RCCL, one rank, CPU calls
only, unless given --cluster for a gloo job) are checked for the rest. The largest trace's
tune (about 20 s here) is in the slow set.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import re
from pathlib import Path

import pytest
from conftest import TEST_DATA, all_test_traces

GLOO_DDP = TEST_DATA / "gloo_ddp_w2"
SLOW_TUNE = {"a100_w16_sendrecv_3streams_rank0.json.gz"}  # tune's search there takes ~20 s on 2 cores
US_ROUNDING = 0.002  # the JSON's microsecond figures are rounded to 3 decimals
MS_ROUNDING = 0.0002  # tune's ms figures to 4


def _traces() -> list[Path]:
    return [*all_test_traces(), GLOO_DDP]


def _cli(*argv: str) -> tuple[int, str, str]:
    from lagom.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # analyze --json writes bytes to stdout.buffer
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    out.flush()
    return code, out.buffer.getvalue().decode(), err.getvalue()


class TraceRuns:
    """Each command run once on one trace, lazily; a command refused (exit 2) is None."""

    def __init__(self, path: Path, tmp: Path) -> None:
        self.path, self.tmp = path, tmp
        self._cache: dict[str, tuple[int, str, str]] = {}
        self.cluster: list[str] = []
        code, _, err = self._run("simulate", "simulate", str(path), "--json")
        if code == 2 and "give --cluster" in err:  # no GPU recorded (a gloo job): name one
            self.cluster = ["--cluster", "low-bw"]
            del self._cache["simulate"]

    def _run(self, key: str, *argv: str) -> tuple[int, str, str]:
        if key not in self._cache:
            self._cache[key] = _cli(*argv)
        return self._cache[key]

    def _json(self, key: str, *argv: str) -> dict | None:
        code, out, err = self._run(key, *argv)
        if code == 2:
            return None
        assert code == 0, err
        return json.loads(out)

    @property
    def export(self) -> Path:
        return self.tmp / "whatif.json.gz"

    def analyze(self) -> dict:
        report = self._json("analyze", "analyze", str(self.path), "--json", "--jobs", "1")
        assert report is not None
        return report

    def simulate(self) -> dict | None:
        return self._json("simulate", "simulate", str(self.path), "--json", *self.cluster)

    def whatif(self) -> dict | None:
        return self._json("whatif", "simulate", str(self.path), "--json", "--scale", "comm=0.5", *self.cluster,
                          "--export-trace", str(self.export), "--force")

    def export_analyze(self) -> dict | None:
        if self.whatif() is None or "export_trace" not in (self.whatif() or {}):
            return None
        return self._json("export_analyze", "analyze", str(self.export), "--json", "--jobs", "1")

    def tune(self) -> dict | None:
        return self._json("tune", "tune", str(self.path), "--json", "--no-autoccl", *self.cluster,
                          "-o", str(self.tmp / "t.yaml"), "--force")

    def tune_stderr(self) -> str:
        self.tune()
        return self._cache["tune"][2]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, TraceRuns]:
    cache: dict[str, TraceRuns] = {}

    def get(path: Path) -> TraceRuns:
        if path.name not in cache:
            cache[path.name] = TraceRuns(path, tmp_path_factory.mktemp(path.name.split(".")[0]))
        return cache[path.name]

    return get  # type: ignore[return-value]


TRACES = pytest.mark.parametrize("path", _traces(), ids=lambda p: p.name.split(".")[0])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _first_rank(report: dict) -> dict:
    return report["ranks"][0]


# ---- analyze -------------------------------------------------------------------------------


@TRACES
def test_analyze_steps_tile_and_its_tables_are_their_rows(runs, path):
    report = runs(path).analyze()
    for rank in report["ranks"]:
        steps = rank.get("steps") or []
        for a, b in zip(steps, steps[1:]):  # a step's period closes where the next one opens
            assert a["start_us"] + a["iteration_us"] == pytest.approx(b["start_us"], abs=2 * US_ROUNDING)
        for st in steps:
            assert 0 <= st["exposed_comm_us"] <= st["comm_us"] + US_ROUNDING
            assert st["comm_us"] <= st["iteration_us"] + US_ROUNDING
            assert st["critical_comm_us"] <= st["comm_us"] + US_ROUNDING
        for row in rank["collectives"]:
            assert row["count"] >= 1 and 0 <= row["exposed_us"] <= row["total_us"] + US_ROUNDING
        keys = [(c["collective"], c["group_size"], c["message_bytes"], c["on_gpu"], c["nccl_tunable"],
                 c.get("path")) for c in rank["collectives"]]
        assert len(keys) == len(set(keys))  # one row per kind of collective


@TRACES
def test_analyze_counts_each_collective_of_its_span_once(runs, path):
    from traces.kineto import read_trace
    from traces.steps import trim_to_profiler_steps

    report = runs(path).analyze()
    workloads = read_trace(str(path))
    for rank, w in zip(report["ranks"], workloads):
        view = trim_to_profiler_steps(w, include_last_step=False)
        assert sum(c["count"] for c in rank["collectives"]) == len(view.collectives)
    if path == GLOO_DDP:
        for rank in report["ranks"]:  # two buckets, once per complete step: not c10d's call and gloo's span both
            steps = len(rank["steps"])
            assert steps == 4
            assert sorted((c["message_bytes"], c["count"]) for c in rank["collectives"]) == [
                (262_400, steps), (2_101_248, steps)]


def test_gloo_ddp_analyze_prints_the_steps_sum_beside_htas_span(runs):
    code, out, _ = _cli("analyze", str(GLOO_DDP / "rank-0.json.gz"))
    assert code == 0
    rank = _first_rank(runs(GLOO_DDP).analyze())
    total_ms = sum(s["iteration_us"] for s in rank["steps"]) / 1e3
    flat = " ".join(out.split())
    assert f"add to {total_ms:,.2f} ms" in flat
    assert f"all {len(rank['steps'])} steps {total_ms:,.2f}" in " ".join(flat.replace("│", " ").split())


# ---- simulate --------------------------------------------------------------------------------


def _check_summary_is_the_steps_mean(result: dict, prefix: str = "") -> None:
    steps = result["steps"]
    for key in ("iteration_us", "comm_us", "exposed_comm_us"):
        assert result[key] == pytest.approx(_mean([s[prefix + key] for s in steps]), abs=US_ROUNDING * 2), key


@TRACES
def test_simulate_counts_every_collective_once_and_its_summary_is_its_steps(runs, path):
    from traces.kineto import read_trace

    result = runs(path).simulate()
    if result is None:
        pytest.skip(f"{path.name}: simulate refuses it")
    (w, *_) = read_trace(str(path))
    assert result["collectives"] == len(w.collectives)
    assert result["ops"] == len(w.compute_ops) + len(w.collectives)
    if path == GLOO_DDP:
        assert result["collectives"] == 10  # 2 buckets x 5 recorded steps, not 20
    assert "whatif" not in result and "measured" not in result
    if result.get("steps"):
        _check_summary_is_the_steps_mean(result)


@TRACES
def test_a_whatifs_summary_and_rows_are_the_whatifs_with_the_measured_beside_them(runs, path):
    result = runs(path).whatif()
    if result is None:
        pytest.skip(f"{path.name}: simulate refuses it")
    if not result.get("steps"):
        pytest.skip(f"{path.name}: no step to replay")
    assert result["whatif"] is True
    _check_summary_is_the_steps_mean(result)
    measured = result["measured"]
    for key in ("iteration_us", "comm_us", "exposed_comm_us"):
        assert measured[key] == pytest.approx(_mean([s["measured_" + key] for s in result["steps"]]),
                                              abs=US_ROUNDING * 2)
    plain = runs(path).simulate()
    assert plain is not None
    assert measured["iteration_us"] == pytest.approx(plain["iteration_us"], rel=1e-3)  # the replay is the trace
    if measured["comm_us"] > 0:  # half the collective time: less communication, never a longer step
        assert result["comm_us"] < measured["comm_us"]
        assert result["iteration_us"] <= measured["iteration_us"] * (1 + 1e-6)


def test_gloo_ddp_whatif_table_labels_measured_and_whatif(runs):
    code, out, _ = _cli("simulate", str(GLOO_DDP), "--cluster", "low-bw", "--scale", "comm=0.5")
    assert code == 0
    result = runs(GLOO_DDP).whatif()
    header = next(line for line in out.splitlines() if "quantity" in line)
    assert "measured" in header and "what-if" in header
    steps_header = next(line for line in out.splitlines() if "step" in line and "critical" in line)
    assert "what-if" in steps_header and "replayed" not in steps_header
    assert "X>Y: measured > what-if" in out
    flat = " ".join(out.replace("│", " ").split())
    m, w = result["measured"], result
    assert f"iteration (Z) {m['iteration_us'] / 1e3:,.2f} ms {w['iteration_us'] / 1e3:,.2f} ms" in flat
    assert f"communication busy (X) {m['comm_us'] / 1e3:,.2f} ms {w['comm_us'] / 1e3:,.2f} ms" in flat
    # the DDP job's main thread waits for its buckets: half the all-reduce time shortens its steps
    assert w["iteration_us"] < 0.9 * m["iteration_us"]


# ---- the export ------------------------------------------------------------------------------


@TRACES
def test_the_export_holds_the_same_collectives_in_the_same_steps_and_its_steps_tile(runs, path):
    r = runs(path)
    exported = r.export_analyze()
    if exported is None:
        pytest.skip(f"{path.name}: nothing exported")
    original, whatif = _first_rank(r.analyze()), r.whatif()
    assert whatif is not None
    rank = _first_rank(exported)
    key = lambda c: (c["collective"], c["group_size"], c["message_bytes"], c["on_gpu"])  # noqa: E731
    assert sorted((key(c), c["count"]) for c in rank["collectives"]) == \
        sorted((key(c), c["count"]) for c in original["collectives"])
    steps = rank.get("steps") or []
    # a folder's ranks are replayed jointly: the export is its lowest rank's replay, its steps that rank's own
    wanted = whatif["ranks"][str(rank["rank"])]["steps"] if "ranks" in whatif else whatif["steps"]
    assert [s["name"] for s in steps] == [s["name"] for s in wanted]
    for got, want in zip(steps, wanted):  # analyze on the export reads the what-if's steps
        assert got["iteration_us"] == pytest.approx(want["iteration_us"], rel=1e-3, abs=1.0)
        assert got["comm_us"] == pytest.approx(want["comm_us"], rel=1e-3, abs=1.0)
    for a, b in zip(steps, steps[1:]):
        assert a["start_us"] + a["iteration_us"] == pytest.approx(b["start_us"], abs=2 * US_ROUNDING)
    with gzip.open(r.export) as f:  # the step annotations tile as the trace's did: none ends after the next starts
        events = json.load(f)["traceEvents"]
    marks: dict[tuple, list[tuple[float, float]]] = {}  # per CPU thread (a GPU lane's copies are not steps)
    for e in events:
        if (isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"
                and e.get("cat") != "gpu_user_annotation"):
            marks.setdefault((e.get("pid"), e.get("tid")), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in marks.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert end <= start + 1e-3


# ---- tune ------------------------------------------------------------------------------------


@TRACES
def test_tunes_figures_are_its_steps_and_its_rows(runs, path):
    if path.name in SLOW_TUNE:
        pytest.skip("in the slow set: test_tune_identities_on_the_largest_trace")
    _check_tune(runs(path), path)


@pytest.mark.slow
def test_tune_identities_on_the_largest_trace(runs):
    paths = [p for p in _traces() if p.name in SLOW_TUNE]
    if not paths:
        pytest.skip("the shared traces are not beside the checkout")
    for path in paths:
        _check_tune(runs(path), path)


def _check_tune(r: TraceRuns, path: Path) -> None:
    summary = r.tune()
    if summary is None:
        pytest.skip(f"{path.name}: tune refuses it")
    n, t = summary["nccl"], summary["tuned"]
    assert summary["baseline_us"] / 1e3 == pytest.approx(n["step_ms"], abs=MS_ROUNDING + 1e-3)
    assert summary["tuned_us"] / 1e3 == pytest.approx(t["step_ms"], abs=MS_ROUNDING + 1e-3)
    steps = summary.get("steps") or []
    if steps:  # the summary is the steps' mean, under NCCL's settings and tuned
        assert n["step_ms"] == pytest.approx(_mean([s["iteration_us"] for s in steps]) / 1e3, abs=2e-3)
        assert n["collectives_ms"] == pytest.approx(_mean([s["comm_us"] for s in steps]) / 1e3, abs=2e-3)
        assert n["exposed_ms"] == pytest.approx(_mean([s["exposed_comm_us"] for s in steps]) / 1e3, abs=2e-3)
        assert t["step_ms"] == pytest.approx(_mean([s["tuned_iteration_us"] for s in steps]) / 1e3, abs=2e-3)
        assert t["collectives_ms"] == pytest.approx(_mean([s["tuned_comm_us"] for s in steps]) / 1e3, abs=2e-3)
        assert n["critical_collectives_ms"] == pytest.approx(
            _mean([s["measured_critical_comm_us"] for s in steps]) / 1e3, abs=2e-3)
        assert n["critical_collectives_ms"] <= n["collectives_ms"] + 2e-3
    rows = summary["rows"]
    assert summary["signatures"] == len(rows)
    total = summary["rows_total"]
    # the total is the step's rows': a signature run only in a step the replay drops (the
    # unfinished last one) shows its time there, outside it, and never 0 ms
    counted = [r for r in rows if r["rank"] is None and not r["outside_steps"]]
    assert all(r["nccl_ms"] > 0 for r in rows if r["outside_steps"])
    assert total["nccl_ms"] == pytest.approx(sum(r["nccl_ms"] for r in counted), abs=MS_ROUNDING * (len(rows) + 1))
    assert total["tuned_ms"] == pytest.approx(sum(r["tuned_ms"] for r in counted), abs=MS_ROUNDING * (len(rows) + 1))
    for row in rows:
        for key in ("nccl_compute_slowdown", "tuned_compute_slowdown"):
            assert row[key] >= 1.0 and math.isfinite(row[key])
        share = row["compute_slowdown_measured_share"]  # how much of that slowdown the trace measured
        assert share is None or 0.0 <= share <= 1.0
    err = r.tune_stderr()
    if "no recorded message size" not in err:  # every collective is in a row: their sum covers the union
        assert total["nccl_ms"] >= n["collectives_ms"] - 2e-3
    why = " ".join(summary["why"])
    if n.get("critical_collectives_ms") is not None:
        said = re.search(r"shorten a step by ([\d,.]+) ms at most", why)  # the figure rounded from its own digits
        assert said is not None and float(said[1].replace(",", "")) == pytest.approx(
            n["critical_collectives_ms"], abs=0.005 + MS_ROUNDING)
    assert f"exposed collectives {n['exposed_ms']:,.2f} ms" in why
    if path == GLOO_DDP:  # every all-reduce once, with its size: two signatures, no untunable ones
        assert len(rows) == 2 and "no recorded message size" not in err
        assert "there is no measured NCCL step" not in err
        assert summary["replay"]["steps"] == len(steps) == 4


# ---- the reader ------------------------------------------------------------------------------


def test_gloo_ddp_reads_each_all_reduce_once_at_gloos_worker_span_waited_for_by_the_caller():
    from traces.kineto import read_trace

    for w in read_trace(str(GLOO_DDP)):
        assert len(w.collectives) == 10 and {c.name for c in w.collectives} == {"gloo:all_reduce"}
        assert sorted(c.message_bytes for c in w.collectives) == [262_400] * 5 + [2_101_248] * 5
        graph = w.exec_graph
        assert graph is not None
        main = {s.thread for s in graph.steps}
        assert len(main) == 1  # every step on the caller's thread, which launches every all-reduce
        assert {graph.launches[c.op_id].thread for c in w.collectives} == main
        waits = [s for s in graph.syncs if s.kind == "c10d work wait"]
        assert len(waits) >= 4 and {s.thread for s in waits} == main  # DDP's end of backward, once a step


def test_hand_overs_pair_in_queue_order_however_deep_the_queue():
    """100 all-reduces queued before gloo's workers start the first (an async loop of
    ``dist.all_reduce(..., async_op=True)``): each pairs with its own span, in order, and a
    span of another size or another collective is never taken."""
    from traces.kineto_comm import cpu_call_nest, issuing_calls
    from traces.kineto_events import CommCall

    main, worker = (1, 1), (1, 2)
    dims = {"Input Dims": [[1024]], "Input type": ["float"]}
    calls = [CommCall(float(t), t + 0.5, "c10d::allreduce_", {}, main) for t in range(100)]
    spans = [CommCall(1000.0 + 10 * t, 1005.0 + 10 * t, "gloo:all_reduce", dims, worker) for t in range(100)]
    other = [CommCall(999.0, 999.5, "gloo:broadcast", dims, worker),
             CommCall(999.6, 999.9, "gloo:all_reduce", {"Input Dims": [[8]], "Input type": ["float"]}, worker)]
    sized = CommCall(0.2, 0.3, "c10d::allreduce_", dims, main)  # one hand-over that records its size
    nests = [cpu_call_nest(c, [c]) for c in [*calls, *spans, *other, sized]]
    pairs = issuing_calls(nests)
    assert len(pairs) == 101
    # in the order they were called: the first (no size) takes the first all-reduce span, of 8
    # elements; the sized one at 0.2 the next, of its size; then the rest in turn
    got = [nests[pairs[i]].outer.ts for i in range(100)]
    assert got[0] == 999.6 and got[1:] == [1010.0 + 10 * t for t in range(99)]
    assert nests[pairs[len(nests) - 1]].outer.ts == 1000.0
