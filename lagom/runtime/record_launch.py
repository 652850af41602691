"""``lagom record``: start a job whose ranks each profile a window of steps into one folder.

Steps (the command's docstring in lagom/commands/record.py is the user-facing doc):

1. check the window (:meth:`lagom.runtime.record.StepWindow.check`) and the command;
2. check the output folder before anything starts (:func:`check_out_dir`): it exists or
   can be created, it is writable, and it holds nothing Lagom did not write; the traces
   of an earlier ``lagom record`` there are removed (one line says so), so the folder
   ends holding one job's ranks;
3. lay out the run folder (``--workdir`` or a temporary one): the bootstrap shared with
   ``lagom run`` (:func:`lagom.runtime.launcher.write_bootstrap`) and the settings every
   rank reads (``LAGOM_RECORD``);
4. run the command (:func:`lagom.runtime.launcher.run_child`: own process group, signals
   forwarded, its exit status returned);
5. read the ranks' parts and say what was recorded: the files, the ranks that wrote
   none and why, the profiler's overhead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lagom.record_overhead import overhead_line, profiler_overhead
from lagom.runtime import record
from lagom.runtime.env import ENV_RECORD
from lagom.runtime.launcher import check_command, run_child, write_bootstrap
from nccl_env.errors import LagomError

MARKER = "lagom-record.txt"  # says the folder is lagom record's; the trace reader skips it (not .json)
_OURS = re.compile(r"^(rank-\d+\.json\.gz|\.rank-\d+\.json\.gz\.partial)$")
NAMED_AT_MOST = 5  # a refusal names this many of the folder's files


def check_out_dir(out_dir: str | os.PathLike) -> list[Path]:
    """The folder a job may record into; the earlier ``lagom record`` traces there, to be removed.

    LagomError (nothing starts) when it is a file, cannot be created or written, or holds
    anything but an earlier ``lagom record``'s traces and marker."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise LagomError(f"-o {out_dir}: is a file, expected a folder for the ranks' traces")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LagomError(f"-o {out_dir}: cannot create the folder: {exc.strerror or exc}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".lagom-probe-"):
            pass
    except OSError as exc:
        raise LagomError(f"-o {out_dir}: cannot write into the folder: {exc.strerror or exc}") from None
    entries = sorted(path.iterdir())
    ours = (path / MARKER).is_file()
    foreign = [e.name for e in entries
               if e.name != MARKER and not (ours and e.is_file() and _OURS.match(e.name))]
    if foreign:
        names = ", ".join(foreign[:NAMED_AT_MOST]) + (f" and {len(foreign) - NAMED_AT_MOST} more"
                                                      if len(foreign) > NAMED_AT_MOST else "")
        raise LagomError(f"-o {out_dir}: holds files lagom record did not write ({names}); give an empty or new "
                         "folder (lagom tune reads every trace in it as one job's ranks)")
    return [e for e in entries if e.name != MARKER]


@dataclass
class RecordSetup:
    out_dir: Path
    run_dir: Path
    settings: record.RecordSettings
    env: dict[str, str]
    messages: list[str] = field(default_factory=list)


def prepare_record(out_dir: str | os.PathLike, window: record.StepWindow, argv: list[str],
                   workdir: str | os.PathLike | None = None, base_env: dict[str, str] | None = None) -> RecordSetup:
    """Checks, the folder, the run folder and the child's environment (see the module doc)."""
    window.check()
    check_command(argv, "lagom record -o traces/ -- torchrun --nproc_per_node 8 train.py")
    out = Path(out_dir).resolve()
    stale = check_out_dir(out)
    messages = []
    if stale:
        for old in stale:
            old.unlink()
        messages.append(f"lagom record: removed the {len(stale)} trace(s) of an earlier lagom record in {out_dir}")
    (out / MARKER).write_text(
        "Written by lagom record: one PyTorch profiler (Kineto) trace per rank, rank-<R>.json.gz, of one job.\n"
        f"Command: {' '.join(argv)}\n"
        f"Window: {window.describe()}.\n"
        "Read with: lagom analyze <this folder>; lagom tune <this folder>.\n"
    )
    if workdir is not None:
        run_dir = Path(workdir).resolve()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LagomError(f"--workdir {workdir}: cannot create the run folder: {exc.strerror or exc}") from None
        shutil.rmtree(run_dir / record.PART_DIR, ignore_errors=True)  # parts of an earlier run there
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="lagom-record-")).resolve()
    env = dict(os.environ if base_env is None else base_env)
    write_bootstrap(run_dir, env)
    settings = record.RecordSettings(str(out), str(run_dir), record.new_job_id(), window.skip, window.timed,
                                     window.warmup, window.active)
    env[ENV_RECORD] = str(settings.write(run_dir / "record.json"))
    messages.append(f"lagom record: into {out_dir}: {window.describe()} (steps count optimizer steps from 0)")
    return RecordSetup(out, run_dir, settings, env, messages)


def read_parts(run_dir: Path) -> list[dict]:
    parts = []
    for path in sorted((run_dir / record.PART_DIR).glob("rank-*.json")):
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(parts, key=lambda p: p.get("rank", 0))


def report(setup: RecordSetup, status: int) -> list[str]:
    """What the ranks of this node recorded, in lines for stderr."""
    from traces.reader import recorded_steps_of

    parts = read_parts(setup.run_dir)
    window = setup.settings.window
    written = [p for p in parts if p.get("file")]
    lines = []
    for p in parts:
        if p.get("file") and p.get("error"):
            lines.append(f"lagom record: warning: rank {p.get('rank')}: {p['error']}; its trace {p['file']} "
                         "has no lagomRecord metadata")
        elif not p.get("file"):
            why = p.get("error") or (f"the job ended after {p.get('steps', 0)} optimizer step(s), before step "
                                     f"{window.last} (lower --skip/--timed/--warmup/--active or run longer)")
            lines.append(f"lagom record: warning: rank {p.get('rank')} wrote no trace: {why}")
    if not parts:
        why = (f"the job failed (status {status})" if status != 0 else
               "no rank imported torch.optim or called lagom.runtime.step(): no step boundary to record at")
        lines.append(f"lagom record: warning: no trace recorded: {why}")
    if written:
        out = setup.out_dir
        lines.append(f"lagom record: {len(written)} rank trace(s) in {out} (lagom analyze {out}; lagom tune {out})")
        overhead = profiler_overhead([recorded_steps_of(p.get("recorded") or {}) for p in written])
        if overhead is not None:
            lines.append(f"lagom record: {overhead_line(overhead)}")
    return lines


def launch_record(out_dir: str | os.PathLike, argv: list[str], window: record.StepWindow,
                  workdir: str | os.PathLike | None = None, stream=None) -> int:
    """The whole of ``lagom record``; returns the child's exit status."""
    stream = stream if stream is not None else sys.stderr
    setup = prepare_record(out_dir, window, argv, workdir)
    try:
        for line in setup.messages:
            print(line, file=stream, flush=True)
        status = run_child(argv, setup.env)
        for line in report(setup, status):
            print(line, file=stream, flush=True)
        return status
    finally:
        if workdir is None:
            shutil.rmtree(setup.run_dir, ignore_errors=True)
