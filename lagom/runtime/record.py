"""``lagom record`` inside each rank: profile a window of training steps, and time the steps before it.

The launcher (:mod:`lagom.runtime.record_launch`) writes the run's settings
(:class:`RecordSettings`) and points ``LAGOM_RECORD`` at them; the bootstrap
(:mod:`lagom.runtime.bootstrap`) calls :func:`install` once ``torch.optim.optimizer`` is
imported. As under ``lagom run --online``, every ``optimizer.step()`` is a step
boundary (torch's global ``register_optimizer_step_post_hook``), or
:func:`lagom.runtime.step` in a job without a torch optimizer; boundary ``b`` ends step
``b`` (steps count from 0). :class:`StepWindow` says what each boundary does:

- steps ``0 .. skip-1``: nothing (the job's own warm-up: allocator, autotuning, NCCL's
  connections);
- the next ``timed`` steps: timed without the profiler (host clock, and CUDA events on
  the current stream when the job uses CUDA);
- the next ``warmup`` steps: the profiler runs but keeps nothing (its own warm-up);
- the next ``active`` steps: recorded, and timed on the same clocks.

Each boundary takes two marks, the end of the step before Lagom's own work and the
start of the next one after it, so neither the profiler's start nor its per-step call
is counted in a step. At the last boundary the step times are read (one wait for the
last CUDA event), written with the NCCL version and variables into the trace's
``lagomRecord`` metadata (docs/record.md), and the profiler saves the trace to
``<out>/rank-<R>.json.gz`` (written under another name, then renamed: a folder never
holds half a trace). Each rank writes a small part for the launcher at exit
(:func:`part_path`): steps seen, the file, the step times.

Failure policy: anything that goes wrong here stops the recording in this rank, with
one warning line; the job itself runs on untouched.
"""

from __future__ import annotations

import contextlib
import enum
import gzip
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lagom.runtime.env import ENV_RECORD
from lagom.runtime.step_hook import StepHook
from nccl_env.errors import LagomError

RECORD_PART_DIR = "record-parts"  # in the run folder: one JSON per rank, read by the launcher
JOB_KEY = "lagom/record/job_id"  # in the default group's store: rank 0's job id, read by every rank
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")  # the variables written into the trace as the ones in force
GZIP_LEVEL = 6  # gzip's own default: a 300 MB trace in seconds, not the tens level 9 takes


class Phase(enum.Enum):
    SKIP = "skip"
    TIMED = "timed"
    WARMUP = "warmup"
    ACTIVE = "active"
    DONE = "done"


@dataclass(frozen=True)
class StepWindow:
    """Which steps are skipped, timed without the profiler, the profiler's warm-up, recorded."""

    skip: int = 10
    timed: int = 5
    warmup: int = 2
    active: int = 5

    def check(self) -> StepWindow:
        """LagomError (one line) for a window that cannot be recorded; else self."""
        if self.skip < 1:
            raise LagomError(f"--skip {self.skip}: at least 1 (step 0 has no boundary before it to time it from)")
        for name in ("timed", "warmup"):
            if getattr(self, name) < 0:
                raise LagomError(f"--{name} {getattr(self, name)}: must be 0 or more")
        if self.active < 1:
            raise LagomError(f"--active {self.active}: at least 1 step to record")
        return self

    @property
    def first_active(self) -> int:
        return self.skip + self.timed + self.warmup

    @property
    def last(self) -> int:
        """The last recorded step; its boundary saves the trace."""
        return self.first_active + self.active - 1

    @property
    def steps_needed(self) -> int:
        return self.last + 1

    def phase(self, step: int) -> Phase:
        if step < self.skip:
            return Phase.SKIP
        if step < self.skip + self.timed:
            return Phase.TIMED
        if step < self.first_active:
            return Phase.WARMUP
        if step <= self.last:
            return Phase.ACTIVE
        return Phase.DONE

    def describe(self) -> str:
        """One clause for the launcher's lines: which steps are what (steps count from 0)."""
        timed = (f"steps {self.skip}-{self.skip + self.timed - 1} timed without the profiler, " if self.timed
                 else "no step timed without the profiler, ")
        return (f"{timed}steps {self.first_active}-{self.last} recorded after {self.warmup} profiler warm-up "
                f"step{'s' if self.warmup != 1 else ''}")


@dataclass(frozen=True)
class RecordSettings:
    """What the launcher tells every rank (JSON in the run folder)."""

    out_dir: str
    run_dir: str
    job_id: str  # the launcher's; rank 0's wins across nodes (through the store)
    skip: int
    timed: int
    warmup: int
    active: int

    @property
    def window(self) -> StepWindow:
        return StepWindow(self.skip, self.timed, self.warmup, self.active)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self), indent=1))
        return path

    @classmethod
    def read(cls, path: str | os.PathLike) -> RecordSettings:
        return cls(**json.loads(Path(path).read_text()))


