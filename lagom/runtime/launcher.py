"""``lagom run``: start a job with a tuned config applied through all three doors.

Steps (the command's docstring in lagom/commands/run.py is the user-facing doc):

1. load and validate the tuned file (bad file: LagomError, exit 2, nothing started);
2. make the run folder (``--workdir`` or a temporary one) with a copy of the file,
   the tuner plugin's table and the bootstrap ``sitecustomize.py``;
3. write the plugin's table (a file it cannot take is an error, exit 2) and build (or
   reuse) the C tuner plugin; a plugin that cannot be built: one warning, no plugin door;
4. build the child's environment: the file's NCCL knobs, ``NCCL_TUNER_PLUGIN`` and
   ``NCCL_TUNER_CONFIG_FILE``, the bootstrap first on ``PYTHONPATH``; a variable the
   user already set wins, and one line says which;
5. run the command in its own process group, forwarding SIGINT/SIGTERM/SIGHUP to
   that group, with SIGKILL after a grace period (:func:`kill_grace_s`, stated in one line
   when the first signal is forwarded), and return its exit status (128 + N when it died
   of signal N, or ended with status 0 after signal N);
6. merge the ranks' audit parts into ``--audit FILE`` when asked, with which path NCCL
   took for each collective when the file puts a group on one (:mod:`lagom.runtime.nccl_paths`).

The plugin is not loaded when no entry has a setting it would carry (a file whose groups
run on copy engines or symmetric kernels, which NCCL picks before asking a plugin): a
loaded plugin would change nothing but turn NCCL's own EFFICIENCY re-selection off.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from costmodel.cluster import load_cluster
from lagom.args.knob_args import check_noise
from lagom.files.output_paths import RUN_FOLDER_MARKER, OutputFormat, check_output, write_output
from lagom.files.plugin_export import plugin_entries_from_config, write_plugin_table
from lagom.files.tuned_config import NEWEST_RULES, TunedConfig, absent_group_warning, load_tuned_config
from lagom.online import DEFAULT_BUDGET_STEPS, DEFAULT_TIMEOUT_S, MAX_BUDGET_STEPS
from lagom.orchestration.workload_arg import read_workload_arg
from lagom.runtime import audit, nccl_paths
from lagom.runtime.bootstrap import SITECUSTOMIZE
from lagom.runtime.env import ENV_CONFIG, ENV_HOME, ENV_ONLINE, ENV_RUN_DIR, merge_env
from lagom.runtime.preflight import Preflight, copy_text, preflight
from nccl_env.delivery import online_ceilings, plugin_env
from nccl_env.errors import LagomError
from nccl_env.files import PathKind, check_path_kind
from nccl_env.knob_table import CHANNELS, CTA_POLICY, PATH
from nccl_env.knobs import CommPath, CtaPolicy
from nccl_env.plugin_build import PluginBuildError, build_plugin
from nccl_env.rules import (
    TUNER_SYMBOL_SINCE,
    NcclVersion,
    per_collective_knobs,
    tuner_symbols,
)

PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"  # torch: NCCL Work handles record their durations (docs/reference.md §7)
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LAGOM_HOME = str(Path(__file__).resolve().parents[2])  # the folder that holds the lagom package
TEMP_RUN_PREFIX = "lagom-run-"  # a run folder without --workdir: made in the temp folder, removed after the job
ONLINE_RESULT = "online-tuned.yaml"  # rank 0 writes online tuning's plan here, in the run folder
# After forwarding SIGINT/SIGTERM, how long a job may take to end before SIGKILL: torchrun's own
# agent allows its workers 30 s (torch/distributed/elastic/agent/server/api.py, _shutdown); ours is
# shorter because a user who pressed Ctrl-C waits on it.
KILL_GRACE_S = 10.0
MAX_KILL_GRACE_S = 3600.0  # LAGOM_KILL_GRACE_S at most: an hour
ENV_KILL_GRACE = "LAGOM_KILL_GRACE_S"


@dataclass
class RunSetup:
    """Everything prepared for one run; ``env`` is the child's full environment."""

    config: TunedConfig
    config_path: Path
    run_dir: Path
    env: dict[str, str]
    plugin_path: Path | None = None
    table_path: Path | None = None
    messages: list[str] = field(default_factory=list)  # lines for stderr, in order


