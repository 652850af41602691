"""`lagom record -o DIR -- torchrun ...`: a profiler trace per rank that Lagom can replay and tune.

    lagom record -o traces/ -- torchrun --nproc_per_node 8 train.py
    lagom record -o traces/ --skip 20 --active 3 -- \
        torchrun --nproc_per_node 8 train.py

The job runs unchanged (the bootstrap of ``lagom run``: a sitecustomize.py first on
PYTHONPATH). Every optimizer.step() is a step boundary (lagom.runtime.step() in a job
without a torch optimizer); steps count from 0. In every rank:

  --skip N     (10) steps left alone: the job's own warm-up;
  --timed N    (5)  the next steps, timed without the profiler (host clock;
                    CUDA events on the compute stream when the job uses CUDA);
  --warmup N   (2)  the profiler's own warm-up: it runs, nothing is kept;
  --active N   (5)  the steps recorded, and timed on the same clocks.

The profiler records shapes (collective sizes), CUDA sync events (cross-stream waits;
where this torch lacks them, one line says so) and no stacks. Each rank writes
DIR/rank-<R>.json.gz with a ``lagomRecord`` metadata object: the job id (every rank's
is rank 0's), both step times, the NCCL version and the NCCL_* / TORCH_NCCL_* variables
in force (docs/record.md). ``lagom analyze DIR`` and ``lagom tune DIR`` read the folder
as it is and print the profiler's overhead (profiled against unprofiled mean step).

DIR is checked before the job starts: it exists or can be created, it is writable and
holds nothing but what its manifest (lagom-record.txt) lists (anything else is an error,
exit 2). The ranks record into a fresh folder beside DIR; an earlier recording in DIR is
replaced only once the new one is complete (the job succeeded, every rank wrote its
trace), else DIR is left as it was. The job's exit status is lagom's; a rank that ends
before the window's last step, or cannot write its trace (a full disk), writes none and
one line says so; a job that succeeded with an incomplete recording exits 1.
--json prints, as the last line on stdout, {"output", "exit_status", "traces" (the
files written), "ranks", "window": {"skip", "timed", "warmup", "active"}}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lagom.args.common_args import add_job, add_json

_DEFAULTS = {"skip": 10, "timed": 5, "warmup": 2, "active": 5}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "record",
        help="run a job (torchrun or python) and record a profiler trace per rank that Lagom can tune",
        description=__doc__,
    )
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="folder for the ranks' traces (created if needed; must hold nothing else)")
    parser.add_argument("--skip", type=int, default=_DEFAULTS["skip"], metavar="N",
                        help=f"steps before anything is timed (default {_DEFAULTS['skip']}; at least 1)")
    parser.add_argument("--timed", type=int, default=_DEFAULTS["timed"], metavar="N",
                        help=f"steps timed without the profiler just before it starts (default {_DEFAULTS['timed']})")
    parser.add_argument("--warmup", type=int, default=_DEFAULTS["warmup"], metavar="N",
                        help=f"profiler warm-up steps, not kept (default {_DEFAULTS['warmup']})")
    parser.add_argument("--active", type=int, default=_DEFAULTS["active"], metavar="N",
                        help=f"steps recorded (default {_DEFAULTS['active']})")
    parser.add_argument("--workdir", metavar="DIR",
                        help="keep the run folder (bootstrap, settings, per-rank parts) here; default: a temporary "
                             "folder, removed after")
    add_json(parser)
    add_job(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lagom.runtime.launcher import job_command
    from lagom.runtime.record import StepWindow
    from lagom.runtime.record_launch import launch_record

    command = job_command(args.job, "lagom record -o traces/ -- torchrun --nproc_per_node 8 train.py")
    window = StepWindow(args.skip, args.timed, args.warmup, args.active)
    status = launch_record(args.output, command, window, workdir=args.workdir)
    if args.json:
        out = Path(args.output)
        traces = sorted(str(p) for p in out.glob("rank-*.json.gz")) if out.is_dir() else []
        sys.stdout.flush()
        print(json.dumps({"output": str(out), "exit_status": status, "traces": traces, "ranks": len(traces),
                          "window": {"skip": args.skip, "timed": args.timed, "warmup": args.warmup,
                                     "active": args.active}}))
    return status
