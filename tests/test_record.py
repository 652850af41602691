"""`lagom record`'s parts, each on real inputs: the step window, a recording made in this
process on a real 1-rank gloo group with torch's profiler (the file, its window, its
metadata, what the reader makes of it), the output folder's checks, the one-job rule.
The whole command around torchrun: tests/test_record_e2e.py."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sys
from pathlib import Path
from statistics import fmean

import pytest

from lagom.reports.record_overhead import overhead_line, profiler_overhead
from lagom.runtime import record
from lagom.runtime.record import Phase, RecordSettings, StepWindow
from lagom.runtime.record_launch import MARKER, check_out_dir, launch_record, prepare_record, report
from nccl_env.errors import LagomError
from traces.kineto import read_trace
from traces.workload import RECORD_METADATA_KEY

torch = pytest.importorskip("torch")


def test_the_window_skips_times_warms_up_then_records_in_that_order():
    w = StepWindow(skip=3, timed=2, warmup=1, active=4)
    phases = [w.phase(s) for s in range(12)]
    assert phases == [Phase.SKIP] * 3 + [Phase.TIMED] * 2 + [Phase.WARMUP] + [Phase.ACTIVE] * 4 + [Phase.DONE] * 2
    assert (w.first_active, w.last, w.steps_needed) == (6, 9, 10)
    assert w.describe() == "steps 3-4 timed without the profiler, steps 6-9 recorded after 1 profiler warm-up step"
    bare = StepWindow(skip=1, timed=0, warmup=0, active=1)
    assert [bare.phase(s) for s in range(3)] == [Phase.SKIP, Phase.ACTIVE, Phase.DONE]
    assert bare.describe().startswith("no step timed without the profiler, steps 1-1 recorded")


@pytest.mark.parametrize("window, message", [
    (StepWindow(skip=0), "--skip 0: at least 1"),
    (StepWindow(timed=-1), "--timed -1: must be 0 or more"),
    (StepWindow(warmup=-2), "--warmup -2: must be 0 or more"),
    (StepWindow(active=0), "--active 0: at least 1"),
])
def test_a_window_that_cannot_be_recorded_is_one_line(window, message):
    with pytest.raises(LagomError) as info:
        window.check()
    assert message in str(info.value) and "\n" not in str(info.value)


def _record_in_process(tmp_path: Path, window: StepWindow, steps: int, explicit: bool = False) -> record.Recorder:
    """Train a small model ``steps`` steps on the 1-rank gloo group, recorded by a Recorder."""
    out, run = tmp_path / "out", tmp_path / "run"
    out.mkdir()
    run.mkdir()
    settings = RecordSettings(str(out), str(run), "job-a", window.skip, window.timed, window.warmup, window.active)
    return _train(record.Recorder(settings, lambda line: None), steps)


def _train(recorder: record.Recorder, steps: int) -> record.Recorder:
    import torch.distributed as dist

    model = torch.nn.Linear(32, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        recorder.boundary()  # what the optimizer step hook (or lagom.runtime.step()) does
    return recorder


def _load(path: Path) -> dict:
    with gzip.open(path) as f:
        return json.load(f)


def test_a_recording_holds_the_window_its_step_times_and_the_environment(world, tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    window = StepWindow(skip=2, timed=3, warmup=1, active=4)
    recorder = _record_in_process(tmp_path, window, steps=window.steps_needed + 3)
    assert recorder.finished and recorder.error is None
    assert recorder.step == window.steps_needed  # no boundary is counted once the trace is saved
    assert os.listdir(tmp_path / "out") == ["rank-0.json.gz"]  # no partial file left behind
    doc = _load(tmp_path / "out" / "rank-0.json.gz")
    steps = sorted({e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert len(steps) == window.active  # the warm-up step is not in the trace
    assert doc["record_shapes"] == 1 and "with_stack" not in doc  # shapes (collective sizes), no stacks
    meta = doc[RECORD_METADATA_KEY]
    assert meta["job_id"] == "job-a" and meta["clock"] == "host"
    assert meta["window"] == {"skip": 2, "timed": 3, "warmup": 1, "active": 4, "first_profiled_step": 6}
    times = meta["step_time_us"]
    assert len(times["unprofiled"]["host"]) == 3 and len(times["profiled"]["host"]) == 4
    assert all(t > 0 for phase in times.values() for t in phase["host"]) and "device" not in times["profiled"]
    assert meta["nccl_env"]["NCCL_ALGO"] == "Ring" and meta["nccl_env"]["TORCH_NCCL_BLOCKING_WAIT"] == "1"
    assert all(k.startswith(("NCCL_", "TORCH_NCCL_")) for k in meta["nccl_env"])
    assert meta["nccl_version"] is None  # a gloo group runs no NCCL
    try:
        torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        has_sync_events = True
    except TypeError:
        has_sync_events = False
    assert meta["cuda_sync_events"] is has_sync_events
    (workload,) = read_trace(tmp_path / "out")
    assert workload.recorded_steps is not None
    assert workload.recorded_steps.unprofiled_us == tuple(times["unprofiled"]["host"])
    assert workload.recorded_steps.profiled_us == tuple(times["profiled"]["host"])
    overhead = profiler_overhead([workload.recorded_steps])
    assert overhead is not None
    expected = fmean(times["profiled"]["host"]) / fmean(times["unprofiled"]["host"]) - 1
    assert overhead.fraction == pytest.approx(expected)
    assert overhead_line(overhead).startswith(f"profiler overhead: {expected:+.1%} (profiled step ")
    recorder.write_part()
    part = json.loads(record.part_path(tmp_path / "run", 0).read_text())
    assert part["file"] == str(tmp_path / "out" / "rank-0.json.gz") and part["steps"] == window.steps_needed


def test_a_job_that_ends_before_the_window_leaves_no_trace_and_a_process_without_steps_no_part(world, tmp_path):
    window = StepWindow(skip=2, timed=1, warmup=1, active=2)
    recorder = _record_in_process(tmp_path, window, steps=window.steps_needed - 1)
    assert not recorder.finished and recorder.file is None
    assert os.listdir(tmp_path / "out") == []
    recorder.write_part()
    assert json.loads(record.part_path(tmp_path / "run", 0).read_text())["steps"] == window.steps_needed - 1
    idle = record.Recorder(RecordSettings(str(tmp_path / "out"), str(tmp_path / "idle"), "j", 2, 1, 1, 2),
                           lambda line: None)
    idle.write_part()  # torchrun's own launcher imports torch.optim too: it must not write a rank-0 part
    assert not (tmp_path / "idle").exists()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")
def test_a_window_without_timed_or_warmup_steps_records_and_reports_no_overhead(world, tmp_path):
    window = StepWindow(skip=1, timed=0, warmup=0, active=2)
    recorder = _record_in_process(tmp_path, window, steps=window.steps_needed)
    assert recorder.file is not None and recorder.error is None
    times = _load(Path(recorder.file))[RECORD_METADATA_KEY]["step_time_us"]
    assert times["unprofiled"]["host"] == [] and len(times["profiled"]["host"]) == 2
    (workload,) = read_trace(tmp_path / "out")
    assert workload.recorded_steps is not None and profiler_overhead([workload.recorded_steps]) is None


def _relabel(src: Path, dst: Path, rank: int, world: int, job_id: str) -> None:
    doc = _load(src)
    doc["distributedInfo"].update(rank=rank, world_size=world)
    doc[RECORD_METADATA_KEY]["job_id"] = job_id
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)


def test_the_reader_refuses_a_folder_mixing_two_recorded_jobs(world, tmp_path):
    window = StepWindow(skip=1, timed=1, warmup=1, active=2)
    _record_in_process(tmp_path, window, steps=window.steps_needed)
    one = tmp_path / "one"
    one.mkdir()
    trace = tmp_path / "out" / "rank-0.json.gz"
    _relabel(trace, one / "rank-0.json.gz", 0, 2, "job-a")
    _relabel(trace, one / "rank-1.json.gz", 1, 2, "job-a")
    assert [w.rank for w in read_trace(one)] == [0, 1]
    _relabel(trace, one / "rank-1.json.gz", 1, 2, "job-b")
    with pytest.raises(LagomError, match="traces of different jobs \\(lagom record job job-a and job-b\\)"):
        read_trace(one)


def test_the_output_folder_is_checked_before_the_job_starts(tmp_path):
    assert check_out_dir(tmp_path / "new" / "deeper") == [] and (tmp_path / "new" / "deeper").is_dir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(LagomError, match="is a file, expected a folder"):
        check_out_dir(a_file)
    with pytest.raises(LagomError, match="cannot create the folder"):
        check_out_dir(a_file / "sub")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "rank-0.json.gz").write_text("")  # a trace name, but no lagom record marker: not ours
    with pytest.raises(LagomError, match=r"holds files lagom record did not write \(rank-0.json.gz\)"):
        check_out_dir(theirs)
    if os.geteuid() != 0:  # root writes into a read-only folder anyway
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(LagomError, match="cannot write into the folder"):
            check_out_dir(locked)


def _recorded(out: Path, tmp_path: Path, status: int, steps: int = 4) -> list[str]:
    """One ``lagom record -o out`` of the 1-rank job (window 1+1+1+1) as the launcher runs it: prepared,
    recorded in this process into the fresh folder, reported as a job ending with ``status``."""
    setup = prepare_record(out, StepWindow(1, 1, 1, 1), ["true"], workdir=tmp_path / "run",
                           base_env={"PATH": os.environ["PATH"]})
    assert Path(setup.settings.out_dir).parent == out.resolve().parent  # beside the folder, not in it
    recorder = _train(record.Recorder(setup.settings, lambda line: None), steps)
    recorder.write_part()
    return report(setup, status)


def test_a_recording_replaces_only_the_files_its_manifest_lists_and_only_once_complete(world, tmp_path):
    out = tmp_path / "out"
    lines = _recorded(out, tmp_path, 0)
    assert any(line.startswith(f"lagom record: 1 rank trace(s) in {out}") for line in lines), lines
    assert sorted(os.listdir(out)) == [MARKER, "rank-0.json.gz"]
    assert "Trace: rank-0.json.gz" in (out / MARKER).read_text()
    first = (out / "rank-0.json.gz").read_bytes()
    assert [p.name for p in tmp_path.iterdir() if "lagom-record" in p.name] == []  # its fresh folder is gone
    # a user's own trace in the folder: refused before the job, their file and the recording untouched
    (out / "rank-7.json.gz").write_bytes(b"mine")
    with pytest.raises(LagomError, match=r"holds files lagom record did not write \(rank-7.json.gz\)"):
        prepare_record(out, StepWindow(1, 1, 1, 1), ["true"])
    assert (out / "rank-7.json.gz").read_bytes() == b"mine" and (out / "rank-0.json.gz").read_bytes() == first
    (out / "rank-7.json.gz").unlink()
    # the job fails: the earlier recording stays whole, the new traces are kept beside it and named
    lines = _recorded(out, tmp_path, 1)
    assert (out / "rank-0.json.gz").read_bytes() == first and sorted(os.listdir(out)) == [MARKER, "rank-0.json.gz"]
    (warning,) = [line for line in lines if "incomplete" in line]
    assert "the job failed (status 1)" in warning and "the earlier recording there is kept" in warning
    kept = Path(warning.rsplit(" are in ", 1)[1])
    assert os.listdir(kept) == ["rank-0.json.gz"]
    # a job shorter than the window: nothing recorded, nothing changed
    lines = _recorded(out, tmp_path, 0, steps=2)
    assert (out / "rank-0.json.gz").read_bytes() == first
    assert any("nothing recorded into" in line and "not every rank wrote its trace" in line for line in lines), lines
    # complete: it replaces the earlier one
    _recorded(out, tmp_path, 0)
    assert sorted(os.listdir(out)) == [MARKER, "rank-0.json.gz"] and (out / "rank-0.json.gz").read_bytes() != first
    assert read_trace(out)[0].rank == 0


def test_prepare_record_refuses_before_the_folder_is_made(tmp_path):
    out = tmp_path / "out"
    setup = prepare_record(out, StepWindow(), ["true"], workdir=tmp_path / "run", base_env={"PATH": os.environ["PATH"]})
    assert os.listdir(out) == []  # nothing in it until a recording is complete
    assert setup.env["LAGOM_RECORD"] and setup.env["PYTHONPATH"].startswith(str(tmp_path / "run" / "bootstrap"))
    assert Path(RecordSettings.read(setup.env["LAGOM_RECORD"]).out_dir) == setup.recording_dir
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LagomError, match=r"did not write \(notes.txt\)"):
        prepare_record(out, StepWindow(), ["true"])
    assert (out / "notes.txt").read_text() == "mine"
    shutil.rmtree(out)
    with pytest.raises(LagomError, match="command not found"):
        prepare_record(out, StepWindow(), ["no-such-command-lagom"])
    assert not out.exists()  # refused before the folder was made


def test_a_rerecord_whose_job_fails_keeps_the_earlier_recording(world, tmp_path, capsys):
    """Issue 24: ``lagom record -o DIR -- python trian.py`` (a typo: the job fails at once) removed the
    previous recording, then recorded nothing."""
    out = tmp_path / "out"
    _recorded(out, tmp_path, 0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    status = launch_record(out, [sys.executable, str(tmp_path / "trian.py")], StepWindow(1, 1, 1, 1))
    assert status != 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    err = capsys.readouterr().err
    assert f"nothing recorded into {out.resolve()} (the job failed (status {status}); the earlier recording there " \
           "is kept)" in err
    assert [p.name for p in tmp_path.iterdir() if "lagom-record" in p.name] == []


def test_a_negative_overhead_is_said_to_be_within_the_steps_noise():
    """A CPU job's timed steps ran slower than its profiled ones (-27.8%): a profiler cannot
    speed a job up, so the line says the overhead is within noise instead of printing a gain."""
    from traces.workload import RecordedSteps

    steps = RecordedSteps("host", unprofiled_us=(13_000.0, 9_800.0, 9_200.0), profiled_us=(7_300.0, 7_000.0, 7_500.0))
    overhead = profiler_overhead([steps])
    assert overhead is not None and overhead.fraction == pytest.approx(7_266.67 / 10_666.67 - 1, abs=1e-4)
    line = overhead_line(overhead)
    assert line.startswith("profiler overhead: -31.9% ") and "below zero" in line and "within the steps' noise" in line
    assert "up to 21.9% off its set's mean" in line  # 13,000 against the unprofiled mean 10,666.7
    assert overhead.to_dict()["within_noise"] is True
    paced = profiler_overhead([RecordedSteps("host", (10_000.0, 10_100.0), (12_000.0, 12_100.0))])
    assert paced is not None and not paced.within_noise and "paced this job" in overhead_line(paced)
