"""The paired-trace generator (tests/kineto_world.py) keeps its world's rules.

The rules are checked on the traces it writes, read here as plain JSON (not through the
generator's records), so the simulation and the writer are held to the same account:
every GPU op's start has a cause the trace shows, syncs return after what they awaited,
the main thread is silent while the autograd thread works. Lagom's reader is used only
to check the format (op counts, sizes, steps).
"""

from __future__ import annotations

import ast
import gzip
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import kineto_world as kw
import pytest

from nccl_env.knobs import CollectiveType

EPS_US = 0.002  # the trace's times are rounded to the nanosecond


class Trace:
    """A written trace, indexed the way the checks below need it."""

    def __init__(self, path: Path) -> None:
        self.doc = json.loads(gzip.decompress(path.read_bytes()))
        ev = [e for e in self.doc["traceEvents"] if e.get("ph") == "X"]
        self.gpu = sorted((e for e in ev if e["cat"] in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
        self.calls = sorted((e for e in ev if e["cat"] == "cuda_runtime"), key=lambda e: e["ts"])
        self.syncs = [e for e in ev if e["cat"] == "cuda_sync"]
        self.cpu = [e for e in ev if e["cat"] in ("cpu_op", "user_annotation")]
        self.steps = sorted((e for e in self.cpu if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
        self.call_by_corr = {e["args"]["correlation"]: e for e in self.calls}
        self.flows = [e for e in self.doc["traceEvents"] if e.get("cat") == "fwdbwd"]

    def launch(self, op: dict) -> dict | None:
        return self.call_by_corr.get(op["args"]["correlation"])

    def launched_before(self, stream: int, t: float) -> list[dict]:
        """GPU ops on ``stream`` whose launch call started before ``t`` (stream order)."""
        return [op for op in self.gpu if op["tid"] == stream and (c := self.launch(op)) is not None and c["ts"] < t]


def end(e: dict) -> float:
    return e["ts"] + e["dur"]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Trace]:
    folder = tmp_path_factory.mktemp("world")
    return {name: Trace(kw.write_trace(kw.simulate(p), folder / f"{name}.json.gz")) for name, p in kw.SCENARIOS.items()}


def test_the_generator_imports_nothing_of_lagom():
    tree = ast.parse(Path(kw.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_every_gpu_start_has_a_cause_in_the_trace(traces):
    """Stream order, launch latency and event waits: an op starts after its launch, never
    overlaps its stream predecessor, and one that starts later than a launch explains
    (20 us) starts exactly when its stream predecessor or an op it waited on ended."""
    for name, tr in traces.items():
        ends_by_stream: dict[int, list[float]] = defaultdict(list)
        for op in tr.gpu:
            ends_by_stream[op["tid"]].append(end(op))
        all_ends = sorted(end(op) for op in tr.gpu)
        late = 0
        for stream in ends_by_stream:
            ops = [op for op in tr.gpu if op["tid"] == stream]
            for before, after in zip(ops, ops[1:]):
                assert after["ts"] >= end(before) - EPS_US, (name, after["name"])
        for op in tr.gpu:
            call = tr.launch(op)
            if call is None:
                continue
            assert op["ts"] > call["ts"], (name, op["name"])  # a launch returns before its op runs
            if op["ts"] - call["ts"] > 20.0:
                late += 1
                assert any(abs(e - op["ts"]) <= EPS_US for e in all_ends), (name, op["name"], op["ts"])
        assert late > 0, name  # some ops did wait


def test_stream_waits_hold_the_consumer_until_the_recorded_op_ends(traces):
    for name in ("cpu_ahead", "comm_bound", "mixed", "cpu_paced"):
        tr = traces[name]
        waits = [s for s in tr.syncs if s["name"] == "Stream Wait Event"]
        assert len(waits) == sum(c["name"] == "cudaStreamWaitEvent" for c in tr.calls), name
        checked = 0
        for w in waits:
            a = w["args"]
            record = tr.call_by_corr[a["wait_on_cuda_event_record_corr_id"]]
            call = tr.call_by_corr[a["correlation"]]
            produced = tr.launched_before(a["wait_on_stream"], record["ts"])
            consumers = [op for op in tr.gpu if op["tid"] == a["stream"] and (c := tr.launch(op)) is not None
                         and c["ts"] > call["ts"]]
            if produced and consumers:
                assert consumers[0]["ts"] >= end(produced[-1]) - EPS_US, (name, consumers[0]["name"])
                checked += 1
        assert checked > 20, name
    # without cuda_sync events only the runtime calls remain
    tr = traces["mixed_nosync_events"]
    assert not tr.syncs
    assert {"cudaEventRecord", "cudaStreamWaitEvent"} <= {c["name"] for c in tr.calls}


def test_host_syncs_return_after_what_they_waited_for_and_the_thread_moves_with_them(traces):
    seen: set[str] = set()
    for name, tr in traces.items():
        by_thread: dict[int, list[dict]] = defaultdict(list)
        for c in tr.calls:
            by_thread[c["tid"]].append(c)
        for c in tr.calls:
            if c["name"] == "cudaStreamSynchronize":
                awaited = tr.launched_before(kw.COMPUTE, c["ts"])
            elif c["name"] == "cudaDeviceSynchronize":
                awaited = [op for op in tr.gpu if (x := tr.launch(op)) is not None and x["ts"] < c["ts"]]
            elif c["name"] == "cudaEventSynchronize":  # the loss copy of the step before
                copies = [op for op in tr.launched_before(kw.COMPUTE, c["ts"]) if "Device -> Pinned" in op["name"]]
                awaited = copies[-2:-1]
            elif c["name"] == "cudaMemcpyAsync" and any("Pageable" in op["name"] for op in tr.gpu
                                                         if op["args"]["correlation"] == c["args"]["correlation"]):
                awaited = [op for op in tr.gpu if op["args"]["correlation"] == c["args"]["correlation"]]
            else:
                continue
            if not awaited:
                continue
            seen.add(c["name"])
            assert end(c) >= max(end(op) for op in awaited) - EPS_US, (name, c["name"], c["ts"])
            later = [x for x in by_thread[c["tid"]] if x["ts"] > c["ts"]]
            if later:
                assert later[0]["ts"] >= end(c) - EPS_US, (name, c["name"])
    assert seen == {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpyAsync"}


def test_the_main_thread_is_silent_while_the_autograd_thread_runs_the_backward(traces):
    for name, program in kw.SCENARIOS.items():
        tr = traces[name]
        threads = {e["tid"] for e in tr.calls}
        if program.launch_threads == 1:
            assert threads == {kw.MAIN}, name
            continue
        assert threads == {kw.MAIN, kw.AUTOGRAD}, name
        main = [e for e in tr.cpu + tr.calls if e["tid"] == kw.MAIN and not e["name"].startswith(("ProfilerStep",
                                                                                                   "FullyShard"))]
        bwd = [e for e in tr.cpu if e["tid"] == kw.AUTOGRAD and e["name"].startswith("autograd::engine")]
        assert len(bwd) == program.steps * (1 + 5 * program.layers), name
        # one backward per step: from its first to its last op nothing happens on the main thread
        for step in tr.steps:
            inside = [e for e in tr.cpu + tr.calls if e["tid"] == kw.AUTOGRAD and step["ts"] <= e["ts"] < end(step)]
            lo, hi = min(e["ts"] for e in inside), max(end(e) for e in inside)
            assert not [e for e in main if lo <= e["ts"] < hi or lo < end(e) <= hi], (name, step["name"])
        # the fwdbwd flows pair a forward op on the main thread with its backward op
        starts = {f["id"]: f for f in tr.flows if f["ph"] == "s"}
        finishes = [f for f in tr.flows if f["ph"] == "f"]
        assert len(finishes) == program.steps * (1 + 5 * program.layers), name
        assert all(starts[f["id"]]["tid"] == kw.MAIN and f["tid"] == kw.AUTOGRAD
                   and starts[f["id"]]["ts"] < f["ts"] for f in finishes), name


def test_the_recorded_window_follows_kinetos_rules(traces):
    for name, tr in traces.items():
        first = tr.steps[0]["ts"]
        assert min(e["ts"] for e in tr.cpu + tr.calls + tr.gpu) >= first - EPS_US, name
        assert len(tr.steps) == kw.SCENARIOS[name].steps, name
    # far ahead, the CPU starts the window while the GPU still runs the warm-up steps' work
    tr = traces["cpu_ahead_nosync"]
    orphans = [op for op in tr.gpu if tr.launch(op) is None]
    assert len(orphans) > 50
    first_launched = min((op for op in tr.gpu if tr.launch(op) is not None), key=lambda op: op["ts"])
    assert all(op["ts"] < first_launched["ts"] for op in orphans)
    assert not [op for op in traces["cpu_paced"].gpu if traces["cpu_paced"].launch(op) is None]


def test_the_truth_is_the_gpu_period_read_from_the_trace(tmp_path):
    """Re-read from the written trace: first GPU op launched in each ProfilerStep."""
    for name in ("cpu_ahead_nosync", "mixed", "cpu_paced_1thread"):
        run = kw.simulate(kw.SCENARIOS[name], comm=0.63, seed=3)
        tr = Trace(kw.write_trace(run, tmp_path / f"{name}.json.gz"))
        firsts = []
        for step in tr.steps:
            ops = [(c["ts"], op["ts"]) for op in tr.gpu if (c := tr.launch(op)) is not None
                   and step["ts"] <= c["ts"] < end(step)]
            firsts.append(min(ops)[1])
        truth = kw.truth(run)
        assert [s.name for s in truth.steps] == [s["name"] for s in tr.steps[:-1]]
        for s, a, b in zip(truth.steps, firsts, firsts[1:]):
            assert s.iteration_us == pytest.approx(b - a, abs=2 * EPS_US), name


def test_comm_factor_scales_every_collective_and_nothing_else():
    program = kw.SCENARIOS["mixed"]
    base = kw.simulate(program, seed=1)
    for factor in (0.5, 3.6):
        scaled = kw.simulate(program, comm=factor, seed=1)
        assert [op.work.kernel for op in scaled.ops] == [op.work.kernel for op in base.ops]
        for a, b in zip(base.ops, scaled.ops):
            ratio = (b.end_us - b.start_us) / (a.end_us - a.start_us)
            assert ratio == pytest.approx(factor if a.is_comm else 1.0, rel=1e-9)
        gaps = [x.us for x in kw.build(program, 1)[kw.MAIN] if x.kind == "cpu"]
        assert gaps == [x.us for x in kw.build(program, 1)[kw.MAIN] if x.kind == "cpu"]  # drawn once per seed
    compute = kw.simulate(program, compute=2.0, seed=1)
    for a, b in zip(base.ops, compute.ops):
        kernel = a.work.kernel is not None and not a.is_comm
        assert (b.end_us - b.start_us) / (a.end_us - a.start_us) == pytest.approx(2.0 if kernel else 1.0)


def test_paired_traces_differ_only_by_the_factor(tmp_path):
    first, second, truth = kw.paired(kw.SCENARIOS["comm_bound"], tmp_path, comm=1.0)
    assert first.read_bytes() == second.read_bytes()  # F = 1 reruns the same world
    assert truth.change == 0.0
    first, second, truth = kw.paired(kw.SCENARIOS["comm_bound"], tmp_path, comm=2.0, seed=5)
    a, b = Trace(first), Trace(second)
    durations = {op["args"]["correlation"]: op for op in a.gpu}
    pairs = [(durations[op["args"]["correlation"]], op) for op in b.gpu if op["args"]["correlation"] in durations]
    assert len(pairs) > 0.9 * len(a.gpu)
    for x, y in pairs:
        assert x["name"] == y["name"]
        assert y["dur"] == pytest.approx((2 if x["name"].startswith("nccl") else 1) * x["dur"], abs=2 * EPS_US)
    assert truth.change > 0.5
    for run in (truth.first, truth.second):
        assert all(0 < s.exposed_comm_us <= s.comm_us < s.iteration_us for s in run.steps)


def test_the_regimes_are_what_they_claim():
    runs = {name: kw.truth(kw.simulate(p)) for name, p in kw.SCENARIOS.items()}
    for name in ("cpu_ahead", "cpu_ahead_nosync"):
        assert runs[name].gpu_busy_pct >= 96.0 and runs[name].launch_bound_pct < 1.0, name
    for name in ("cpu_paced", "cpu_paced_1thread"):
        assert runs[name].gpu_busy_pct < 70.0 and runs[name].launch_bound_pct > 50.0, name
    for name in ("mixed", "mixed_1thread", "mixed_nosync_events"):  # the GPU idles part of the step
        assert 90.0 < runs[name].gpu_busy_pct < 97.0, name
    for name in ("comm_bound", "comm_bound_1thread"):  # exposed collectives, a busy GPU
        run = runs[name]
        assert run.gpu_busy_pct > 98.0, name
        assert sum(s.exposed_comm_us for s in run.steps) > 0.25 * sum(s.iteration_us for s in run.steps), name
    # faster collectives help the GPU-bound case, not the CPU-paced one
    mixed = kw.PairTruth(runs["comm_bound"], kw.truth(kw.simulate(kw.SCENARIOS["comm_bound"], comm=0.5)))
    paced = kw.PairTruth(runs["cpu_paced"], kw.truth(kw.simulate(kw.SCENARIOS["cpu_paced"], comm=0.5)))
    assert mixed.change < -0.15 and abs(paced.change) < 1e-3


def test_a_cpu_that_would_fill_the_launch_queue_is_refused():
    with pytest.raises(ValueError, match="launches pending"):
        kw.simulate(replace(kw.SCENARIOS["cpu_ahead_nosync"], warmup_steps=12, cpu_op_us=5.0))


def test_lagom_reads_the_traces_with_their_ops_sizes_and_steps(tmp_path, capsys):
    from lagom.cli import main
    from traces.kineto import read_trace

    for name in ("cpu_ahead_nosync", "comm_bound_1thread"):
        program = kw.SCENARIOS[name]
        run = kw.simulate(program)
        path = kw.write_trace(run, tmp_path / f"{name}.json.gz")
        lo, hi = run.window
        recorded = [op for op in run.ops if lo <= op.start_us and op.end_us <= hi]
        (w,) = read_trace(path)
        assert len(w.collectives) == sum(op.is_comm for op in recorded), name
        assert len(w.compute_ops) == sum(not op.is_comm for op in recorded), name
        assert len(w.profiler_steps) == program.steps, name
        assert {c.message_bytes for c in w.collectives} == {2 * program.layer_params}, name
        gathers = sum(op.work.kernel is kw.ALL_GATHER for op in recorded)
        assert [c.collective for c in w.collectives].count(CollectiveType.ALLGATHER) == gathers > 0, name
        assert w.world_size == 8 and w.device_name == kw.A100["name"], name
        assert main(["analyze", str(path), "--json"]) == 0
        (rank,) = json.loads(capsys.readouterr().out)["ranks"]
        rows = {c["collective"]: c for c in rank["collectives"]}
        assert rows["allgather"]["message_bytes"] == rows["reducescatter"]["message_bytes"] == 2 * program.layer_params
        assert rows["allgather"]["group_size"] == 8
