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
   that group, and return its exit status (128 + N when it died of signal N);
6. merge the ranks' audit parts into ``--audit FILE`` when asked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from lagom.plugin_export import write_plugin_table
from lagom.runtime import audit
from lagom.runtime.bootstrap import SITECUSTOMIZE
from lagom.runtime.env import ENV_CONFIG, ENV_HOME, ENV_RUN_DIR, merge_env
from lagom.runtime.process_groups import cta_policy_value
from lagom.tuned_config import TunedConfig, load_tuned_config
from nccl_env.delivery import plugin_env
from nccl_env.errors import LagomError
from nccl_env.plugin_build import PluginBuildError, build_plugin
from nccl_env.rules import TUNER_SYMBOL_SINCE, NcclVersion, tuner_symbols

PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
LAGOM_HOME = str(Path(__file__).resolve().parents[2])  # the folder that holds the lagom package


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


def _check_nccl_version(config: TunedConfig, origin: Path) -> None:
    """A tuned file's nccl_version, when given, must be a NCCL version."""
    if not config.nccl_version:
        return
    try:
        NcclVersion.parse(config.nccl_version)
    except (ValueError, LagomError) as exc:
        raise LagomError(f"{origin}: nccl_version {config.nccl_version!r} is not a NCCL version ({exc})") from None


def _check_process_groups(config: TunedConfig, origin: Path) -> None:
    """Every per-group setting must be one NCCL accepts (checked here, not at group creation)."""
    for name, settings in config.process_groups.items():
        for key, value in settings.items():
            try:
                number = cta_policy_value(value) if key == "cta_policy" else int(value)
            except (TypeError, ValueError) as exc:
                raise LagomError(f"{origin}: process group {name!r}: {key}: {exc}") from None
            if number < 0:
                raise LagomError(f"{origin}: process group {name!r}: {key} must be >= 0, got {number}")


def _check_env(config: TunedConfig, origin: Path) -> None:
    """Env values are single settings: a YAML list or mapping would reach NCCL as text like '[1]'."""
    raw = yaml.safe_load(origin.read_text()) or {}
    for name, value in (raw.get("env") or {}).items():
        if isinstance(value, (list, dict)) or value is None:
            raise LagomError(f"{origin}: env {name}: expected a single value, got {value!r}")


def prepare(
    config_path: str | os.PathLike,
    workdir: str | os.PathLike | None = None,
    base_env: dict[str, str] | None = None,
    use_plugin: bool = True,
) -> RunSetup:
    """Validate the file and lay out the run folder and the child's environment."""
    config_path = Path(config_path)
    config = load_tuned_config(config_path)
    _check_nccl_version(config, config_path)
    _check_process_groups(config, config_path)
    _check_env(config, config_path)
    env = dict(os.environ if base_env is None else base_env)
    if workdir is not None:
        run_dir = Path(workdir).resolve()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LagomError(f"{workdir}: cannot create the run folder: {exc.strerror or exc}") from None
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="lagom-run-")).resolve()
    try:
        return _lay_out(config, config_path, run_dir, env, use_plugin)
    except BaseException:
        if workdir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _lay_out(config: TunedConfig, config_path: Path, run_dir: Path, env: dict[str, str], use_plugin: bool) -> RunSetup:
    stale = run_dir / audit.PART_DIR
    if stale.is_dir():
        shutil.rmtree(stale)  # parts of an earlier run in the same --workdir
    setup = RunSetup(config=config, config_path=config_path, run_dir=run_dir, env=env)
    shutil.copyfile(config_path, run_dir / "lagom.yaml")

    tuned_env = dict(config.env)
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

    bootstrap = run_dir / "bootstrap"
    bootstrap.mkdir(exist_ok=True)
    (bootstrap / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join([str(bootstrap)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_CONFIG] = str(run_dir / "lagom.yaml")
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_HOME] = LAGOM_HOME
    entries = f"{len(config.collectives)} collective entr{'y' if len(config.collectives) == 1 else 'ies'}"
    if setup.plugin_path and config.nccl_version and not tuner_symbols(NcclVersion.parse(config.nccl_version)):
        # the job's own NCCL may be newer than the file's and load the plugin: say both
        entries += (f" in tuner plugin {setup.plugin_path}, which the file's NCCL {config.nccl_version} does not load "
                    f"(NCCL >= {min(TUNER_SYMBOL_SINCE.values())}): there the env and process groups carry the "
                    "settings")
    elif setup.plugin_path:
        entries += f" via tuner plugin {setup.plugin_path}"
    doors = [f"{len(config.env)} env knob(s)", f"{len(config.process_groups)} process group(s)", entries]
    setup.messages.insert(0, f"lagom run: applying {config_path}: {', '.join(doors)}")
    return setup


def run_child(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` in its own process group, forwarding signals; its exit status.

    A child killed by signal N gives 128 + N, as a shell reports it.
    """
    group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    try:
        child = subprocess.Popen(argv, env=env, **group)
    except FileNotFoundError:
        raise LagomError(f"command not found: {argv[0]}") from None
    except PermissionError:
        raise LagomError(f"command not executable: {argv[0]}") from None

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)

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
    return 128 - status if status < 0 else status


def merge_audit(setup: RunSetup, audit_path: str | os.PathLike) -> tuple[Path, dict]:
    parts = audit.read_parts(setup.run_dir)
    entries_set = [e.config.to_dict() for e in setup.config.collectives]
    document = audit.merge_parts(parts, entries_set, str(setup.config_path))
    return audit.write_audit(audit_path, document), document


def launch(
    config_path: str | os.PathLike,
    argv: list[str],
    audit_path: str | os.PathLike | None = None,
    workdir: str | os.PathLike | None = None,
    use_plugin: bool = True,
    stream=None,
) -> int:
    """The whole of ``lagom run``; returns the child's exit status."""
    stream = stream if stream is not None else sys.stderr
    if not argv:
        raise LagomError("no command to run: put it after '--', "
                         "e.g. lagom run --config lagom.yaml -- torchrun train.py")
    if shutil.which(argv[0]) is None:
        raise LagomError(f"command not found (or not executable): {argv[0]}")
    if audit_path is not None and not Path(audit_path).resolve().parent.is_dir():
        raise LagomError(f"{audit_path}: the audit's folder does not exist")
    if audit_path is not None and Path(audit_path).is_dir():
        raise LagomError(f"{audit_path}: is a folder; --audit wants a file name")
    setup = prepare(config_path, workdir, use_plugin=use_plugin)
    try:
        for line in setup.messages:
            print(line, file=stream, flush=True)
        status = run_child(argv, setup.env)
        if audit_path is not None:
            try:
                path, document = merge_audit(setup, audit_path)
            except LagomError as exc:  # the job has run: its exit status stands, the audit is lost
                print(f"lagom run: warning: {exc}", file=stream, flush=True)
                return status
            print(
                f"lagom run: audit of {document['ranks']} rank(s) written to {path}; "
                + audit.summary_line("all ranks", audit.Summary(**document["summary"])).removeprefix("lagom: "),
                file=stream,
                flush=True,
            )
        return status
    finally:
        if workdir is None:
            shutil.rmtree(setup.run_dir, ignore_errors=True)
