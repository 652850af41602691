"""`lagom run`: run a training job with a tuned config applied, and audit what it covered.

    lagom run --config lagom.yaml [--audit audit.json] [--workdir DIR] -- \
        torchrun --nproc_per_node 8 train.py
    lagom run --config lagom.yaml -- python train.py
    lagom run --online [--config SEED.yaml] [--save OUT.yaml] [--budget-steps N]
        [--nccl-version X.Y.Z] [--collective-timing] [--audit A.json]
        [--simulate WORKLOAD --cluster NAME|FILE [--noise F]] --
        torchrun ... train.py

The job runs unchanged. Three doors carry the tuned file into it:

  env            the file's NCCL knobs (process-wide; only those Lagom tunes:
                 any other name is refused); a variable you set yourself
                 wins, and one line names each that caps or overrides a
                 tuned value.
  process group  per-group NCCL options (min_ctas, max_ctas, cta_policy)
                 passed as ProcessGroupNCCL.Options when each group is
                 created (NCCL groups only).
  tuner plugin   the per-collective entries, as a table for Lagom's C tuner
                 plugin: NCCL_TUNER_PLUGIN and NCCL_TUNER_CONFIG_FILE are set
                 for the job.

Every Python process of the job gets Lagom's hook through a sitecustomize.py put first
on PYTHONPATH (an existing sitecustomize still runs). At exit rank 0 prints one line:
collectives seen (every one the job issued, whatever issued it: DDP's buckets, FSDP,
DeviceMesh; docs/run.md), how many a tuned entry matched, bytes covered; --audit FILE writes
per-signature counts and per-rank details as JSON. The job's exit status is lagom's
(128+N if it died of signal N, or ended after a forwarded signal N); SIGINT, SIGTERM and
SIGHUP are forwarded to the job's process group, and a job still running 10 s later
(LAGOM_KILL_GRACE_S) gets SIGKILL; one line says so when the signal is forwarded. A
missing or invalid config, or no command, is an error (exit 2) and nothing starts; a
plugin that cannot be built is a warning and the job runs without it.
Paths a tuned file names are relative to its own folder (docs/run.md).

--online tunes inside the running job (NCCL >= 2.21): at each optimizer step (torch's
global step hook; lagom.runtime.step() for jobs without a torch optimizer) every rank
reports its step time, rank 0 runs Lagom's search on those measurements and every rank
switches to the same plan at the same step, through the tuner plugin's table. Only
per-collective knobs change (channels, algorithm/protocol; chunk from NCCL 2.30);
threads and the buffer stay at the seed's values (--config, else NCCL's defaults).
A final A/B keeps the result only if the job ran the collectives it changes and it
beats the seed past the noise; else the seed is kept. --save writes the plan kept (the
seed's own after a revert) as a tuned file for the next run; the last line says which.
The clock is the step time (CUDA events on the compute stream; the host clock without
CUDA); TORCH_NCCL_ENABLE_TIMING stays as you set it.
--collective-timing also times each async collective through its Work handle, which
sets TORCH_NCCL_ENABLE_TIMING=1: its timing events break the overlap of NCCL with
compute, costing up to about 30% on small and mid-sized collectives. --simulate
WORKLOAD --cluster C takes each rank's step times from the simulator (all else real).
See docs/online.md.

--json prints, as the last line on stdout (after the job's own output), one object:
{"command", "config", "exit_status", "audit" (the --audit file or null), "summary"
(every rank's collectives, matched, bytes, bytes_matched, as in the audit), "ranks"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from lagom.args.common_args import add_cluster, add_job, add_json, add_nccl_version, add_noise
from nccl_env.errors import LagomError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run",
        help="run a job (torchrun or python) with a tuned config applied",
        description=__doc__,
    )
    parser.add_argument(
        "--config", metavar="FILE", help="tuned-config file (lagom.yaml) to apply; with --online: the seed"
    )
    parser.add_argument("--audit", metavar="FILE.json", help="write per-signature and per-rank collective counts here")
    parser.add_argument(
        "--workdir",
        metavar="DIR",
        help="keep the run folder (plugin table, bootstrap, audit parts) here: a new or empty folder, or an earlier "
        "run's; default: a temporary folder, removed after",
    )
    parser.add_argument("--force", action="store_true",
                        help="let --audit and --save replace a file that is not one Lagom wrote")
    parser.add_argument(
        "--no-plugin",
        action="store_true",
        help="do not build or load the tuner plugin (env and process-group doors only)",
    )
    online = parser.add_argument_group("online tuning")
    online.add_argument("--online", action="store_true", help="tune inside the running job (NCCL >= 2.21)")
    online.add_argument("--save", metavar="OUT.yaml", help="write the tuned plan here (a tuned-config file)")
    online.add_argument(
        "--budget-steps", type=int, default=None, metavar="N", help="at most N steps spent tuning (default 400)"
    )
    add_nccl_version(online, "default: the seed file's, else the installed one")
    online.add_argument(
        "--collective-timing", action="store_true",
        help="also time each async collective (sets TORCH_NCCL_ENABLE_TIMING=1, which costs overlap: docs/online.md)"
    )
    online.add_argument(
        "--simulate", metavar="WORKLOAD", help="step times from the simulator for this workload (no GPU needed)"
    )
    add_cluster(online, "with --simulate: the cluster simulated")
    add_noise(online, "with --simulate (a trace: none)")
    add_json(parser)
    add_job(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from lagom.runtime.launcher import job_command, launch

    command = job_command(args.job, "lagom run --config lagom.yaml -- torchrun train.py")
    online_only = {"--save": args.save, "--budget-steps": args.budget_steps, "--nccl-version": args.nccl_version,
                   "--simulate": args.simulate, "--cluster": args.cluster, "--noise": args.noise,
                   "--collective-timing": args.collective_timing or None}
    if not args.online:
        given = [flag for flag, value in online_only.items() if value is not None]
        if given:
            raise LagomError(f"{given[0]} is an option of lagom run --online")
        if args.config is None:
            raise LagomError("lagom run needs --config FILE (or --online)")
        return _launch(args, command, lambda workdir: launch(
            args.config, command, audit_path=args.audit, workdir=workdir, use_plugin=not args.no_plugin,
            force=args.force))
    from lagom.args.knob_args import parse_nccl_version_arg
    from lagom.online import DEFAULT_BUDGET_STEPS
    from lagom.runtime.launcher import OnlineRequest

    if args.no_plugin:
        raise LagomError("lagom run --online works through the tuner plugin: drop --no-plugin")
    for flag in ("--cluster", "--noise"):
        if online_only[flag] is not None and args.simulate is None:
            raise LagomError(f"{flag} goes with --simulate WORKLOAD")
    budget_steps = args.budget_steps if args.budget_steps is not None else DEFAULT_BUDGET_STEPS
    request = OnlineRequest(save=args.save, budget_steps=budget_steps,
                            nccl_version=parse_nccl_version_arg(args.nccl_version), simulate=args.simulate,
                            cluster=args.cluster,
                            noise=args.noise if args.noise is not None else _default_noise(args.simulate),
                            collective_timing=args.collective_timing)
    return _launch(args, command, lambda workdir: launch(args.config, command, audit_path=args.audit,
                                                         workdir=workdir, online=request, force=args.force))


def _default_noise(workload: str | None) -> float:
    """--noise's default with --simulate, as in lagom simulate: the simulator's run-to-run spread for a
    spec or a workload file; none for a trace, which is replayed from its measured times."""
    from lagom.args.common_args import DEFAULT_NOISE
    from traces.workload_io import is_workload_file

    if workload is None:
        return 0.0
    path = Path(workload)
    return 0.0 if path.exists() and not (path.is_file() and is_workload_file(path)) else DEFAULT_NOISE


def _launch(args: argparse.Namespace, command: list[str], start: Callable[[str | None], int]) -> int:
    """Run the job; with --json, then print its summary object (the rank parts are read from the run
    folder, kept for that in a temporary --workdir when none was given)."""
    if not args.json:
        return start(args.workdir)
    from lagom.runtime import audit

    with tempfile.TemporaryDirectory(prefix="lagom-run-json-") as tmp:
        workdir = args.workdir if args.workdir is not None else str(Path(tmp) / "run")
        status = start(workdir)
        parts = audit.read_parts(workdir)
    counts = [audit.SignatureCount(**raw) for part in parts for raw in part.get("signatures", [])]
    sys.stdout.flush()
    print(json.dumps({"command": command, "config": args.config, "exit_status": status, "audit": args.audit,
                      "summary": audit.Summary.of(counts).to_dict(), "ranks": len(parts)}))
    return status
