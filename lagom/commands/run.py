"""`lagom run`: run a training job with a tuned config applied, and audit what it covered.

    lagom run --config lagom.yaml [--audit audit.json] [--workdir DIR] -- torchrun --nproc_per_node 8 train.py
    lagom run --config lagom.yaml -- python train.py

The job runs unchanged. Three doors carry the tuned file into it:

  env            the file's NCCL_* knobs (process-wide); a variable you set yourself wins
                 and one line says so.
  process group  per-group NCCL options (min_ctas, max_ctas, cta_policy) passed as
                 ProcessGroupNCCL.Options when each group is created (NCCL groups only).
  tuner plugin   the per-collective entries, as a table for Lagom's C tuner plugin:
                 NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE are set for the job.

Every Python process of the job gets Lagom's hook through a sitecustomize.py put first
on PYTHONPATH (an existing sitecustomize still runs). At exit rank 0 prints one line:
collectives seen, how many a tuned entry matched, bytes covered; --audit FILE writes
per-signature counts and per-rank details as JSON. The job's exit status is lagom's
(128+N if it died of signal N); SIGINT, SIGTERM and SIGHUP are forwarded to the job's
process group. A missing or invalid config, or no command, is an error (exit 2) and
nothing starts; a plugin that cannot be built is a warning and the job runs without it.
"""

from __future__ import annotations

import argparse

from nccl_env.errors import LagomError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run a job (torchrun or python) with a tuned config applied",
        description=__doc__,
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="tuned-config file (lagom.yaml) to apply")
    parser.add_argument("--audit", metavar="FILE.json", help="write per-signature and per-rank collective counts here")
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the run folder (plugin table, bootstrap, audit parts) here; default: a temporary folder, removed "
             "after",
    )
    parser.add_argument("--no-plugin", action="store_true",
                        help="do not build or load the tuner plugin (env and process-group doors only)")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the job's command line, after '--'")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lagom.runtime.launcher import launch

    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise LagomError("no command to run: put it after '--', "
                         "e.g. lagom run --config lagom.yaml -- torchrun train.py")
    return launch(args.config, command, audit_path=args.audit, workdir=args.workdir, use_plugin=not args.no_plugin)