def prepare(
    config_path: str | os.PathLike,
    workdir: str | os.PathLike | None = None,
    base_env: dict[str, str] | None = None,
    use_plugin: bool = True,
    nccl_version: NcclVersion | None = None,
    ranks_read_stored: bool = False,
) -> RunSetup:
    """Validate the file, check what the job will need (:mod:`lagom.runtime.preflight`) and lay out the
    run folder and the child's environment.

    ``nccl_version``: the NCCL the job runs (``lagom run --online --nccl-version``);
    default the file's. ``ranks_read_stored``: the ranks load the file's workload and cluster."""
    config = load_tuned_config(config_path, nccl_version)
    config_path = Path(config_path)
    env = dict(os.environ if base_env is None else base_env)
    in_force = nccl_version or config.nccl_version or NEWEST_RULES
    checked = preflight(config, config_path, env, ranks_read_stored,
                        per_collective_knobs(in_force) if use_plugin else frozenset())
    run_dir = run_folder(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix=TEMP_RUN_PREFIX)).resolve()
    try:
        return _lay_out(checked, config_path, run_dir, env, use_plugin, nccl_version)
    except BaseException:
        if workdir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def check_run_folder(workdir: str | os.PathLike) -> Path:
    """``--workdir``'s folder, resolved, refused (LagomError) unless it is new, empty or one an earlier
    ``lagom run`` laid out (:data:`~lagom.files.output_paths.RUN_FOLDER_MARKER`): the run writes lagom.yaml,
    tuner_table.csv, bootstrap/, audit/ there, and a file of the user's by those names is never replaced."""
    text = os.fspath(workdir)
    if not text.strip():
        raise LagomError("--workdir: an empty folder name")
    path = Path(text)
    kind = check_path_kind(path, f"--workdir {text}", folder=True, expected="a folder")  # a FIFO, a loop: refused
    if kind is PathKind.FILE:
        raise LagomError(f"--workdir {text}: is a file, expected a folder")
    if kind is PathKind.FOLDER and not (path / RUN_FOLDER_MARKER).exists():
        try:
            names = sorted(p.name for p in path.iterdir())
        except OSError as exc:
            raise LagomError(f"--workdir {text}: cannot read the folder: {exc.strerror or exc}") from None
        if names:
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise LagomError(f"--workdir {text}: holds files an earlier lagom run did not put there ({shown}); "
                             "give a new or empty folder for the run's files")
    return Path(os.path.realpath(path))


def run_folder(workdir: str | os.PathLike) -> Path:
    """Make (or reuse) ``--workdir``'s folder after :func:`check_run_folder`, marked as a run folder."""
    run_dir = check_run_folder(workdir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / RUN_FOLDER_MARKER).write_text("a lagom run folder: lagom run --workdir may replace its files\n")
    except OSError as exc:
        raise LagomError(f"--workdir {workdir}: cannot create the run folder: {exc.strerror or exc}") from None
    return run_dir


