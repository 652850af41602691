"""`lagom simulate WORKLOAD [--cluster NAME|FILE] [--nccl-version X.Y.Z]`: one iteration on a virtual cluster.

WORKLOAD is a profiler trace (a file; a directory of ranks: every rank replayed jointly, a
step's time the job's, the slowest rank's, ``--rank N`` for rank N alone; docs/replay.md
"Every rank at once"), a Lagom workload JSON file,
or a spec string such as ``fsdp:llama3-8b:gpus=16``, ``tp:phi2:tp=8,dp=2``, ``ep:olmoe:ep=8``.
--cluster is required for a spec or a workload file; for a trace it defaults to the
preset for the trace's GPU, with the NCCL version the trace ran (lagom/orchestration/trace_context.py).
--nccl-version sets the NCCL modelled; without it a --config file's own ``nccl_version``
(the one ``lagom tune`` tuned for) is honoured, else the trace's, else the cluster's.

A trace is replayed (docs/replay.md): its execution graph scheduled with the measured
times, which the evaluator only scales by the ratio its mechanism gives between the
plan and the trace's recorded settings. With neither --config nor --set the plan is the
trace's own recorded settings, so the replay reproduces the trace. Figures are per
profiler step (the mean over the trace's complete steps) and every step is listed;
``--json`` adds ``"steps": [{"name", "iteration_us", "comm_us", "exposed_comm_us",
"measured_iteration_us", "measured_comm_us", "measured_exposed_comm_us", ...}]`` and
``"replay": {"median_step_error_pct", "comm_error_pct", "exposed_error_pct", ...}`` (the
replay under the recorded settings against the trace).

``--scale comm=F`` / ``compute=F`` / ``cpu=F`` (a trace only; several in one flag as
``comm=F,compute=G``; ``compute=F@5`` or ``comm=F@0-3`` on those ranks only) asks a
what-if first: every collective's (every compute kernel's; the CPU's own time between
calls) measured time times F, and the replay's schedule follows; the plan, if any,
applies on top. ``replay`` stays the fidelity under the trace's own times.
``--export-trace OUT.json.gz`` writes the prediction as a Kineto trace with the
original's layout and names (lagom/files/trace_export.py), to open beside the measured one.
``--unprofiled-cpu`` (a trace ``lagom record`` wrote, with the steps it timed without
the profiler) scales the CPU's time between calls so that the replay runs at that
unprofiled step, before anything else applies (docs/replay.md).

For other workloads every collective runs with NCCL's modelled default choice, unless ``--set`` gives one
CommConfig for all of them (``--set channels=16,chunk=2MiB``; keys channels, threads,
chunk, algorithm, protocol, path (sm, symmetric, copy_engine, efficiency: docs/tuner.md
"Paths"); sizes take B/KB/KiB/MB/MiB, binary; values must be valid on the cluster's NCCL
version; the evaluators model algorithm ring and tree) or ``--config`` applies a
tuned file from ``lagom tune`` (``--set`` then fills what the file leaves to NCCL).

Prints the iteration time, compute busy time, communication busy and exposed time, and
the slowdown of compute caused by contention; ``--json`` prints ``{"iteration_us",
"compute_us", "comm_us", "exposed_comm_us", "compute_uncontended_us",
"compute_slowdown", "evaluations", "cluster", "workload", "evaluator", "ops", "collectives"}``.
A what-if on a trace (``--scale``, ``--set``, ``--config``) prints its figures beside the
trace's measured ones, labelled; ``--json`` adds ``"whatif": true`` and ``"measured":
{"iteration_us", "compute_us", "comm_us", "exposed_comm_us"}`` (the trace's means).
"""

from __future__ import annotations

import argparse
import json
import sys

from lagom.args.common_args import add_cluster, add_evaluator, add_json, add_nccl_version, add_noise, add_seed
from lagom.args.rank_args import add_arguments, reading_from_args
from lagom.orchestration.simulation import SIMULATE_EVALUATOR, SimulateRequest, simulate
from lagom.reports.simulate_report import print_simulate_report


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "simulate",
        help="one iteration of a workload on a virtual cluster",
        description=__doc__,
    )
    parser.add_argument("workload", metavar="WORKLOAD", help="trace, workload JSON, or spec string")
    add_cluster(parser, "for a trace, default: the preset for its GPU")
    add_nccl_version(parser, "default: the --config file's, else the trace's, else the cluster's")
    add_evaluator(parser, SIMULATE_EVALUATOR, "one run: the simulator itself, not the model fitted to it")
    parser.add_argument("--set", dest="set_config", metavar="KNOB=VALUE,...",
                        help="one CommConfig for every collective, e.g. channels=16,chunk=2MiB")
    parser.add_argument("--config", metavar="lagom.yaml", help="apply a tuned-config file")
    parser.add_argument("--scale", action="append", metavar="comm=F|compute=F|cpu=F[@RANKS]",
                        help="a trace's what-if: each collective's (compute kernel's, CPU gap's) measured time "
                             "times F; @5 or @0-3: on those ranks only")
    parser.add_argument("--rank", type=int, default=None, metavar="N",
                        help="a folder of ranks: replay rank N alone (default: every rank jointly)")
    parser.add_argument("--unprofiled-cpu", action="store_true",
                        help="a trace from lagom record: scale the CPU's time to the step measured without the "
                             "profiler")
    add_noise(parser, "a spec or workload file only (a trace replays its measured times)")
    add_seed(parser)
    parser.add_argument("--export-trace", metavar="OUT.json.gz",
                        help="a trace: write the prediction as a Kineto trace (Perfetto, TensorBoard, HTA open it)")
    parser.add_argument("--force", action="store_true",
                        help="let --export-trace replace a file that is not a trace Lagom exported")
    add_json(parser)
    add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The flags as a request (lagom/orchestration/simulation.py), its lines on stderr as they come,
    the result as JSON or tables."""
    request = SimulateRequest(
        workload=args.workload, cluster=args.cluster, nccl_version=args.nccl_version,
        evaluator=args.evaluator or SIMULATE_EVALUATOR, set_config=args.set_config, config=args.config,
        scale=tuple(args.scale or ()), rank=args.rank, unprofiled_cpu=args.unprofiled_cpu, noise=args.noise,
        seed=args.seed, export_trace=args.export_trace, force=args.force, reading=reading_from_args(args))
    result = simulate(request, say=lambda line: print(line, file=sys.stderr))
    if args.json:
        print(json.dumps(result.to_dict()))
    else:
        print_simulate_report(result)
    return 0