def trace_name(rank: int) -> str:
    return f"rank-{rank}.json.gz"


def part_path(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / RECORD_PART_DIR / f"rank-{rank}.json"


@dataclass
class StepMarks:
    """Two marks per boundary on the host clock and, when the job uses CUDA, as CUDA events."""

    cuda: bool
    end_ns: dict[int, int] = field(default_factory=dict)  # boundary -> host time at the step's end
    start_ns: dict[int, int] = field(default_factory=dict)  # boundary -> host time the next step starts
    end_events: dict[int, object] = field(default_factory=dict)
    start_events: dict[int, object] = field(default_factory=dict)

    def end(self, boundary: int) -> None:
        self.end_ns[boundary] = time.perf_counter_ns()
        if self.cuda:
            self.end_events[boundary] = _event()

    def start(self, boundary: int) -> None:
        if self.cuda:
            self.start_events[boundary] = _event()
        self.start_ns[boundary] = time.perf_counter_ns()

    def host_us(self, steps: range) -> list[float]:
        return [(self.end_ns[s] - self.start_ns[s - 1]) / 1e3 for s in steps]

    def device_us(self, steps: range) -> list[float]:
        """After the last end event has completed (one wait, at the window's end)."""
        if not self.cuda or not steps:
            return []
        self.end_events[steps[-1]].synchronize()  # type: ignore[attr-defined]  # a torch.cuda.Event
        return [self.start_events[s - 1].elapsed_time(self.end_events[s]) * 1e3  # type: ignore[attr-defined]
                for s in steps]


def _event():
    import torch

    event = torch.cuda.Event(enable_timing=True)
    event.record()  # on the current stream: the job's compute stream
    return event


class Recorder:
    """One rank's recording (see the module doc)."""

    def __init__(self, settings: RecordSettings, emit) -> None:
        self.settings = settings
        self.window = settings.window
        self.emit = emit
        self.step = 0  # the step the next boundary ends
        self.explicit = False
        self.finished = False
        self.marks: StepMarks | None = None
        self.profiler = None
        self.sync_events = False
        self.file: str | None = None
        self.error: str | None = None
        self.recorded: dict | None = None

    # ------------------------------------------------------------------ boundaries
    def boundary(self) -> None:
        if self.finished:
            return
        b = self.step
        self.step += 1
        try:
            self._boundary(b)
        except Exception as exc:  # noqa: BLE001 - the job must never fail for Lagom's recording
            self._fail(exc)

    def _boundary(self, b: int) -> None:
        """Boundary ``b``: step ``b`` ends, step ``b + 1`` starts."""
        ending, starting = self.window.phase(b), self.window.phase(b + 1)
        if starting is Phase.SKIP:
            return
        if self.marks is None:
            import torch

            self.marks = StepMarks(cuda=bool(torch.cuda.is_available() and torch.cuda.is_initialized()))
        marks = self.marks
        marks.end(b)
        if ending in (Phase.SKIP, Phase.TIMED) and starting in (Phase.WARMUP, Phase.ACTIVE):
            self.profiler = self._start_profiler()
        elif starting is Phase.DONE:
            self._save()
            return
        elif self.profiler is not None:
            self.profiler.step()
        marks.start(b)

    # ------------------------------------------------------------------ the profiler
    def _start_profiler(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        config, self.sync_events, missing = _experimental_config()
        if missing and _rank() == 0:
            self.emit(f"lagom: note: this torch ({torch.__version__}) has no {missing}: the trace has no cuda_sync "
                      "events, so the replay infers cross-stream waits from the order of launches")
        w = self.window
        profiler = profile(activities=activities, schedule=schedule(wait=0, warmup=w.warmup, active=w.active,
                                                                    repeat=1),
                           on_trace_ready=self._write_trace, record_shapes=True, with_stack=False,
                           experimental_config=config)
        profiler.start()
        return profiler

    def _save(self) -> None:
        """At the last recorded step's end: the step times and the environment into the metadata, then save."""
        w = self.window
        marks = self.marks
        assert marks is not None and self.profiler is not None
        timed = range(w.skip, w.skip + w.timed)
        active = range(w.first_active, w.last + 1)
        host = {"unprofiled": marks.host_us(timed), "profiled": marks.host_us(active)}
        device = {"unprofiled": marks.device_us(timed), "profiled": marks.device_us(active)}
        self.recorded = {
            "format": "lagom.record",
            "version": 1,
            "job_id": _job_id(self.settings.job_id),
            "clock": "cuda_events" if marks.cuda else "host",
            "window": {**asdict(w), "first_profiled_step": w.first_active},
            "step_time_us": {phase: {"host": host[phase], **({"device": device[phase]} if marks.cuda else {})}
                             for phase in ("unprofiled", "profiled")},
            "nccl_version": _nccl_version(),
            "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
            "cuda_sync_events": self.sync_events,
            "torch": _torch_version(),
        }
        from traces.workload import RECORD_METADATA_KEY

        self.profiler.add_metadata_json(RECORD_METADATA_KEY, json.dumps(self.recorded))
        self.profiler.step()  # past the last active step: the profiler stops and calls _write_trace
        self.profiler.stop()
        self.finished = True
        if self.file is None and self.error is None:
            self.error = "the profiler saved no trace"

    def _write_trace(self, profiler) -> None:
        """on_trace_ready: export, gzip into the folder under a name the reader skips, rename."""
        rank = _rank()
        out = Path(self.settings.out_dir)
        plain = Path(self.settings.run_dir) / f"trace-rank-{rank}.json"
        final = out / trace_name(rank)
        partial = out / f".{trace_name(rank)}.partial"
        try:
            profiler.export_chrome_trace(str(plain))
            with plain.open("rb") as src, gzip.open(partial, "wb", compresslevel=GZIP_LEVEL) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(partial, final)
            self.file = str(final)
        except OSError as exc:
            self.error = f"cannot write {final}: {exc.strerror or exc}"
            with contextlib.suppress(OSError):
                partial.unlink()
        finally:
            with contextlib.suppress(OSError):
                plain.unlink()

    def _fail(self, exc: BaseException) -> None:
        self.finished = True
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.error = f"{type(exc).__name__}: {first}"
        self.emit(f"lagom: warning (rank {_rank()}): recording stopped ({self.error}); the job runs on")
        if self.profiler is not None:
            with contextlib.suppress(Exception):
                self.profiler.stop()

    # ------------------------------------------------------------------ exit
    def write_part(self) -> None:
        """At exit: what this rank did, for the launcher (never raises). A process that saw no step
        boundary writes nothing: torchrun's own launcher imports torch.optim too."""
        if self.step == 0 and self.error is None:
            return
        try:
            part = {"rank": _rank(), "steps": self.step, "file": self.file, "error": self.error,
                    "recorded": self.recorded, "local_ranks": _local_ranks()}
            path = part_path(self.settings.run_dir, _rank())
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(part))
        except Exception as exc:  # noqa: BLE001 - exit paths must never raise
            self.emit(f"lagom: warning: record part not written ({type(exc).__name__}: {exc})")


def _experimental_config():
    """(config, cuda_sync_events on, what is missing or ''): the sync events where this torch has them, and
    ``trace_only`` (no Python event objects built at the profiler's stop) where it has that too."""
    from torch.profiler import _ExperimentalConfig

    for options in ({"enable_cuda_sync_events": True, "trace_only": True}, {"enable_cuda_sync_events": True}):
        try:
            return _ExperimentalConfig(**options), True, ""
        except TypeError:
            continue
    return None, False, "_ExperimentalConfig(enable_cuda_sync_events=True)"


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    value = os.environ.get("RANK", "0")
    return int(value) if value.isdigit() else 0


def _local_ranks() -> int:
    """How many ranks this node runs (torchrun's LOCAL_WORLD_SIZE; else the job's size, else 1): the
    launcher calls a recording complete when that many traces are there."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    if value.isdigit():
        return int(value)
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _job_id(own: str) -> str:
    """Rank 0's job id, through the default group's store (no collective: the job's own are untouched)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return own
    import torch.distributed.distributed_c10d as c10d

    store = c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set(JOB_KEY, own)
        return own
    return store.get(JOB_KEY).decode()


def _nccl_version() -> str | None:
    """The NCCL the job's default group runs, or None (gloo, or a torch without NCCL)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or "nccl" not in str(dist.get_backend()):
        return None
    try:
        return ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a torch without NCCL: the version stays unknown
        return None


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


# The job's recorder (step_hook.listener) and the optimizer hook that drives it (as online.step_hook).
step_hook: StepHook[Recorder] = StepHook()


def install(emit) -> Recorder | None:
    """Register the optimizer step hook when ``LAGOM_RECORD`` names the run's settings."""
    path = os.environ.get(ENV_RECORD)
    if not path:
        return None
    import atexit

    recorder = step_hook.install(Recorder(RecordSettings.read(path), emit))
    atexit.register(recorder.write_part)
    return recorder


def emit_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
