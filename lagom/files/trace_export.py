"""Writing a replay's prediction as a Kineto trace that Perfetto, TensorBoard and HTA open.

``lagom simulate TRACE --export-trace OUT`` and ``lagom tune TRACE --export-trace OUT``
write the trace they read with every event moved to where the replay puts it under the
plan or what-if asked for (docs/replay.md): each GPU op (kernel, memcpy, memset) gets its
predicted start and duration, every CPU event moves with its thread (its thread's last
wait before it: a host sync or a hand-over; a span's start and end each move so, and
``ProfilerStep#N`` annotations tile the timeline as they did), ``ac2g`` flow ends follow their kernels and
GPU annotations (``nccl:all_reduce`` spans) the kernel they wrap. Process, thread and
stream layout, names and args stay the original's, so the prediction opens beside the
measured trace in the same viewer, and ``lagom analyze OUT`` reads it as a trace (its
steps, collectives and exposed time are the replay's). A top-level ``lagom_export``
object says what was predicted; the rest of the metadata is the original's.

A gloo job's trace (no GPU op) replays its collectives' CPU calls: each moves with its
thread and takes its predicted duration. Only the first rank of a folder is replayed, so
only its file is exported. The rewrite is the trace's reader's (``TraceReader.moved_trace``,
:mod:`traces.reader`); this module checks the output and says what was predicted.
"""

from __future__ import annotations

from pathlib import Path

from costmodel.evaluator import Timing
from costmodel.replay.schedule import moved_times
from lagom import __version__
from lagom.files.output_paths import OutputFormat, check_output, write_output
from nccl_env.errors import LagomError
from traces.reader import reader_for
from traces.workload import Workload

EXPORT_KEY = "lagom_export"  # the top-level object that marks a file Lagom wrote


def check_export_path(out: str, inputs: list[tuple[str, object]], force: bool = False) -> Path:
    """The export's path, checked before any work: a trace file name (.json, .json.gz) in an existing,
    writable folder, not one of the command's inputs, and replacing only a trace Lagom exported
    unless ``force`` (:func:`lagom.files.output_paths.check_output`)."""
    if not (out.endswith(".json") or out.endswith(".json.gz")):
        raise LagomError(f"--export-trace {out}: a trace is written as .json or .json.gz; give such a name")
    return check_output("--export-trace", out, OutputFormat.EXPORTED_TRACE, inputs, force=force)


def export_trace(workload: Workload, timing: Timing, out: Path, what: str, cpu: float = 1.0) -> int:
    """Write ``workload``'s trace file moved to ``timing`` (a replay of it, with the CPU's time
    scaled by ``cpu``) to ``out`` (.json or .json.gz); returns the number of GPU ops written.
    ``what`` says what was predicted."""
    replay_data = timing.replay
    if replay_data is None or not workload.source:
        raise LagomError("--export-trace: only a trace's replay can be exported")
    moved = moved_times(replay_data.static, replay_data.graph, timing, cpu)
    stamp = {"by": f"lagom {__version__}", "source": str(Path(workload.source)), "predicted": what,
             "note": "every event moved to the replay's prediction (docs/replay.md)"}
    data, count = reader_for(workload.source).moved_trace(workload, moved, out.name.endswith(".gz"),
                                                          {EXPORT_KEY: stamp})
    write_output(out, data, "--export-trace")
    return count
