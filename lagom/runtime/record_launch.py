"""``lagom record``: start a job whose ranks each profile a window of steps into one folder.

Steps (the command's docstring in lagom/commands/record.py is the user-facing doc):

1. check the window (:meth:`lagom.runtime.record.StepWindow.check`) and the command;
2. check the output folder before anything starts
   (:func:`lagom.runtime.record_folder.check_out_dir`): it exists or can be created, it
   is writable, and it holds nothing but what its manifest lists; the ranks record into
   a fresh folder beside it;
3. lay out the run folder (``--workdir`` or a temporary one): the bootstrap shared with
   ``lagom run`` (:func:`lagom.runtime.launcher.write_bootstrap`) and the settings every
   rank reads (``LAGOM_RECORD``);
4. run the command (:func:`lagom.runtime.launcher.run_child`: own process group, signals
   forwarded, SIGKILL after the grace period, its exit status returned);
5. read the ranks' parts; a complete recording (the job succeeded, every rank wrote its
   trace) replaces the earlier one in the folder (:func:`lagom.runtime.record_folder.install`),
   an incomplete one leaves it as it was; say what was recorded: the files, the ranks
   that wrote none and why, the profiler's overhead. A job that succeeded but whose
   recording is not complete (a rank could not write its trace: a full disk, a file size
   limit; the job ended before the window) is a failure: one error line, exit
   :data:`RECORDING_FAILED_STATUS`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lagom.reports.record_overhead import overhead_line, profiler_overhead
from lagom.runtime import record
from lagom.runtime.env import ENV_RECORD
from lagom.runtime.launcher import check_command, kill_grace_s, run_child, write_bootstrap
from lagom.runtime.record_folder import MANIFEST, check_out_dir, install, new_recording_folder, recorded_traces
from nccl_env.errors import LagomError

MARKER = MANIFEST  # the folder's manifest: what lagom record put there (lagom.runtime.record_folder)
RECORDING_FAILED_STATUS = 1  # the job succeeded, the recording did not: nothing was put into the folder


@dataclass
class RecordSetup:
    out_dir: Path
    run_dir: Path
    settings: record.RecordSettings  # settings.out_dir: the fresh folder the ranks write into
    env: dict[str, str]
    messages: list[str] = field(default_factory=list)
    command: str = ""
    earlier: int = 0  # traces of an earlier recording in out_dir (replaced only by a complete one)
    complete: bool = False  # set by finish(): this recording is now the folder's

    @property
    def recording_dir(self) -> Path:
        return Path(self.settings.out_dir)


def prepare_record(out_dir: str | os.PathLike, window: record.StepWindow, argv: list[str],
                   workdir: str | os.PathLike | None = None, base_env: dict[str, str] | None = None) -> RecordSetup:
    """Checks, the folder, the run folder and the child's environment (see the module doc)."""
    window.check()
    check_command(argv, "lagom record -o traces/ -- torchrun --nproc_per_node 8 train.py")
    earlier = check_out_dir(out_dir)
    out = Path(os.path.realpath(out_dir))
    if workdir is not None:
        run_dir = Path(os.path.realpath(workdir))
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LagomError(f"--workdir {workdir}: cannot create the run folder: {exc.strerror or exc}") from None
        shutil.rmtree(run_dir / record.RECORD_PART_DIR, ignore_errors=True)  # parts of an earlier run there
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="lagom-record-")).resolve()
    recording = new_recording_folder(out)
    env = dict(os.environ if base_env is None else base_env)
    try:
        write_bootstrap(run_dir, env)
        settings = record.RecordSettings(str(recording), str(run_dir), record.new_job_id(), window.skip,
                                         window.timed, window.warmup, window.active)
        env[ENV_RECORD] = str(settings.write(run_dir / "record.json"))
    except BaseException:
        shutil.rmtree(recording, ignore_errors=True)
        raise
    messages = [f"lagom record: into {out_dir}: {window.describe()} (steps count optimizer steps from 0)"]
    if earlier:
        messages.append(f"lagom record: {out_dir} holds an earlier recording ({len(earlier)} trace(s)): replaced "
                        "only once this one is complete")
    return RecordSetup(out, run_dir, settings, env, messages, " ".join(argv), len(earlier))


def read_parts(run_dir: Path) -> list[dict]:
    parts = []
    for path in sorted((run_dir / record.RECORD_PART_DIR).glob("rank-*.json")):
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(parts, key=lambda p: p.get("rank", 0))


