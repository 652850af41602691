"""`lagom plugin build|table|check` and `lagom doctor`, run as subprocesses like a user would."""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lagom.cli import main
from lagom.files.plugin_export import plugin_entries_from_config
from lagom.files.tuned_config import load_tuned_config
from nccl_env import Algorithm, CollectiveType
from nccl_env.libnccl import find_libnccl, nccl_version
from nccl_env.plugin_build import PluginBuildError, build_plugin
from nccl_env.plugin_table import parse_table

REPO = Path(__file__).resolve().parents[1]


def lagom(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "lagom", *args], capture_output=True, text=True, env=full_env,
                          cwd=cwd or REPO, timeout=300)


def test_plugin_build_prints_path_last_and_caches(tmp_path):
    env = {"LAGOM_CACHE_DIR": str(tmp_path / "cache")}
    first = lagom("plugin", "build", env=env)
    assert first.returncode == 0, first.stderr
    so = Path(first.stdout.strip().splitlines()[-1])
    assert so.is_absolute() and so.exists() and so.parent == tmp_path / "cache"
    lib = ctypes.CDLL(str(so))
    assert all(hasattr(lib, f"ncclTunerPlugin_v{v}") for v in range(2, 7))
    assert not hasattr(lib, "parse_table")  # internals stay hidden
    mtime = so.stat().st_mtime_ns
    again = lagom("plugin", "build", env=env)
    assert Path(again.stdout.strip().splitlines()[-1]) == so and so.stat().st_mtime_ns == mtime
    assert json.loads(lagom("plugin", "build", "--json", env=env).stdout) == {"plugin": str(so)}


