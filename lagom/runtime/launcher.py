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
6. merge the ranks' audit parts into ``--audit FILE`` when asked, with which path NCCL
   took for each collective when the file puts a group on one (:mod:`lagom.runtime.nccl_paths`).

The plugin is not loaded when no entry has a setting it would carry (a file whose groups
run on copy engines or symmetric kernels, which NCCL picks before asking a plugin): a
loaded plugin would change nothing but turn NCCL's own EFFICIENCY re-selection off.
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

from costmodel.cluster import load_cluster
from lagom.online import DEFAULT_BUDGET_STEPS, DEFAULT_TIMEOUT_S
from lagom.plugin_export import plugin_entries_from_config, write_plugin_table
from lagom.runtime import audit, nccl_paths
from lagom.runtime.bootstrap import SITECUSTOMIZE
from lagom.runtime.env import ENV_CONFIG, ENV_HOME, ENV_ONLINE, ENV_RUN_DIR, merge_env
from lagom.runtime.process_groups import cta_policy_value
from lagom.tuned_config import TunedConfig, load_tuned_config
from nccl_env.delivery import online_ceilings, plugin_env
from nccl_env.errors import LagomError
from nccl_env.knobs import CommPath, CtaPolicy
from nccl_env.plugin_build import PluginBuildError, build_plugin
from nccl_env.rules import (
    TUNER_SYMBOL_SINCE,
    NcclVersion,
    per_collective_knobs,
    tuner_symbols,
)

PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
TIMING_ENV = "TORCH_NCCL_ENABLE_TIMING"  # torch: NCCL Work handles record their durations (ONLINE.md "PyTorch")
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
    nccl_version: NcclVersion | None = None,
) -> RunSetup:
    """Validate the file and lay out the run folder and the child's environment.

    ``nccl_version``: the NCCL the job runs (``lagom run --online --nccl-version``);
    default the file's."""
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
        return _lay_out(config, config_path, run_dir, env, use_plugin, nccl_version)
    except BaseException:
        if workdir is None:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _lay_out(config: TunedConfig, config_path: Path, run_dir: Path, env: dict[str, str], use_plugin: bool,
             nccl_version: NcclVersion | None) -> RunSetup:
    stale = run_dir / audit.PART_DIR
    if stale.is_dir():
        shutil.rmtree(stale)  # parts of an earlier run in the same --workdir
    setup = RunSetup(config=config, config_path=config_path, run_dir=run_dir, env=env)
    shutil.copyfile(config_path, run_dir / "lagom.yaml")

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
    if setup.plugin_path is not None and any(cta_policy_value(g.get("cta_policy", 0)) & efficiency
                                             for g in config.process_groups.values()):
        setup.messages.append("lagom run: warning: a group asks for CTA policy EFFICIENCY, whose NVLS re-selection "
                              "NCCL skips while a tuner plugin is loaded (enqueue.cc: comm->tuner == NULL); "
                              "run with --no-plugin to keep it")

    bootstrap = run_dir / "bootstrap"
    bootstrap.mkdir(exist_ok=True)
    (bootstrap / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env["PYTHONPATH"] = os.pathsep.join([str(bootstrap)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[ENV_CONFIG] = str(run_dir / "lagom.yaml")
    env[ENV_RUN_DIR] = str(run_dir)
    env[ENV_HOME] = LAGOM_HOME
    entries = f"{len(config.collectives)} collective entr{'y' if len(config.collectives) == 1 else 'ies'}"
    in_force = nccl_version or (NcclVersion.parse(config.nccl_version) if config.nccl_version else None)
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


def _file_version(config: TunedConfig) -> NcclVersion | None:
    return NcclVersion.parse(config.nccl_version) if config.nccl_version else None


def uses_paths(config: TunedConfig) -> bool:
    """Whether the file puts a group on a path off NCCL's SM kernels (a CTA policy or a path entry)."""
    policies = any(cta_policy_value(g.get("cta_policy", 0)) for g in config.process_groups.values())
    return policies or any(e.config.path not in (None, CommPath.SM) for e in config.collectives)


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
    if online is not None:
        setup = prepare_online(online, config_path, workdir)
    elif config_path is None:
        raise LagomError("lagom run needs --config FILE (or --online)")
    else:
        setup = prepare(config_path, workdir, use_plugin=use_plugin)
    observing = audit_path is not None and uses_paths(setup.config) and observe_paths(setup)
    try:
        for line in setup.messages:
            print(line, file=stream, flush=True)
        status = run_child(argv, setup.env)
        if online is not None:
            _save_online(setup, online, status, stream)
        if audit_path is not None:
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
            print(
                f"lagom run: audit of {document['ranks']} rank(s) written to {path}; " + line.removeprefix("lagom: "),
                file=stream,
                flush=True,
            )
        return status
    finally:
        if workdir is None:
            shutil.rmtree(setup.run_dir, ignore_errors=True)


# ---- lagom run --online ---------------------------------------------------------------------


@dataclass(frozen=True)
class OnlineRequest:
    """``lagom run --online``'s options (see lagom/commands/run.py)."""

    save: str | None = None
    budget_steps: int = DEFAULT_BUDGET_STEPS
    nccl_version: str | None = None
    simulate: str | None = None  # workload spec whose simulated times every rank measures
    cluster: str | None = None
    noise: float = 0.0
    timeout_s: float = DEFAULT_TIMEOUT_S


def _online_version(request: OnlineRequest, seed: TunedConfig | None) -> NcclVersion:
    """--nccl-version, else the seed file's, else the installed NCCL's."""
    text = request.nccl_version or (seed.nccl_version if seed is not None else "")
    if text:
        try:
            return NcclVersion.parse(text)
        except (ValueError, LagomError) as exc:
            raise LagomError(f"--nccl-version {text!r} is not a NCCL version ({exc})") from None
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
    from lagom import tuning
    from lagom.runtime.online import OnlineSettingsFile
    from tuner.space import CHUNK_MAX_BYTES

    seed = load_tuned_config(Path(config_path)) if config_path is not None else None
    version = _online_version(request, seed)
    if "channels" not in per_collective_knobs(version):
        raise LagomError(f"lagom run --online needs NCCL >= 2.21 (its tuner plugin changes a collective's channels and "
                         f"algorithm per call); NCCL {version} only takes settings at start: use lagom run --config")
    if request.budget_steps < 1:
        raise LagomError(f"--budget-steps {request.budget_steps}: must be at least 1")
    if request.simulate is not None:
        if not request.cluster:
            raise LagomError(
                "--simulate WORKLOAD needs --cluster C (the cluster whose simulated times the ranks measure)"
            )
        cluster = tuning.with_nccl_version(load_cluster(request.cluster), str(version))
        tuning.load_workload_arg(request.simulate, cluster)  # a bad spec: exit 2 before anything starts
        if not (isinstance(request.noise, float | int) and 0 <= request.noise < 0.5):
            raise LagomError(f"--noise {request.noise}: a relative noise in [0, 0.5)")
    elif not _has_gpu():
        raise LagomError(
            "lagom run --online measures the job's steps on a GPU; none here: "
            "use --simulate WORKLOAD --cluster C to take step times from the simulator"
        )
    elif seed is None or not seed.workload or not seed.cluster:
        raise LagomError(
            "lagom run --online on a GPU needs --config SEED.yaml from lagom tune (it names the workload and cluster)"
        )
    if PLUGIN_ENV in os.environ:
        raise LagomError(f"lagom run --online changes Lagom's tuner plugin's table: unset {PLUGIN_ENV}")
    scratch = Path(tempfile.mkdtemp(prefix="lagom-seed-"))
    try:
        if config_path is None:
            seed_path = scratch / "seed.yaml"
            TunedConfig(cluster=request.cluster or "", nccl_version=str(version), workload=request.simulate or "",
                        method="nccl").dump(seed_path)
        else:
            seed_path = Path(config_path)
        setup = prepare(seed_path, workdir, use_plugin=True, nccl_version=version)
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
    ceilings = merge_env(online_ceilings(version, CHUNK_MAX_BYTES, dict(seed.env) if seed else {}), setup.env)
    if ceilings.kept:
        setup.messages.append(f"lagom run: {ceilings.kept_line()} (online plans may ask for more; NCCL clamps them)")
    if request.simulate is None:  # on a GPU: the collectives' Work handles carry their durations
        timing = merge_env({TIMING_ENV: "1"}, setup.env)
        if timing.kept:
            setup.messages.append(f"lagom run: {timing.kept_line()} "
                                  "(without it the online search judges by step time only)")
    settings = OnlineSettingsFile(
        nccl_version=str(version),
        plugin=str(setup.plugin_path),
        result_path=str(setup.run_dir / "online-tuned.yaml"),
        seed_config=str(setup.run_dir / "lagom.yaml") if seed is not None else None,
        simulate=request.simulate,
        cluster=request.cluster,
        noise=float(request.noise),
        budget_steps=request.budget_steps,
        timeout_s=request.timeout_s,
    )
    setup.env[ENV_ONLINE] = str(settings.write(setup.run_dir / "online.json"))
    clock = f"simulated {request.simulate} on {request.cluster}" if request.simulate else "CUDA events"
    setup.messages.append(
        f"lagom run: online tuning on NCCL {version}: seed "
        f"{config_path if seed is not None else 'NCCL defaults'}, at most {request.budget_steps} steps, "
        f"clock: {clock}"
    )
    return setup


def _save_online(setup: RunSetup, request: OnlineRequest, status: int, stream) -> None:
    if request.save is None:
        return
    result = setup.run_dir / "online-tuned.yaml"
    if status != 0 or not result.exists():
        print(
            f"lagom run: warning: no tuned plan to save to {request.save} "
            f"({'the job failed' if status != 0 else 'online tuning did not finish within the job'})",
            file=stream,
            flush=True,
        )
        return
    try:
        shutil.copyfile(result, request.save)
    except OSError as exc:
        raise LagomError(f"{request.save}: cannot write the tuned file: {exc.strerror or exc}") from None
    print(
        f"lagom run: tuned plan saved to {request.save} (lagom run --config {request.save} starts tuned)",
        file=stream,
        flush=True,
    )