def _lay_out(checked: Preflight, config_path: Path, run_dir: Path, env: dict[str, str], use_plugin: bool,
             nccl_version: NcclVersion | None) -> RunSetup:
    stale = run_dir / audit.AUDIT_PART_DIR
    if stale.is_dir():
        shutil.rmtree(stale)  # parts of an earlier run in the same --workdir
    config = checked.config
    setup = RunSetup(config=config, config_path=config_path, run_dir=run_dir, env=env, messages=list(checked.messages))
    copy = run_dir / "lagom.yaml"
    # --config may be an earlier run's copy; the ranks read the copy, with the file's paths resolved
    if checked.changed or not (copy.exists() and os.path.samefile(config_path, copy)):
        write_output(copy, copy_text(checked, config_path))

    tuned_env = dict(config.env)
    file_version = _file_version(config)
    if (use_plugin and config.collectives and file_version is not None and tuner_symbols(file_version)
            and not plugin_entries_from_config(config)):
        use_plugin = False
        setup.messages.append("lagom run: no collective entry has a setting for the tuner plugin to carry (NCCL picks "
                              "copy engines and symmetric kernels before it asks a plugin): the plugin is not loaded, "
                              "which also leaves NCCL's own EFFICIENCY re-selection on")
    if use_plugin and config.collectives:
        if PLUGIN_ENV in env:
            setup.messages.append(f"lagom run: your {PLUGIN_ENV}={env[PLUGIN_ENV]} wins; the tuned per-collective "
                                  "table is not used")
        else:
            # A table the plugin cannot take is a bad config (exit 2); a plugin that
            # cannot be built only closes this door.
            try:
                setup.table_path = write_plugin_table(config, run_dir / "tuner_table.csv")
            except LagomError as exc:
                raise LagomError(f"{config_path}: {exc}") from None
            try:
                setup.plugin_path = Path(build_plugin()).resolve()
            except PluginBuildError as exc:
                setup.table_path = None
                setup.messages.append(
                    f"lagom run: warning: tuner plugin unavailable ({exc}); per-collective settings are left to NCCL"
                )
            else:
                tuned_env.update(plugin_env(str(setup.plugin_path), str(setup.table_path)))
    merged = merge_env(tuned_env, env)
    if merged.kept:
        setup.messages.append(f"lagom run: {merged.kept_line()}")
    efficiency = int(CtaPolicy.EFFICIENCY)
    if setup.plugin_path is not None and any(CTA_POLICY.value(g.get(CTA_POLICY.key, 0)) & efficiency
                                             for g in config.process_groups.values()):
        setup.messages.append("lagom run: warning: a group asks for CTA policy EFFICIENCY, whose NVLS re-selection "
                              "NCCL skips while a tuner plugin is loaded (enqueue.cc: comm->tuner == NULL); "
                              "run with --no-plugin to keep it")

    write_bootstrap(run_dir, env)
    env[ENV_CONFIG] = str(run_dir / "lagom.yaml")
    entries = f"{len(config.collectives)} collective entr{'y' if len(config.collectives) == 1 else 'ies'}"
    in_force = nccl_version or config.nccl_version
    if setup.plugin_path and in_force is not None and not tuner_symbols(in_force):
        # the NCCL in force: the job's (--online --nccl-version) when given, else the file's
        whose = "the file's" if nccl_version is None else "the job's"
        entries += (f" in tuner plugin {setup.plugin_path}, which {whose} NCCL {in_force} does not load "
                    f"(NCCL >= {min(TUNER_SYMBOL_SINCE.values())}): there the env and process groups carry the "
                    "settings")
    elif setup.plugin_path:
        entries += f" via tuner plugin {setup.plugin_path}"
    doors = [f"{len(config.env)} env knob(s)", f"{len(config.process_groups)} process group(s)", entries]
    setup.messages.insert(0, f"lagom run: applying {config_path}: {', '.join(doors)}")
    return setup


