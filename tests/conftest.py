"""Shared test helpers: where the test traces are, a cache folder of the suite's own, a 1-rank gloo group."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_DATA = REPO_ROOT / "tests" / "data"  # small traces the suite needs, provenance in its README
EXAMPLES = REPO_ROOT / "traces" / "examples"  # the trace the package ships



_TRACE_DIR: list[Path] = []  # the folder trace_dir() made, once per session


def pytest_configure(config) -> None:
    # Before collection, so before any test (or subprocess a test starts) asks for the
    # cache: the suite's plugin builds, calibrations and trace parses never touch the user's
    # cache, and are made once per run. Under pytest-xdist (`-n 2`) every worker uses the
    # folder of the run that started it (pytest_configure_node), so a calibration or a parse
    # one worker made serves the other; that run's process alone removes it.
    shared = getattr(config, "workerinput", {})
    if "lagom_cache_dir" in shared:
        config.lagom_cache_dir = None
        os.environ["LAGOM_CACHE_DIR"] = shared["lagom_cache_dir"]
        # a worker's environment says COLUMNS=80; the reports' widths follow the run's own
        os.environ.pop("COLUMNS", None)
        if shared["columns"] is not None:
            os.environ["COLUMNS"] = shared["columns"]
        return
    config.lagom_cache_dir = tempfile.mkdtemp(prefix="lagom-test-cache-")
    os.environ["LAGOM_CACHE_DIR"] = config.lagom_cache_dir


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """pytest-xdist, in the run's own process, before a worker starts: what the worker shares with it."""
    node.workerinput["lagom_cache_dir"] = node.config.lagom_cache_dir
    node.workerinput["columns"] = os.environ.get("COLUMNS")


def pytest_unconfigure(config) -> None:
    if config.lagom_cache_dir is not None:
        shutil.rmtree(config.lagom_cache_dir, ignore_errors=True)
    for folder in _TRACE_DIR:
        shutil.rmtree(folder, ignore_errors=True)


def shared_traces_dir() -> Path:
    """The larger trace set beside the checkout (../shared/traces), read-only; it may be absent.

    A git worktree may sit one level deeper (e.g. /work/wt/NAME): the nearest
    ancestor holding shared/traces wins."""
    for parent in REPO_ROOT.parents:
        if (parent / "shared" / "traces").is_dir():
            return parent / "shared" / "traces"
    return REPO_ROOT.parent / "shared" / "traces"


def trace_path(name: str) -> Path:
    """A test trace by file name: tests/data, then traces/examples, then ../shared/traces;
    skips the calling test when none has it."""
    for folder in (TEST_DATA, EXAMPLES, shared_traces_dir()):
        if (folder / name).is_file():
            return folder / name
    pytest.skip(f"{name} is not in tests/data and no ../shared/traces beside the checkout has it")


def trace_dir() -> Path:
    """One folder holding (as links) every trace all_test_traces() finds, for tests that
    name traces relative to a folder; a test that wants one it lacks skips (trace_path)."""
    if not _TRACE_DIR:
        folder = Path(tempfile.mkdtemp(prefix="lagom-test-traces-"))
        for path in all_test_traces():
            (folder / path.name).symlink_to(path)
        _TRACE_DIR.append(folder)
    return _TRACE_DIR[0]


def all_test_traces() -> list[Path]:
    """Every trace the suite can read here (the bundled ones, plus the shared set when present)."""
    names = {p.name: p for p in sorted(TEST_DATA.glob("*.json.gz"))}
    names.update({p.name: p for p in sorted(EXAMPLES.glob("*.json.gz"))})
    shared = shared_traces_dir()
    if shared.is_dir():
        names.update({p.name: p for p in sorted(shared.glob("*.json.gz")) if p.name not in names})
    return [names[n] for n in sorted(names)]


def run_jobs(commands: dict[str, tuple[list[str], dict[str, str]]],
             timeout_s: float) -> dict[str, tuple[int, str, float]]:
    """Start every (command, env) at once; name -> (exit status, stderr, seconds since the start).

    A job still running after ``timeout_s`` is killed, and its stderr ends in "<timed out>".
    """
    started = time.monotonic()
    procs = {name: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name, (cmd, env) in commands.items()}
    results = {}
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err += "\n<timed out>"
        results[name] = (proc.returncode, err, time.monotonic() - started)
    return results


@pytest.fixture(scope="module")
def world():
    """A real 1-rank gloo process group for the whole module (the hook's tests)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``lagom ARGV...`` in-process: (exit status, stdout, stderr)."""
    from lagom.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