def report(setup: RecordSetup, status: int) -> list[str]:
    """What the ranks of this node recorded, in lines for stderr; a complete recording is moved into
    the output folder first (:func:`finish`)."""
    from traces.reader import recorded_steps_of

    parts = read_parts(setup.run_dir)
    window = setup.settings.window
    written = [p for p in parts if p.get("file")]
    lines = []
    for p in parts:
        if p.get("file") and p.get("error"):
            lines.append(f"lagom record: warning: rank {p.get('rank')}: {p['error']}; its trace "
                         f"{Path(p['file']).name} has no lagomRecord metadata")
        elif not p.get("file"):
            why = p.get("error") or (f"the job ended after {p.get('steps', 0)} optimizer step(s), before step "
                                     f"{window.last} (lower --skip/--timed/--warmup/--active or run longer)")
            lines.append(f"lagom record: warning: rank {p.get('rank')} wrote no trace: {why}")
    if not parts:
        why = (f"the job failed (status {status})" if status != 0 else
               "no rank imported torch.optim or called lagom.runtime.step(): no step boundary to record at")
        lines.append(f"lagom record: warning: no trace recorded: {why}")
    lines += finish(setup, status, parts)
    if written:
        overhead = profiler_overhead([recorded_steps_of(p.get("recorded") or {}) for p in written])
        if overhead is not None:
            lines.append(f"lagom record: {overhead_line(overhead)}")
    return lines


def finish(setup: RecordSetup, status: int, parts: list[dict]) -> list[str]:
    """Move a complete recording into the output folder, or leave the folder as it was (the lines say
    which). Complete: the job succeeded and every rank of this node wrote its trace (as many parts as
    the node ran ranks: ``LOCAL_WORLD_SIZE``, each with its file there)."""
    out, recording = setup.out_dir, setup.recording_dir
    traces = recorded_traces(recording)
    expected = max((int(p.get("local_ranks") or 0) for p in parts), default=0)
    complete = (status == 0 and bool(parts) and all(p.get("file") for p in parts) and len(parts) >= expected
                and len(traces) == len(parts))
    if complete:
        job_id = next((str((p.get("recorded") or {}).get("job_id")) for p in parts
                       if (p.get("recorded") or {}).get("job_id")), setup.settings.job_id)
        installed, replaced = install(out, recording, job_id, setup.command, setup.settings.window.describe())
        setup.complete = True
        said = f"; the {replaced} trace(s) of the earlier recording replaced" if replaced else ""
        return [f"lagom record: {len(traces)} rank trace(s) in {out}{said} (lagom analyze {out}; lagom tune {out})"]
    kept = "the earlier recording there is kept" if setup.earlier else "nothing was put there"
    why = f"the job failed (status {status})" if status != 0 else "not every rank wrote its trace"
    level = "warning" if status != 0 else "error"  # the job ran well and the recording failed: lagom record failed
    if traces:
        return [f"lagom record: {level}: the recording is incomplete ({why}): {out} is unchanged ({kept}); the "
                f"{len(traces)} trace(s) recorded are in {recording}"]
    shutil.rmtree(recording, ignore_errors=True)
    return [f"lagom record: {level}: nothing recorded into {out} ({why}; {kept})"]


def launch_record(out_dir: str | os.PathLike, argv: list[str], window: record.StepWindow,
                  workdir: str | os.PathLike | None = None, stream=None) -> int:
    """The whole of ``lagom record``; returns the child's exit status."""
    stream = stream if stream is not None else sys.stderr
    grace_s = kill_grace_s()  # a bad LAGOM_KILL_GRACE_S: exit 2 before anything starts
    setup = prepare_record(out_dir, window, argv, workdir)
    reported = False
    try:
        for line in setup.messages:
            print(line, file=stream, flush=True)
        status = run_child(argv, setup.env, grace_s, stream, who="lagom record")
        for line in report(setup, status):
            print(line, file=stream, flush=True)
        reported = True
        return status if status != 0 or setup.complete else RECORDING_FAILED_STATUS
    finally:
        if workdir is None:
            shutil.rmtree(setup.run_dir, ignore_errors=True)
        if not reported:  # interrupted: the earlier recording stays; this one's folder goes
            with contextlib.suppress(OSError):
                shutil.rmtree(setup.recording_dir)