def write_bootstrap(run_dir: Path, env: dict[str, str]) -> None:
    """The ``sitecustomize.py`` every Python process of the job runs (:mod:`lagom.runtime.bootstrap`), first on
    the child's ``PYTHONPATH``, and the variables that say where the run folder and this Lagom are
    (``lagom run`` and ``lagom record``)."""
    bootstrap = run_dir / "bootstrap"
    bootstrap.mkdir(exist_ok=True)
    (bootstrap / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join([str(bootstrap)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_HOME] = LAGOM_HOME


def job_command(words: list[str], example: str) -> list[str]:
    """The job's command line from what argparse left after '--' (LagomError when there is none)."""
    command = words[1:] if words and words[0] == "--" else list(words)
    if not command:
        raise LagomError(f"no command to run: put it after '--', e.g. {example}")
    return command


def check_command(argv: list[str], example: str) -> None:
    """A command to run after '--' that exists (LagomError otherwise: nothing starts)."""
    if not argv:
        raise LagomError(f"no command to run: put it after '--', e.g. {example}")
    if shutil.which(argv[0]) is None:
        raise LagomError(f"command not found (or not executable): {argv[0]}")


def _file_version(config: TunedConfig) -> NcclVersion | None:
    return config.nccl_version


def uses_paths(config: TunedConfig) -> bool:
    """Whether the file puts a group on a path off NCCL's SM kernels (a CTA policy or a path entry)."""
    policies = any(CTA_POLICY.value(g.get(CTA_POLICY.key, 0)) for g in config.process_groups.values())
    return policies or any(PATH.get(e.config) not in (None, CommPath.SM) for e in config.collectives)


def observe_paths(setup: RunSetup) -> bool:
    """Have NCCL write its TUNING lines to the run folder (the user's NCCL_DEBUG* settings win)."""
    mine = [name for name in nccl_paths.DEBUG_VARS if name in setup.env]
    if mine:
        setup.messages.append(f"lagom run: your {', '.join(mine)} wins: the audit cannot read which path NCCL took "
                              f"(it reads NCCL's TUNING log)")
        return False
    setup.env.update(nccl_paths.observation_env(setup.run_dir))
    setup.messages.append(f"lagom run: the audit reads NCCL's TUNING log ({setup.run_dir / nccl_paths.LOG_DIR}) for "
                          "the path NCCL took; NCCL's warnings go there too and are repeated at exit")
    return True


def run_child(argv: list[str], env: dict[str, str], grace_s: float | None = None, stream=None,
              who: str = "lagom run") -> int:
    """Run ``argv`` in its own process group, forwarding SIGINT/SIGTERM/SIGHUP to that group; its exit status.

    The first forwarded signal starts a grace period (``grace_s``, default :func:`kill_grace_s`), stated
    in one line on ``stream``; a job still running at its end gets SIGKILL (its whole process group).
    A child killed by signal N gives 128 + N, as a shell reports it; a child that exits 0 after a
    forwarded signal N gives 128 + N too: the run was stopped, not finished.
    """
    stream = stream if stream is not None else sys.stderr
    grace = kill_grace_s() if grace_s is None else grace_s
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        child = subprocess.Popen(argv, env=env, **group)
    except FileNotFoundError:
        raise LagomError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise LagomError(f"command not executable: {argv[0]}") from None
    forwarded: list[int] = []
    killer: list[threading.Timer] = []

    def kill_group() -> None:
        if child.poll() is None:
            with contextlib.suppress(OSError):
                print(f"{who}: the job did not end within {grace:g} s of {_signal_name(forwarded[0])}: "
                      "SIGKILL sent to it", file=stream, flush=True)
        _kill_tree(child.pid)

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)
        forwarded.append(signum)
        if not killer:
            with contextlib.suppress(OSError):
                print(f"{who}: {_signal_name(signum)} sent to the job; SIGKILL in {grace:g} s if it has not ended",
                      file=stream, flush=True)
            timer = threading.Timer(grace, kill_group)
            timer.daemon = True
            killer.append(timer)
            timer.start()

    previous = {}
    for sig in FORWARDED_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread: signals stay as they are
            break
    try:
        status = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for timer in killer:
            timer.cancel()
        if forwarded and child.poll() is None:  # stopped while waiting (a second Ctrl-C raised): end it now
            _kill_tree(child.pid)
    if status < 0:
        return 128 - status
    return 128 + forwarded[0] if forwarded and status == 0 else status


def _kill_tree(pid: int) -> None:
    """SIGKILL the process ``pid``, its process group and every process descended from it: torchrun starts
    each worker in a session of its own (torch/distributed/elastic/multiprocessing/subprocess_handler/
    subprocess_handler.py, start_new_session=True), which the group's signal does not reach. The
    descendants are read from /proc before anything is killed (a killed parent's children move to init)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])  # field 4, after the command's ")"
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        queue += children.get(current, [])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for member in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(member, signal.SIGKILL)


def kill_grace_s() -> float:
    """Seconds between forwarding a signal to the job and SIGKILL: ``LAGOM_KILL_GRACE_S``, else
    :data:`KILL_GRACE_S`; a value that is not a positive number is bad input (LagomError)."""
    text = os.environ.get(ENV_KILL_GRACE, "").strip()
    if not text:
        return KILL_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_KILL_GRACE_S:
        raise LagomError(f"{ENV_KILL_GRACE}={text}: give seconds, more than 0 and at most {MAX_KILL_GRACE_S:g}")
    return value


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def merge_audit(setup: RunSetup, audit_path: str | os.PathLike,
                paths: nccl_paths.PathReport | None = None) -> tuple[Path, dict]:
    parts = audit.read_parts(setup.run_dir)
    entries_set = [e.config.to_dict() for e in setup.config.collectives]
    document = audit.merge_parts(parts, entries_set, str(setup.config_path))
    if paths is not None:
        document["nccl_paths"] = paths.to_dict()
    return audit.write_audit(audit_path, document), document


def launch(
    config_path: str | os.PathLike | None,
    argv: list[str],
    audit_path: str | os.PathLike | None = None,
    workdir: str | os.PathLike | None = None,
    use_plugin: bool = True,
    stream=None,
    online: OnlineRequest | None = None,
    force: bool = False,
) -> int:
    """The whole of ``lagom run``; returns the child's exit status.

    Every output (``--audit``, ``--save``, ``--workdir``) is checked before the job starts
    (:mod:`lagom.files.output_paths`); ``force`` lets --audit and --save replace a file Lagom did not write."""
    stream = stream if stream is not None else sys.stderr
    check_command(argv, "lagom run --config lagom.yaml -- torchrun train.py")
    grace_s = kill_grace_s()  # a bad LAGOM_KILL_GRACE_S: exit 2 before anything starts
    _check_outputs(config_path, audit_path, workdir, online, force)
    if online is not None:
        setup = prepare_online(online, config_path, workdir)
    elif config_path is None:
        raise LagomError("lagom run needs --config FILE (or --online)")
    else:
        setup = prepare(config_path, workdir, use_plugin=use_plugin)
    keep_run_dir = workdir is not None
    observing = audit_path is not None and uses_paths(setup.config) and observe_paths(setup)
    try:
        for line in setup.messages:
            print(line, file=stream, flush=True)
        with _interrupt_deferred():  # a Ctrl-C after the job waits for the files below to be written
            status = run_child(argv, setup.env, grace_s, stream)
            if online is not None:
                keep_run_dir |= _save_online(setup, online, status, stream, audit_path, not keep_run_dir)
            return _write_audit(setup, audit_path, status, stream, observing)
    finally:
        if not keep_run_dir:
            shutil.rmtree(setup.run_dir, ignore_errors=True)


def _check_outputs(config_path: str | os.PathLike | None, audit_path: str | os.PathLike | None,
                   workdir: str | os.PathLike | None, online: OnlineRequest | None, force: bool) -> None:
    """--audit, --save and --workdir, before anything starts."""
    inputs: list[tuple[str, object]] = [("--config", config_path)]
    if online is not None:
        inputs += [("--simulate", online.simulate), ("--cluster", online.cluster)]
    if audit_path is not None:
        check_output("--audit", audit_path, OutputFormat.AUDIT, inputs, force=force)
    if online is not None and online.save is not None:
        check_output("--save", online.save, OutputFormat.TUNED_CONFIG, inputs, force=force)
        if audit_path is not None and os.path.realpath(online.save) == os.path.realpath(audit_path):
            raise LagomError(f"--save {online.save}: is also --audit's file; give them two names")
    if workdir is not None:
        check_run_folder(workdir)


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[None]:
    """SIGINT while the block runs is remembered and raised as KeyboardInterrupt when it ends (run_child
    forwards it to the job meanwhile): what the job produced is saved before ``lagom run`` stops."""
    caught: list[int] = []
    main_thread = threading.current_thread() is threading.main_thread()  # elsewhere signals stay as they are
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum)) if main_thread else None
    try:
        yield
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _write_audit(setup: RunSetup, audit_path: str | os.PathLike | None, status: int, stream,
                 observing: bool = False) -> int:
    if audit_path is None:
        return status
    paths = nccl_paths.read_logs(setup.run_dir) if observing else None
    if paths is not None:
        for warning in paths.warnings:
            print(warning, file=stream, flush=True)
        print(f"lagom run: {nccl_paths.summary_line(paths)}", file=stream, flush=True)
    try:
        path, document = merge_audit(setup, audit_path, paths)
    except LagomError as exc:  # the job has run: its exit status stands, the audit is lost
        print(f"lagom run: warning: {exc}", file=stream, flush=True)
        return status
    line = (audit.summary_line("all ranks", audit.Summary(**document["summary"])) if "online" not in document
            else audit.online_summary_line("all ranks", document["online"]))
    print(f"lagom run: audit of {document['ranks']} rank(s) written to {path}; " + line.removeprefix("lagom: "),
          file=stream, flush=True)
    absent = absent_group_warning(str(setup.config_path), setup.config,
                                  {s["group"] for s in document.get("signatures", [])}, "the job")
    if absent:  # the job's groups: those its collectives ran in, as the audit counted them
        print(f"lagom run: warning: {absent}", file=stream, flush=True)
    return status


# ---- lagom run --online ---------------------------------------------------------------------


@dataclass(frozen=True)
class OnlineRequest:
    """``lagom run --online``'s options (see lagom/commands/run.py)."""

    save: str | None = None
    budget_steps: int = DEFAULT_BUDGET_STEPS
    nccl_version: NcclVersion | None = None  # --nccl-version, a release (lagom.args.knob_args.parse_nccl_version_arg)
    simulate: str | None = None  # workload spec whose simulated times every rank measures
    cluster: str | None = None
    noise: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    collective_timing: bool = False  # also time each async collective's Work (TORCH_NCCL_ENABLE_TIMING=1)


def _online_version(request: OnlineRequest, seed: TunedConfig | None) -> NcclVersion:
    """--nccl-version, else the seed file's, else the installed NCCL's."""
    chosen = request.nccl_version or (seed.nccl_version if seed is not None else None)
    if chosen is not None:
        return chosen
    from nccl_env.libnccl import find_libnccl, nccl_version

    return nccl_version(find_libnccl().path)


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def prepare_online(request: OnlineRequest, config_path: str | os.PathLike | None,
                   workdir: str | os.PathLike | None) -> RunSetup:
    """Check that online tuning can run here, then lay out the run as for a tuned file (the
    seed, or an empty file when there is none) with the plugin always loaded, the
    communicators' ceilings raised (:func:`nccl_env.delivery.online_ceilings`) and
    ``LAGOM_ONLINE`` naming the settings every rank reads."""
    from lagom.runtime.online import OnlineSettingsFile
    from nccl_env.knob_table import CHUNK_LADDER_MAX_BYTES

    forced = _online_version(request, None) if request.nccl_version else None  # the seed is checked against it
    seed = load_tuned_config(config_path, forced) if config_path is not None else None
    version = forced or _online_version(request, seed)
    if CHANNELS.field not in per_collective_knobs(version):
        raise LagomError(f"lagom run --online needs NCCL >= 2.21 (its tuner plugin changes a collective's channels and "
                         f"algorithm per call); NCCL {version} only takes settings at start: use lagom run --config")
    if not 1 <= request.budget_steps <= MAX_BUDGET_STEPS:
        raise LagomError(f"--budget-steps {request.budget_steps}: must be between 1 and {MAX_BUDGET_STEPS}")
    if request.simulate is not None:
        if not request.cluster:
            raise LagomError(
                "--simulate WORKLOAD needs --cluster C (the cluster whose simulated times the ranks measure)"
            )
        load_cluster(request.cluster)  # a bad cluster: exit 2 before anything starts
        check_noise(float(request.noise))
        _, from_trace = read_workload_arg(request.simulate)  # a bad spec: exit 2 before anything starts
        if from_trace and request.noise:
            raise LagomError("--noise: a trace is replayed from its measured times, which no noise changes; "
                             "drop --noise")
    elif seed is None or not seed.workload or not seed.cluster:
        raise LagomError(
            "lagom run --online needs --config SEED.yaml from lagom tune (it names the workload and cluster), "
            "or --simulate WORKLOAD --cluster C to take step times from the simulator"
        )
    if request.collective_timing and request.simulate is not None:
        raise LagomError("--collective-timing reads the job's own collectives: it does not go with --simulate")
    if PLUGIN_ENV in os.environ:
        raise LagomError(f"lagom run --online changes Lagom's tuner plugin's table: unset {PLUGIN_ENV}")
    scratch = Path(tempfile.mkdtemp(prefix="lagom-seed-"))
    try:
        if config_path is None:
            seed_path = scratch / "seed.yaml"
            TunedConfig(cluster=request.cluster or "", nccl_version=version, workload=request.simulate or "",
                        method="nccl").dump(seed_path)
        else:
            seed_path = Path(config_path)
        setup = prepare(seed_path, workdir, use_plugin=True, nccl_version=version,
                        ranks_read_stored=config_path is not None and request.simulate is None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if config_path is None:  # the empty seed file was ours: do not name it
        setup.messages = [m for m in setup.messages if not m.startswith("lagom run: applying ")]
    if setup.plugin_path is None:
        try:
            setup.plugin_path = Path(build_plugin()).resolve()
        except PluginBuildError as exc:
            raise LagomError(f"lagom run --online needs Lagom's tuner plugin, which did not build: {exc}") from None
        setup.table_path = setup.run_dir / "tuner_table.csv"
        setup.table_path.write_text("")
        setup.env.update(plugin_env(str(setup.plugin_path), str(setup.table_path)))
    ceilings = merge_env(online_ceilings(version, CHUNK_LADDER_MAX_BYTES, dict(seed.env) if seed else {}), setup.env)
    if ceilings.kept:
        setup.messages.append(f"lagom run: {ceilings.kept_line()} (online plans may ask for more; NCCL clamps them)")
    if request.collective_timing:  # opt-in: the collectives' Work handles carry their durations, at a cost
        timing = merge_env({TIMING_ENV: "1"}, setup.env)
        if timing.kept:
            setup.messages.append(f"lagom run: {timing.kept_line()} "
                                  "(without it the online search judges by step time only)")
    settings = OnlineSettingsFile(
        nccl_version=version,
        plugin=str(setup.plugin_path),
        result_path=str(setup.run_dir / ONLINE_RESULT),
        seed_config=str(setup.run_dir / "lagom.yaml") if seed is not None else None,
        simulate=request.simulate,
        cluster=request.cluster,
        noise=float(request.noise),
        budget_steps=request.budget_steps,
        timeout_s=request.timeout_s,
        collective_timing=request.collective_timing,
    )
    setup.env[ENV_ONLINE] = str(settings.write(setup.run_dir / "online.json"))
    if request.simulate:
        clock = f"simulated {request.simulate} on {request.cluster}"
    else:
        clock = "step time from CUDA events on the compute stream" if _has_gpu() else "step time from the host clock"
        if request.collective_timing:
            clock += f", and each async collective's Work duration ({TIMING_ENV}=1: it costs overlap, docs/online.md)"
    setup.messages.append(
        f"lagom run: online tuning on NCCL {version}: seed "
        f"{config_path if seed is not None else 'NCCL defaults'}, at most {request.budget_steps} steps, "
        f"clock: {clock}"
    )
    return setup


def _save_online(setup: RunSetup, request: OnlineRequest, status: int, stream, audit_path,
                 temporary: bool) -> bool:
    """Save the plan online tuning kept, whatever the job's status (a Ctrl-C after tuning ended does not
    lose it): to --save; where that fails, beside the audit (``AUDIT.online-tuned.yaml``), else in the run
    folder, which is then kept. Each case says where. True when the run folder must be kept;
    ``temporary``: the run folder is removed after the job (no --workdir)."""

    def say(line: str) -> None:
        print(f"lagom run: {line}", file=stream, flush=True)

    result = setup.run_dir / ONLINE_RESULT
    if not result.exists():
        if request.save is not None:
            why = "the job failed" if status != 0 else "online tuning did not finish within the job"
            say(f"warning: no tuned plan to save to {request.save} ({why})")
        return False
    after = "" if status == 0 else f" (tuning had ended; the job then exited with status {status})"
    head, what = _online_outcome(result)
    if request.save is None:
        if temporary:
            say(f"{head}; {what} is not kept: give --save FILE to keep it{after}")
        return False
    text = result.read_bytes()
    try:
        write_output(request.save, text, "--save")
    except LagomError as exc:
        say(f"warning: {exc}")
    else:
        say(f"{head}; {what} saved to {request.save}{after} (lagom run --config {request.save} runs it)")
        return False
    if audit_path is not None:
        beside = Path(audit_path).with_name(Path(audit_path).stem + "." + ONLINE_RESULT)
        try:
            check_output("the tuned plan", beside, OutputFormat.TUNED_CONFIG)
            write_output(beside, text)
        except LagomError as exc:
            say(f"warning: {exc}")
        else:
            say(f"tuned plan saved beside the audit instead: {beside}")
            return False
    say(f"tuned plan kept in the run folder instead: {result}")
    return True


def _online_outcome(result: Path) -> tuple[str, str]:
    """What online tuning decided and what its file holds, in words, from the outcome rank 0 wrote beside
    ``result``: ("online tuning kept the seed (the job ran none of the tuned signatures)", "the seed's plan,
    unchanged,")."""
    from lagom.runtime.online import outcome_path

    try:
        outcome = json.loads(outcome_path(result).read_text())
    except (OSError, ValueError):
        return "online tuning ended", "its plan"
    if outcome.get("result") == "kept":
        calls = outcome.get("changed_calls")
        ran = f"; {calls} calls of its {outcome.get('changed')} changed signature(s) measured" if calls else ""
        return (f"online tuning kept its result ({outcome.get('gain', 0.0):.1%} faster than the seed in the A/B, "
                f"past the noise bound {outcome.get('noise_bound', 0.0):.1%}{ran})", "the tuned plan")
    why = f" ({outcome['reason']})" if outcome.get("reason") else ""
    seed = "the seed's plan, unchanged," if outcome.get("seeded") else "NCCL's defaults (the seed)"
    return f"online tuning kept the seed{why}", seed
