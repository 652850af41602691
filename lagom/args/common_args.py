"""The flags several commands take, defined once: the same spelling, metavar, default and
help line for the same thing in every command (tests/test_cli_manners.py checks it)."""

from __future__ import annotations

import argparse
import sys

from nccl_env.errors import LagomError

CLUSTER_METAVAR = "NAME|FILE"
CLUSTER_HELP = "preset name or cluster YAML (e.g. one lagom calibrate wrote)"
NCCL_VERSION_HELP = "the NCCL the job runs: it decides which knobs exist and which are per collective"
EVALUATOR_CHOICES = ("analytic", "sim")
EVALUATOR_HELP = "what predicts iteration times: analytic (Lagom's cost model) or sim (the simulator)"
DEFAULT_NOISE = 0.01  # the simulator's run-to-run spread: the relative std. dev. of each op's time
NOISE_HELP = f"relative noise per simulated op (std. dev. in [0, 0.5); default {DEFAULT_NOISE}; 0 = exact)"
SEED_HELP = "seed of every random choice: search, measurement plan, simulator noise (default 0)"
JSON_HELP = "print one JSON object on stdout instead of the text report"


def add_cluster(parser: argparse.ArgumentParser | argparse._ArgumentGroup, where: str = "",
                repeatable: bool = False) -> None:
    """``--cluster NAME|FILE``; ``where`` adds what it does in this command (its default)."""
    text = CLUSTER_HELP + (f"; {where}" if where else "")
    if repeatable:
        parser.add_argument("--cluster", default=None, metavar=CLUSTER_METAVAR, action="append", help=text)
    else:
        parser.add_argument("--cluster", default=None, metavar=CLUSTER_METAVAR, help=text)


def add_nccl_version(parser: argparse.ArgumentParser | argparse._ArgumentGroup, where: str) -> None:
    """``--nccl-version X.Y.Z``; ``where`` says where this command's default comes from."""
    parser.add_argument("--nccl-version", default=None, metavar="X.Y.Z", help=f"{NCCL_VERSION_HELP}; {where}")


def add_evaluator(parser: argparse.ArgumentParser, default: str, why: str) -> None:
    """``--evaluator``: the same choices and meaning everywhere; ``why`` says why this command's
    default is ``default``."""
    parser.add_argument("--evaluator", choices=EVALUATOR_CHOICES, default=None,
                        help=f"{EVALUATOR_HELP}; default: {default} ({why})")


def add_noise(parser: argparse.ArgumentParser | argparse._ArgumentGroup, where: str = "") -> None:
    """``--noise F``: None when not given, so a command can tell a given 0.01 from the default."""
    parser.add_argument("--noise", type=float, default=None, metavar="F",
                        help=NOISE_HELP + (f"; {where}" if where else ""))


def add_seed(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0, metavar="N", help=SEED_HELP)


def check_seed(seed: int) -> None:
    if seed < 0:
        raise LagomError(f"--seed must be >= 0, got {seed}")


def add_json(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help=JSON_HELP)


def add_job(parser: argparse.ArgumentParser) -> None:
    """The job's command line, everything after '--' (``lagom.runtime.launcher.job_command`` reads it)."""
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the job's command line, after '--'")


def deprecated_alias(args: argparse.Namespace, old: str, new: str, old_dest: str, new_dest: str,
                     command: str) -> None:
    """An old spelling kept working: one warning line naming the new one; both given is an error."""
    value = getattr(args, old_dest)
    if value is None:
        return
    if getattr(args, new_dest) is not None:
        raise LagomError(f"{old} is the old name of {new}: give one of them")
    print(f"lagom {command}: warning: {old} is deprecated; use {new}", file=sys.stderr)
    setattr(args, new_dest, value)