def test_missing_or_broken_compiler_is_one_line_not_a_crash(tmp_path, monkeypatch):
    proc = lagom("plugin", "build", "--cc", "/nonexistent/cc", env={"LAGOM_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["lagom plugin: error: C compiler '/nonexistent/cc' not found "
                                                "(set CC or pass --cc to a working compiler)"]
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/nowhere/gcc")
    with pytest.raises(PluginBuildError, match="/nowhere/gcc"):
        build_plugin(force=True)
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'lagom_tuner.c:1:1: error: simulated failure' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(PluginBuildError, match="does not compile.*simulated failure"):
        build_plugin(force=True, cc=str(broken))



def test_a_compiler_warning_fails_only_the_strict_build(tmp_path, monkeypatch):
    """A compiler that warns where ours does not (here: gcc with -Wpadded) still gives users a plugin."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc for -Wpadded")
    warning_cc = tmp_path / "newer-cc"
    warning_cc.write_text(f'#!/bin/sh\nexec {gcc} -Wpadded "$@"\n')
    warning_cc.chmod(0o755)
    monkeypatch.setenv("LAGOM_CACHE_DIR", str(tmp_path / "cache"))
    so = build_plugin(force=True, cc=str(warning_cc))
    assert hasattr(ctypes.CDLL(str(so)), "ncclTunerPlugin_v6")
    with pytest.raises(PluginBuildError, match="does not compile"):
        build_plugin(force=True, cc=str(warning_cc), strict=True)

CONFIG = """\
format: lagom.tuned-config
version: 1
cluster: low-bw
nccl_version: "2.30.3"
method: lagom
env: {NCCL_NTHREADS: "256"}
collectives:
  - match: {collective: allgather, group: "dp", min_bytes: 1048576, max_bytes: 1048576, ranks: 8, nodes: 1}
    set: {algorithm: ring, protocol: simple, channels: 2, chunk_bytes: 700416, threads: 256}
  - match: {collective: allgather, group: "tp", min_bytes: 1048576, max_bytes: 1048576, ranks: 8, nodes: 1}
    set: {channels: 6}
  - match: {collective: alltoall, group: "ep"}
    set: {channels: 3}
  - match: {collective: reducescatter}
    set: {protocol: simple}
"""


@pytest.mark.slow
def test_plugin_table_from_tuned_config(tmp_path):
    cfg_path = tmp_path / "lagom.yaml"
    cfg_path.write_text(CONFIG)
    entries = plugin_entries_from_config(load_tuned_config(cfg_path))
    # the 'tp' allgather repeats the 'dp' one's match: the plugin would apply line 1 to both,
    # so the table has no second line (deliver() makes the same choice) and says why
    assert [e.collective for e in entries] == [CollectiveType.ALLGATHER, CollectiveType.REDUCESCATTER]
    assert entries[0].settings.algorithm is Algorithm.RING and entries[0].settings.chunk_bytes == 700416
    proc = lagom("plugin", "table", str(cfg_path))
    assert proc.returncode == 0, proc.stderr
    parsed, warns = parse_table(proc.stdout)
    assert (parsed, warns) == (entries, [])
    comments = [ln for ln in proc.stdout.splitlines() if ln.startswith("#")]
    assert any("entry 2: the plugin cannot tell process groups apart ('dp' and 'tp'" in c for c in comments)
    assert any("alltoall left out" in c for c in comments)
    out = tmp_path / "table.csv"
    proc = lagom("plugin", "table", str(cfg_path), "-o", str(out))
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == out and out.read_text() == lagom(
        "plugin", "table", str(cfg_path)).stdout
    check = lagom("plugin", "check", str(out))
    assert check.returncode == 0 and "2 entries, 0 rejected lines" in check.stdout
    bad = tmp_path / "bad.csv"
    bad.write_text("allreduce,0,-1,ring,simple,4,-1,-1\nallreduce,0,-1,warp,simple,4,-1,-1\n")
    check = lagom("plugin", "check", str(bad))
    assert check.returncode == 1 and "line 2: unknown algorithm 'warp'" in check.stdout
    as_json = lagom("plugin", "check", str(bad), "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["table"] == str(bad) and report["entries"] == 1 and len(report["rejected"]) == 1
    assert report["rejected"][0].startswith("line 2: unknown algorithm 'warp'")
    assert json.loads(lagom("plugin", "check", str(out), "--json").stdout) == {"table": str(out), "entries": 2,
                                                                               "rejected": []}
    missing = lagom("plugin", "table", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml: no such file" in missing.stderr


@pytest.mark.parametrize("match, knobs, message", [
    ("{collective: allreduce}", "{channels: 999}",
     "lagom.yaml: collectives[0]: channels=999 is not valid on NCCL 2.32.6: allowed 1-64"),
    ("{collective: allreduce, min_bytes: 100, max_bytes: 10}", "{channels: 2}",
     "lagom.yaml: cannot make a plugin table"),
    ("{collective: allreduce}", "{channels: true}", "collectives[0]: channels must be an integer, got True"),
    ("{collective: allreduce}", "{chunk_bytes: 1.5}", "collectives[0]: chunk_bytes must be an integer, got 1.5"),
    ("{collective: allreduce}", "{algorithm: bogus}", "collectives[0]: algorithm 'bogus' is not one of tree, ring"),
    ("{collective: allreduce}", "{protocol: 7}", "collectives[0]: protocol 7 is not one of ll, ll128, simple"),
])
def test_plugin_table_bad_config_is_one_line_naming_the_file(tmp_path, match, knobs, message):
    """Values the table cannot carry are refused with the file named; bools and fractions are
    not truncated into a table line (they used to become channels 1 and chunk_bytes=1)."""
    cfg = tmp_path / "lagom.yaml"
    cfg.write_text(f"format: lagom.tuned-config\nversion: 1\ncollectives:\n  - match: {match}\n    set: {knobs}\n")
    proc = lagom("plugin", "table", str(cfg))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and message in proc.stderr and str(cfg) in proc.stderr


def test_doctor_finds_the_wheel_libnccl_and_reads_its_version():
    wheel_version = importlib.metadata.version("nvidia-nccl-cu12")
    lib = find_libnccl()
    assert lib.source == "nvidia-nccl-cu12" and lib.path.name == "libnccl.so.2"
    assert str(nccl_version(lib.path)) == wheel_version
    proc = lagom("doctor", "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, report["problems"]
    assert report["libnccl"]["source"] == "nvidia-nccl-cu12"
    assert report["nccl_version"] == wheel_version
    assert report["nccl_version_code"] == int("{}{:02d}{:02d}".format(*map(int, wheel_version.split("."))))
    assert report["tuner_symbols"][0] == "ncclTunerPlugin_v6"
    assert all(report["strings"][name] for name in ("NCCL_NTHREADS", "NCCL_BUFFSIZE", "NCCL_MIN_CTAS", "NCCL_ALGO"))
    assert report["plugin"]["exports"] == [f"ncclTunerPlugin_v{v}" for v in range(2, 7)]
    human = lagom("doctor")
    assert human.returncode == 0 and wheel_version in human.stdout and "0 problem(s)" in human.stdout


def test_doctor_reports_problems_as_lines(tmp_path):
    not_nccl = tmp_path / "libnotnccl.so"
    not_nccl.write_bytes(b"\x7fELF garbage")
    proc = lagom("doctor", "--cc", "/nonexistent/cc", env={"LAGOM_LIBNCCL": str(not_nccl)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("2 problem(s): NCCL version:") and "cannot load" in last
    assert "C compiler: C compiler '/nonexistent/cc' not found" in last


def test_plugin_table_says_when_its_nccl_loads_no_plugin():
    """A config tuned for NCCL 2.18 (the paper's clusters) gets a table that no NCCL of that
    version reads: the table says so instead of suggesting only the chunk size is lost."""
    from lagom.files.plugin_export import plugin_table_comments
    from lagom.files.tuned_config import parse_tuned_config

    def comments(version: str) -> list[str]:
        return plugin_table_comments(parse_tuned_config({
            "format": "lagom.tuned-config", "version": 1, "nccl_version": version,
            "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 2, "chunk_bytes": 700416}}]}))

    old = comments("2.18.3")
    assert any("NCCL 2.18.3 loads none of the plugin's ABIs" in c and ">= 2.21.0" in c for c in old)
    assert not any("chunk_bytes is applied only" in c for c in old)
    mid = comments("2.24.3")
    assert not any("loads none" in c for c in mid)
    assert any("chunk_bytes is applied only by NCCL >= 2.30.0" in c for c in mid)
    assert not any("loads none" in c or "chunk_bytes is applied only" in c for c in comments("2.30.3"))


def test_unknown_nccl_env_name_in_a_config_is_refused_with_a_suggestion(tmp_path, capsys):
    """A typo NCCL would silently ignore (NCCL_NTHREAD) is an error wherever a config is read."""
    path = tmp_path / "lagom.yaml"
    path.write_text("format: lagom.tuned-config\nversion: 1\nenv: {NCCL_NTHREAD: '256'}\ncollectives: []\n")
    assert main(["plugin", "table", str(path)]) == 2
    err = capsys.readouterr().err
    assert "env NCCL_NTHREAD is refused (did you mean NCCL_NTHREADS?)" in err, err
    path.write_text("format: lagom.tuned-config\nversion: 1\nenv: {NCCL_NTHREADS: '256'}\ncollectives: []\n")
    assert main(["plugin", "table", str(path)]) == 0


@pytest.mark.slow
def test_plugin_table_is_linear_in_its_entries():
    """Issue 31: 200,000 entries took 172 s (each entry was looked up in a list of the point-to-point ones
    it drops, and converted twice). 50,000 entries, half point-to-point: validated and rendered in
    seconds (the YAML text itself: PyYAML's libyaml loader, docs/performance.md)."""
    import time

    from lagom.files.plugin_export import render_plugin_table
    from lagom.files.tuned_config import parse_tuned_config

    n = 50_000
    collectives = [{"match": {"collective": "allgather" if i % 2 else "sendrecv", "group": "0",
                              "min_bytes": 16 * i + 1, "max_bytes": 16 * i + 16, "ranks": 8, "nodes": 1},
                    "set": {"channels": 2 + i % 4}} for i in range(n)]
    doc = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.21.5", "collectives": collectives}
    started = time.process_time()
    text = render_plugin_table(parse_tuned_config(doc, "big.yaml"))
    cpu_s = time.process_time() - started
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == n // 2 and "25000 entries for sendrecv left out" in text
    assert cpu_s < 10, cpu_s  # 5-8 s of CPU on the loaded 2-core machine; the lookup alone took minutes before
