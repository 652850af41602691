"""The bad-input matrix of issues 19 and 24: one row per case, each (command, exit status, first line of stderr).

Every row is a case the code before it (a7c53da) got wrong: it replaced a user's file,
started the job before finding its output unwritable, ate the machine's memory, tuned
CPU-side calls as NCCL collectives, read the current folder for an empty path, or took a
config value NCCL would ignore. Each is now refused in one line, exit 2, before any work:
no file of the scene changes and no job starts (its command would create ``ran``).

The scene (:func:`build_scene`) is a folder of real inputs: a user's own files, a valid tuned
config and its broken variants, the bundled trace and the same trace with its GPU kernels
removed, a sparse 1 TB "trace", workload files with sizes over Lagom's bounds.

Issue 24's rows (:data:`ROWS_24`, after a24a977, which got each wrong: a traceback, a hang, gigabytes
read, a value silently taken, a user's file removed) add what is not a file: FIFOs, a
socket, a symbolic-link loop, ``/dev/zero`` and ``/dev/urandom``, a gzip stream that
decompresses past the bound (:data:`BOMB_LIMIT_BYTES`, the bound lowered for the test), traces
whose kernels' times cannot be, configs giving a key twice, a gzip trace where text is
expected, an output inside an input folder, and a folder holding an earlier recording beside
a user's own trace. The cases a row cannot hold (a file that appears while the command works,
a re-record whose job fails: tests/test_record.py) are tests below the rows.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml
from conftest import EXAMPLES, TEST_DATA

from costmodel.cluster import load_cluster
from lagom.cli import main
from traces.generate import generate_workload
from traces.workload_io import save_workload

TRACE = EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"
CONFIG = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.18.3",
          "env": {"NCCL_NTHREADS": "256"},
          "collectives": [{"match": {"collective": "allgather"}, "set": {"channels": 2}}]}
SIMULATED_JOB = ["--simulate", "tp:phi2:tp=8", "--cluster", "low-bw", "--nccl-version", "2.21.5"]
# Issue 31: env names a tuned file may not set (code run by the loader, any name, a file NCCL writes).
ENV_REFUSED = {"LD_PRELOAD": "./evil.so", "FOO_BAR": "1", "NCCL_DEBUG_FILE": "/tmp/x.%h.log"}


def _config(path: Path, **changes) -> None:
    doc = {**CONFIG, **changes}
    path.write_text(yaml.safe_dump({k: v for k, v in doc.items() if v is not None}, sort_keys=False))


def _workload(path: Path, change) -> None:
    data = generate_workload("tp:phi2:tp=8,dp=1")
    save_workload(data, path)
    doc = orjson.loads(path.read_bytes())
    change(doc)
    path.write_bytes(orjson.dumps(doc))


# The bound on a trace's JSON, lowered for the rows (traces.limits.MAX_TRACE_JSON_BYTES: 64 GiB) so that
# a gzip stream of 48 KB decompressing to 48 MB stands for one of 4 MB decompressing to 4 GiB.
BOMB_LIMIT_BYTES = 32 << 20


def _kernels_changed(path: Path, change, every: bool) -> None:
    """The bundled trace with ``change`` applied to its first 3 kernels, or to every one."""
    doc = orjson.loads(gzip.decompress(TRACE.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    for e in kernels if every else kernels[:3]:
        change(e)
    path.write_bytes(orjson.dumps(doc))


def _negative(event: dict) -> None:
    event["dur"] = -abs(event["dur"]) - 1


def build_scene(d: Path) -> None:
    """The rows' inputs, in the folder ``d`` (also run against earlier code: plain files, no fixture)."""
    (d / "user.txt").write_text("my notes\n")
    (d / "user.png").write_bytes(b"\x89PNG\r\n\x1a\n not Lagom's")
    shutil.copyfile(TRACE, d / "mytrace.json.gz")
    (d / "link.json.gz").symlink_to(d / "mytrace.json.gz")
    _config(d / "cfg.yaml")
    (d / "project").mkdir()  # a folder of the user's: their own lagom.yaml and table
    (d / "project" / "lagom.yaml").write_text("# my own tuned file\n")
    (d / "project" / "tuner_table.csv").write_text("# my table\n")
    cfg_doc = {**CONFIG}
    cfg_doc["colectives"] = cfg_doc.pop("collectives")
    (d / "colectives.yaml").write_text(yaml.safe_dump(cfg_doc))
    _config(d / "nthreads_lots.yaml", env={"NCCL_NTHREADS": "lots"})
    _config(d / "buffsize_neg.yaml", env={"NCCL_BUFFSIZE": "-1"})
    _config(d / "algo_bogus.yaml", env={"NCCL_ALGO": "ring,warp"})
    _config(d / "threads_big.yaml", collectives=[{"match": {"collective": "allgather"}, "set": {"threads": 100000}}])
    _config(d / "ctas_big.yaml", process_groups={"0": {"min_ctas": 999}})
    _config(d / "version_never.yaml", nccl_version="2.29.1")
    (d / "version_float.yaml").write_text(yaml.safe_dump(CONFIG).replace("nccl_version: 2.18.3", "nccl_version: 2.20"))
    cluster = load_cluster("high-bw").to_dict()
    (d / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    (d / "cluster_nodes.yaml").write_text(yaml.safe_dump({**cluster, "nodes": 10**12}))
    # the bundled trace with its GPU kernels removed: only CPU-side calls remain
    doc = orjson.loads(gzip.decompress(TRACE.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    (d / "nokernels.json").write_bytes(orjson.dumps(doc))
    with open(d / "huge.json", "wb") as fh:  # 1 TB, sparse: no disk used
        fh.truncate(1 << 40)

    def big_message(doc):
        doc["collectives"][0]["message_bytes"] = 1 << 50

    _workload(d / "w_message.json", big_message)
    _workload(d / "w_world.json", lambda doc: doc.update(world_size=10**12))
    readonly = d / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    # ---- issue 24: what is not a file
    for name in ("pipe.json", "pipe.yaml", "pipe.csv", "out.fifo", "plot.png.fifo"):
        os.mkfifo(d / name)
    os.mkfifo(d / "plot.png")  # --plot takes .png names only
    (d / "loop_a").symlink_to(d / "loop_b")
    (d / "loop_b").symlink_to(d / "loop_a")
    with socket.socket(socket.AF_UNIX) as sock:  # a socket file stays after its socket closes
        sock.bind(str(d / "sock.json"))
    fifo_dir = d / "fifodir"  # a trace folder whose one trace name is a FIFO
    fifo_dir.mkdir()
    shutil.copyfile(TRACE, fifo_dir / "rank-0.json.gz")
    os.mkfifo(fifo_dir / "rank-1.json")
    (d / "bomb.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (BOMB_LIMIT_BYTES + (16 << 20))
                                                   + b"]}", compresslevel=9))
    # ---- issue 24: trace values that cannot be, configs that give a key twice
    _kernels_changed(d / "neg_all.json", _negative, every=True)
    _kernels_changed(d / "nots_all.json", lambda e: e.pop("ts"), every=True)
    (d / "nan.json").write_text((d / "neg_all.json").read_text().replace('"dur":-', '"dur":NaN,"was":-', 1))
    (d / "dup_env.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False) + "env:\n  NCCL_NTHREADS: '512'\n")
    (d / "dup_cluster.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False) + "nodes: 4\n")
    # ---- issue 24: a user's files beside Lagom's
    (d / "tracedir").mkdir()  # a folder of traces given as an input
    shutil.copyfile(TRACE, d / "tracedir" / "rank-0.json.gz")
    recorded = d / "recorded"  # an earlier lagom record, and a trace of the user's put beside it
    recorded.mkdir()
    shutil.copyfile(TRACE, recorded / "rank-0.json.gz")
    (recorded / "lagom-record.txt").write_text("Written by lagom record\nJob: 1\nTrace: rank-0.json.gz\n")
    (recorded / "rank-7.json.gz").write_bytes(gzip.compress(b"my own trace"))
    # ---- issue 31: a tuned file's env is an allowlist; what an online seed names is checked before launch
    for name, value in ENV_REFUSED.items():
        _config(d / f"env_{name.lower()}.yaml", env={name: value})
    seed = {"nccl_version": "2.21.5", "workload": "tp:phi2:tp=8", "collectives": None}
    _config(d / "seed_no_cluster.yaml", **seed, cluster="no-such-cluster")
    _config(d / "seed_gone_trace.yaml", **{**seed, "workload": "gone/trace.json.gz"}, cluster="low-bw")
    # ---- issue 31: nesting bounded where it is read (2 KB of YAML nested 1,000 deep was a RecursionError)
    (d / "deep.yaml").write_text("format: " + "[" * 1000 + "]" * 1000 + "\n")
    absurd = {"cluster_bw.yaml": ("intra_node", "bw_gb_per_s", 1e-300), "cluster_sms.yaml": ("gpu", "sm_count", 10**12),
              "cluster_gemm.yaml": ("sim", "gemm_efficiency", 2)}  # one cluster validator, physical bounds
    for name, (section, key, bad) in absurd.items():
        doc = load_cluster("high-bw").to_dict()
        doc[section][key] = bad
        (d / name).write_text(yaml.safe_dump(doc))


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Iterator[Path]:
    """Made once for the module: every row leaves it as it found it (the test asserts so)."""
    d = tmp_path_factory.mktemp("scene")
    build_scene(d)
    yield d
    (d / "readonly").chmod(0o755)


def _readonly(d: Path) -> Path:
    """A folder no file can be created in: a read-only one, or /sys for root, which permission bits do not stop."""
    probe = d / "readonly" / "probe"
    try:
        probe.write_text("")
    except OSError:
        return d / "readonly"
    probe.unlink()
    return Path("/sys")


def _run(*flags: str) -> list[str]:
    """``lagom run FLAGS -- touch {d}/ran``: the job leaves ``ran`` in the scene if it ever starts."""
    return ["run", *flags, "--", "touch", "{d}/ran"]


# (id, argv with {d} for the scene folder and {ro} for a read-only folder, exit status, first line of stderr: regex)
ROWS = [
    # ---- files a user owns are never lost
    ("tune -o its own input", ["tune", "{d}/mytrace.json.gz", "-o", "{d}/mytrace.json.gz"], 2,
     r"^lagom tune: error: -o \S+mytrace.json.gz: is also this command's input \(WORKLOAD "),
    ("tune -o a link to its input", ["tune", "{d}/mytrace.json.gz", "-o", "{d}/link.json.gz"], 2,
     r"^lagom tune: error: -o \S+link.json.gz: is also this command's input"),
    ("run --audit its own --config", _run("--config", "{d}/cfg.yaml", "--audit", "{d}/cfg.yaml"), 2,
     r"^lagom run: error: --audit \S+cfg.yaml: is also this command's input \(--config "),
    ("run --workdir a user's folder", _run("--config", "{d}/cfg.yaml", "--workdir", "{d}/project"), 2,
     r"^lagom run: error: --workdir \S+project: holds files an earlier lagom run did not put there "
     r"\(lagom.yaml, tuner_table.csv\)"),
    ("tune -o a user's file", ["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "-o", "{d}/user.txt"], 2,
     r"^lagom tune: error: -o \S+user.txt: exists and is not a tuned config Lagom wrote; give --force"),
    ("calibrate -o a user's file",
     ["calibrate", "--backend", "sim:low-bw", "--measurements", "20", "-o", "{d}/user.txt"],
     2, r"^lagom calibrate: error: -o \S+user.txt: exists and is not a cluster file Lagom wrote; give --force"),
    ("calibrate -o its own --backend file", ["calibrate", "--backend", "sim:{d}/cluster.yaml", "--measurements", "20",
                                             "-o", "{d}/cluster.yaml"], 2,
     r"^lagom calibrate: error: -o \S+cluster.yaml: is also this command's input \(--backend "),
    ("plugin table -o a user's file", ["plugin", "table", "{d}/cfg.yaml", "-o", "{d}/user.txt"], 2,
     r"^lagom plugin: error: -o \S+user.txt: exists and is not a plugin table Lagom wrote; give --force"),
    ("plugin table -o its own config", ["plugin", "table", "{d}/cfg.yaml", "-o", "{d}/cfg.yaml"], 2,
     r"^lagom plugin: error: -o \S+cfg.yaml: is also this command's input \(CONFIG "),
    ("analyze --plot a user's png", ["analyze", "{d}/mytrace.json.gz", "--plot", "{d}/user.png"], 2,
     r"^lagom analyze: error: --plot \S+user.png: exists and is not a plot Lagom wrote; give --force"),
    ("run --audit a user's file", _run("--config", "{d}/cfg.yaml", "--audit", "{d}/user.txt"), 2,
     r"^lagom run: error: --audit \S+user.txt: exists and is not an audit Lagom wrote; give --force"),
    ("run --audit in a read-only folder", _run("--config", "{d}/cfg.yaml", "--audit", "{ro}/audit.json"), 2,
     r"^lagom run: error: --audit \S+audit.json: cannot write in \S+: "),
    ("run --online --save in no folder", _run("--online", *SIMULATED_JOB, "--save", "{d}/no/such/tuned.yaml"), 2,
     r"^lagom run: error: --save \S+tuned.yaml: \S+/no/such is not an existing folder"),
    # ---- no input takes the machine down
    ("simulate 8e11 ranks", ["simulate", "tp:phi2:tp=8,dp=99999999999", "--cluster", "high-bw"], 2,
     r"^lagom simulate: error: workload spec 'tp:phi2:tp=8,dp=99999999999': dp=99,999,999,999 is over Lagom's "
     r"bound of 131,072$"),
    ("simulate 32 million layer steps", ["simulate", "fsdp:phi2:steps=1000000", "--cluster", "high-bw"], 2,
     r"^lagom simulate: error: workload spec 'fsdp:phi2:steps=1000000': layers x steps=32,000,000 is over "),
    ("simulate a 26 TB collective", ["simulate", "fsdp:hidden=1048576,layers=4,ffn=4194304,heads=16,vocab=1000:gpus=8",
                                     "--cluster", "high-bw"], 2,
     r"^lagom simulate: error: workload spec .*: op \d+: message_bytes=[\d,]+ is over Lagom's bound of "),
    ("simulate a workload file's 1 PiB collective", ["simulate", "{d}/w_message.json", "--cluster", "high-bw"], 2,
     r"^lagom simulate: error: \S+w_message.json: not a valid Lagom workload: op \d+: message_bytes="),
    ("simulate a workload file's 10^12 ranks", ["simulate", "{d}/w_world.json", "--cluster", "high-bw"], 2,
     r"^lagom simulate: error: \S+w_world.json: not a valid Lagom workload: world_size must be an integer in "
     r"1\.\.131,072"),
    ("simulate a cluster of 10^12 nodes", ["simulate", "fsdp:phi2", "--cluster", "{d}/cluster_nodes.yaml"], 2,
     r"^lagom simulate: error: \S+cluster_nodes.yaml: nodes=1,000,000,000,000 is over Lagom's bound of "),
    ("analyze a 1 TB trace", ["analyze", "{d}/huge.json"], 2,
     r"^lagom analyze: error: \S+huge.json: 1,099.5 GB of JSON needs about [\d,.]+ GB of memory to read, more "
     r"than the [\d,.]+ GB available here$"),
    ("tune a 1 TB trace", ["tune", "{d}/huge.json", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+huge.json: 1,099.5 GB of JSON needs about "),
    ("tune --budget 10^7", ["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--budget", "10000000", "-o", "{d}/t.yaml"],
     2, r"^lagom tune: error: --budget 10000000: must be between 1 and 100000 evaluations$"),
    ("run --online --budget-steps 10^9", _run("--online", *SIMULATED_JOB, "--budget-steps", "1000000000"), 2,
     r"^lagom run: error: --budget-steps 1000000000: must be between 1 and 1000000$"),
    # ---- a trace Lagom cannot tune is said to be one
    ("tune the trace without its kernels", ["tune", "{d}/nokernels.json", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+nokernels.json: no GPU collective kernel with a size: nothing to tune \(its 21 "
     r"collectives are CPU-side calls"),
    ("tune no_distributed_info", ["tune", str(TEST_DATA / "no_distributed_info.json.gz"), "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+no_distributed_info.json.gz: no GPU collective kernel with a size: nothing to tune"),
    ("tune ''", ["tune", "", "-o", "{d}/t.yaml"], 2, r"^lagom tune: error: WORKLOAD: an empty name"),
    ("analyze ''", ["analyze", ""], 2, r"^lagom analyze: error: an empty path"),
    ("simulate ''", ["simulate", ""], 2, r"^lagom simulate: error: WORKLOAD: an empty name"),
    # ---- every config value is checked where it is read
    ("run --config colectives:", _run("--config", "{d}/colectives.yaml"), 2,
     r"^lagom run: error: \S+colectives.yaml: unknown key 'colectives' \(did you mean 'collectives'\?\)$"),
    ("run --config NCCL_NTHREADS: lots", _run("--config", "{d}/nthreads_lots.yaml"), 2,
     r"^lagom run: error: \S+nthreads_lots.yaml: env NCCL_NTHREADS='lots' is not valid on NCCL 2.18.3: allowed a "
     r"multiple of 32 in 64-512$"),
    ("run --config NCCL_BUFFSIZE: -1", _run("--config", "{d}/buffsize_neg.yaml"), 2,
     r"^lagom run: error: \S+buffsize_neg.yaml: env NCCL_BUFFSIZE='-1' is not valid on NCCL 2.18.3"),
    ("run --config NCCL_ALGO: ring,warp", _run("--config", "{d}/algo_bogus.yaml"), 2,
     r"^lagom run: error: \S+algo_bogus.yaml: env NCCL_ALGO='ring,warp' is not valid on NCCL 2.18.3"),
    ("run --config threads: 100000", _run("--config", "{d}/threads_big.yaml"), 2,
     r"^lagom run: error: \S+threads_big.yaml: collectives\[0\]: threads=100000 is not valid on NCCL 2.18.3"),
    ("run --config min_ctas: 999", _run("--config", "{d}/ctas_big.yaml"), 2,
     r"^lagom run: error: \S+ctas_big.yaml: process group '0': min_ctas=999 is not valid on NCCL 2.18.3"),
    ("run --config nccl_version: 2.20 (a float)", _run("--config", "{d}/version_float.yaml"), 2,
     r"^lagom run: error: \S+version_float.yaml: nccl_version must be a quoted string"),
    ("run --config nccl_version: 2.29.1 (never released)", _run("--config", "{d}/version_never.yaml"), 2,
     r"^lagom run: error: \S+version_never.yaml: nccl_version '2.29.1': NCCL never released 2.29.1 "
     r"\(releases from 2.14.3 to 2.32.6; closest: 2.29.2, 2.29.3, 2.29.7\)$"),
    ("tune --nccl-version 2.18 (no such release)", ["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "--nccl-version",
                                                     "2.18", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: --nccl-version '2.18': NCCL never released 2.18.0 \(.*closest: 2.18.1, 2.18.3, "
     r"2.18.5, 2.18.6\)$"),
    ("run --online --nccl-version 2.30.1", _run("--online", "--simulate", "tp:phi2:tp=8", "--cluster", "low-bw",
                                                "--nccl-version", "2.30.1"), 2,
     r"^lagom run: error: --nccl-version '2.30.1': NCCL never released 2.30.1 .*closest: 2.30.3, 2.30.4, 2.30.7\)$"),
    ("run --online seed threads: 100000", _run("--online", *SIMULATED_JOB, "--config", "{d}/threads_big.yaml"), 2,
     r"^lagom run: error: \S+threads_big.yaml: collectives\[0\]: threads=100000 is not valid on NCCL 2.21.5"),
    ("simulate --config colectives:", ["simulate", "fsdp:phi2", "--cluster", "high-bw", "--config",
                                       "{d}/colectives.yaml"], 2,
     r"^lagom simulate: error: \S+colectives.yaml: unknown key 'colectives' \(did you mean 'collectives'\?\)$"),
    ("simulate --config NCCL_NTHREADS: lots", ["simulate", "fsdp:phi2", "--cluster", "high-bw", "--config",
                                               "{d}/nthreads_lots.yaml"], 2,
     r"^lagom simulate: error: \S+nthreads_lots.yaml: env NCCL_NTHREADS='lots' is not valid"),
    ("plugin table colectives:", ["plugin", "table", "{d}/colectives.yaml"], 2,
     r"^lagom plugin: error: \S+colectives.yaml: unknown key 'colectives'"),
    ("simulate a trace with --noise", ["simulate", "{d}/mytrace.json.gz", "--noise", "0.02"], 2,
     r"^lagom simulate: error: --noise: a trace is replayed from its measured times, which no noise changes"),
    ("simulate --noise 0.7", ["simulate", "fsdp:phi2", "--cluster", "high-bw", "--noise", "0.7"], 2,
     r"^lagom simulate: error: --noise 0.7: a relative noise in \[0, 0.5\)$"),
    # ---- manners: --cluster takes the same values everywhere
    ("bench --cluster a missing file", ["bench", "--cluster", "{d}/no-such-cluster.yaml"], 2,
     r"^lagom bench: error: \S+no-such-cluster.yaml: no such file$"),
]


_FIFO = r"is a FIFO \(named pipe\), expected "
_LOOP = r"is a symbolic link loop, expected "
ROWS_24 = [
    # ---- inputs that are not files: one line, never opened (a FIFO blocked forever, a device read whole)
    ("analyze a FIFO", ["analyze", "{d}/pipe.json"], 2, r"^lagom analyze: error: \S+pipe.json: " + _FIFO),
    ("tune a FIFO", ["tune", "{d}/pipe.json", "-o", "{d}/t.yaml"], 2, r"^lagom tune: error: \S+pipe.json: " + _FIFO),
    ("tune --cluster a FIFO", ["tune", "tp:phi2:tp=8", "--cluster", "{d}/pipe.yaml", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+pipe.yaml: " + _FIFO),
    ("run --config a FIFO", _run("--config", "{d}/pipe.yaml"), 2,
     r"^lagom run: error: \S+pipe.yaml: " + _FIFO),
    ("plugin check a FIFO", ["plugin", "check", "{d}/pipe.csv"], 2, r"^lagom plugin: error: \S+pipe.csv: " + _FIFO),
    ("plugin table a FIFO", ["plugin", "table", "{d}/pipe.yaml"], 2, r"^lagom plugin: error: \S+pipe.yaml: " + _FIFO),
    ("simulate --config a FIFO", ["simulate", "fsdp:phi2", "--cluster", "high-bw", "--config", "{d}/pipe.yaml"], 2,
     r"^lagom simulate: error: \S+pipe.yaml: " + _FIFO),
    ("calibrate --backend a FIFO", ["calibrate", "--backend", "sim:{d}/pipe.yaml", "--measurements", "20", "-o",
                                    "{d}/t.yaml"], 2, r"^lagom calibrate: error: \S+pipe.yaml: " + _FIFO),
    ("analyze a folder whose trace is a FIFO", ["analyze", "{d}/fifodir"], 2,
     r"^lagom analyze: error: \S+fifodir/rank-1.json: " + _FIFO),
    ("analyze /dev/zero", ["analyze", "/dev/zero"], 2,
     r"^lagom analyze: error: /dev/zero: is a character device, expected a regular file or a folder$"),
    ("tune /dev/urandom", ["tune", "/dev/urandom", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: /dev/urandom: is a character device, expected "),
    ("simulate --cluster /dev/zero", ["simulate", "fsdp:phi2", "--cluster", "/dev/zero"], 2,
     r"^lagom simulate: error: /dev/zero: is a character device, expected a regular file$"),
    ("analyze a socket", ["analyze", "{d}/sock.json"], 2,
     r"^lagom analyze: error: \S+sock.json: is a socket, expected "),
    ("analyze a link loop", ["analyze", "{d}/loop_a"], 2, r"^lagom analyze: error: \S+loop_a: " + _LOOP),
    ("run --config a link loop", _run("--config", "{d}/loop_a"), 2,
     r"^lagom run: error: \S+loop_a: " + _LOOP),
    ("analyze a gzip stream past the bound", ["analyze", "{d}/bomb.json.gz"], 2,
     r"^lagom analyze: error: \S+bomb.json.gz: a gzip stream that decompresses to more than the 33,554,432 bytes "
     r"a trace can be here \(stopped reading there\)$"),
    # ---- outputs that are not files: one line before any work (a FIFO blocked, a loop was a traceback)
    ("tune -o a link loop", ["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "-o", "{d}/loop_a"], 2,
     r"^lagom tune: error: -o \S+loop_a: " + _LOOP + "a file name$"),
    ("tune -o a FIFO", ["tune", "tp:phi2:tp=8", "--cluster", "low-bw", "-o", "{d}/out.fifo"], 2,
     r"^lagom tune: error: -o \S+out.fifo: " + _FIFO + "a file name$"),
    ("tune --export-trace a FIFO", ["tune", "{d}/mytrace.json.gz", "-o", "{d}/t.yaml", "--export-trace",
                                    "{d}/pipe.json"], 2, r"^lagom tune: error: --export-trace \S+pipe.json: " + _FIFO),
    ("analyze --plot a FIFO", ["analyze", "{d}/mytrace.json.gz", "--plot", "{d}/plot.png"], 2,
     r"^lagom analyze: error: --plot \S+plot.png: " + _FIFO),
    ("run --audit a FIFO", _run("--config", "{d}/cfg.yaml", "--audit", "{d}/out.fifo"),
     2, r"^lagom run: error: --audit \S+out.fifo: " + _FIFO),
    ("run --audit a link loop", _run("--config", "{d}/cfg.yaml", "--audit", "{d}/loop_a"), 2,
     r"^lagom run: error: --audit \S+loop_a: " + _LOOP),
    ("run --workdir a link loop", _run("--config", "{d}/cfg.yaml", "--workdir", "{d}/loop_a"), 2,
     r"^lagom run: error: --workdir \S+loop_a: " + _LOOP),
    ("run --online --save a link loop", _run("--online", *SIMULATED_JOB, "--save", "{d}/loop_a"), 2,
     r"^lagom run: error: --save \S+loop_a: " + _LOOP),
    ("record -o a link loop", ["record", "-o", "{d}/loop_a", "--", "touch", "{d}/ran"], 2,
     r"^lagom record: error: -o \S+loop_a: " + _LOOP),
    ("calibrate -o a FIFO", ["calibrate", "--backend", "sim:low-bw", "--measurements", "20", "-o", "{d}/out.fifo"], 2,
     r"^lagom calibrate: error: -o \S+out.fifo: " + _FIFO),
    ("plugin table -o a link loop", ["plugin", "table", "{d}/cfg.yaml", "-o", "{d}/loop_a"], 2,
     r"^lagom plugin: error: -o \S+loop_a: " + _LOOP),
    # ---- values that cannot be: refused, never folded into a plan
    ("tune a trace whose kernels all have negative durations", ["tune", "{d}/neg_all.json", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+neg_all.json: 2,700 of [\d,]+ timed events have a time that cannot be \(no ts or a "
     r"negative duration\), first traceEvents\[[\d,]+\] kernel '.+' ts=[\d.]+ dur=-[\d.]+; more than 1%: not read$"),
    ("analyze a trace whose kernels have no ts", ["analyze", "{d}/nots_all.json"], 2,
     r"^lagom analyze: error: \S+nots_all.json: 2,700 of [\d,]+ timed events have a time that cannot be .* no ts "),
    ("analyze a NaN duration", ["analyze", "{d}/nan.json"], 2,
     r"^lagom analyze: error: \S+nan.json: not valid JSON \(.*\): a NaN time or value, in the event "
     r"\{\"ph\":\"X\",\"cat\":\"kernel\""),
    ("run --config two env keys", _run("--config", "{d}/dup_env.yaml"), 2,
     r"^lagom run: error: \S+dup_env.yaml: not valid YAML: duplicate key 'env' \(lines 4 and 11\)$"),
    ("simulate --cluster two nodes keys", ["simulate", "fsdp:phi2", "--cluster", "{d}/dup_cluster.yaml"], 2,
     r"^lagom simulate: error: \S+dup_cluster.yaml: not valid YAML: duplicate key 'nodes' "),
    ("plugin table a gzip trace", ["plugin", "table", "{d}/mytrace.json.gz"], 2,
     r"^lagom plugin: error: \S+mytrace.json.gz: is gzip-compressed data \(a trace\?\), expected a YAML file$"),
    ("tune --cluster a gzip trace", ["tune", "tp:phi2:tp=8", "--cluster", "{d}/mytrace.json.gz", "-o", "{d}/t.yaml"],
     2, r"^lagom tune: error: \S+mytrace.json.gz: is gzip-compressed data \(a trace\?\)"),
    # ---- a user's files beside Lagom's
    ("record -o a folder with a user's rank-7.json.gz beside an earlier recording",
     ["record", "-o", "{d}/recorded", "--", "touch", "{d}/ran"], 2,
     r"^lagom record: error: -o \S+recorded: holds files lagom record did not write \(rank-7.json.gz\)"),
    ("tune DIR --export-trace DIR/pred.json.gz", ["tune", "{d}/tracedir", "-o", "{d}/t.yaml", "--export-trace",
                                                  "{d}/tracedir/pred.json.gz"], 2,
     r"^lagom tune: error: --export-trace \S+pred.json.gz: is inside this command's input folder \(WORKLOAD "),
    ("analyze DIR --plot DIR/plot.png", ["analyze", "{d}/tracedir", "--plot", "{d}/tracedir/plot.png"], 2,
     r"^lagom analyze: error: --plot \S+plot.png: is inside this command's input folder \(PATH "),
]
_DEEP = r"deep.yaml: not valid YAML: nested more than 64 levels deep \(line 1\)$"
ROWS_31_BOUNDS = [
    # ---- issue 31: bounds from the process's view
    ("plugin table a YAML nested 1,000 deep", ["plugin", "table", "{d}/deep.yaml"], 2,
     r"^lagom plugin: error: \S+" + _DEEP),
    ("simulate --cluster a YAML nested 1,000 deep", ["simulate", "fsdp:phi2", "--cluster", "{d}/deep.yaml"], 2,
     r"^lagom simulate: error: \S+" + _DEEP),
    ("run --config a YAML nested 1,000 deep", _run("--config", "{d}/deep.yaml"), 2,
     r"^lagom run: error: \S+" + _DEEP),
    ("simulate a cluster of 1e-300 GB/s links", ["simulate", "fsdp:phi2", "--cluster", "{d}/cluster_bw.yaml"], 2,
     r"^lagom simulate: error: \S+cluster_bw.yaml: 'intra_node.bw_gb_per_s' = 1e-300 is outside the physical range "
     r"0.1..10,000$"),
    ("tune a cluster of 10^12 SMs", ["tune", "fsdp:phi2", "--cluster", "{d}/cluster_sms.yaml", "-o", "{d}/t.yaml"], 2,
     r"^lagom tune: error: \S+cluster_sms.yaml: 'gpu.sm_count' = 1000000000000 is outside the physical range "
     r"1..1,024$"),
    ("tune sim.gemm_efficiency: 2", ["tune", "fsdp:phi2", "--cluster", "{d}/cluster_gemm.yaml", "-o", "{d}/t.yaml"],
     2, r"^lagom tune: error: \S+cluster_gemm.yaml: 'sim.gemm_efficiency' is a fraction: must be in \(0, 1\]"),
    ("bench --cluster sim.gemm_efficiency: 2", ["bench", "--quick", "--cluster", "{d}/cluster_gemm.yaml"], 2,
     r"^lagom bench: error: \S+cluster_gemm.yaml: 'sim.gemm_efficiency' is a fraction"),
    ("calibrate a cluster of 10^12 SMs", ["calibrate", "--backend", "sim:{d}/cluster_sms.yaml", "--measurements", "20",
                                          "-o", "{d}/t.yaml"], 2,
     r"^lagom calibrate: error: \S+cluster_sms.yaml: 'gpu.sm_count' = 1000000000000 is outside "),
    ("run --online --cluster 1e-300 GB/s links", _run("--online", "--simulate", "tp:phi2:tp=8", "--cluster",
                                                      "{d}/cluster_bw.yaml"), 2,
     r"^lagom run: error: \S+cluster_bw.yaml: 'intra_node.bw_gb_per_s' = 1e-300 is outside "),
]
ROWS += ROWS_24 + ROWS_31_BOUNDS

_REFUSED = r"is refused: a tuned file's env may set only the NCCL knobs Lagom tunes \(NCCL_ALGO, "
# Issue 31's rows (each wrong on b8c6fd7: the job started with the variable set, or the ranks died inside).
ROWS_31 = [
    *((f"run --config env {name}", _run("--config", f"{{d}}/env_{name.lower()}.yaml"),
       2, rf"^lagom run: error: \S+env_{name.lower()}.yaml: env {name} {_REFUSED}") for name in ENV_REFUSED),
    ("simulate --config env LD_PRELOAD", ["simulate", "fsdp:phi2", "--cluster", "high-bw", "--config",
                                          "{d}/env_ld_preload.yaml"], 2,
     rf"^lagom simulate: error: \S+env_ld_preload.yaml: env LD_PRELOAD {_REFUSED}"),
    ("plugin table env NCCL_DEBUG_FILE", ["plugin", "table", "{d}/env_nccl_debug_file.yaml"], 2,
     rf"^lagom plugin: error: \S+env_nccl_debug_file.yaml: env NCCL_DEBUG_FILE {_REFUSED}"),
    ("run --online seed env FOO_BAR", _run("--online", *SIMULATED_JOB, "--config", "{d}/env_foo_bar.yaml"), 2,
     rf"^lagom run: error: \S+env_foo_bar.yaml: env FOO_BAR {_REFUSED}"),
    ("run --online seed cluster: no-such-cluster", _run("--online", "--config", "{d}/seed_no_cluster.yaml"), 2,
     r"^lagom run: error: \S+seed_no_cluster.yaml: cluster: unknown cluster 'no-such-cluster': not a file and not "
     r"a preset"),
    ("run --online seed workload: a missing trace", _run("--online", "--config", "{d}/seed_gone_trace.yaml"), 2,
     r"^lagom run: error: \S+seed_gone_trace.yaml: workload gone/trace.json.gz: no such file relative to the "
     r"file's folder \(\S+\), where a tuned file's paths resolve$"),
]
ROWS += ROWS_31


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != "huge.json"}


def _timeout(signum, frame):
    raise TimeoutError("the command blocked (a FIFO opened?)")


@pytest.mark.parametrize("argv, status, first_line", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_before_any_work(scene, capsys, monkeypatch, argv, status, first_line):
    monkeypatch.setattr("traces.limits.MAX_TRACE_JSON_BYTES", BOMB_LIMIT_BYTES)
    ro = _readonly(scene)
    before = _snapshot(scene)
    args = [a.format(d=scene, ro=ro) for a in argv]
    previous = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(60)
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == status, err
    assert lines and re.search(first_line, lines[0]), err
    assert len([line for line in lines if "error" in line]) == 1, err
    assert "Traceback" not in err
    assert not (scene / "ran").exists(), "the job started"
    assert _snapshot(scene) == before, "a file of the scene changed"
    assert not any(scene.glob("t.yaml")) and not (scene / "no").exists()


def test_every_issue_19_row_names_a_command_lagom_has():
    from lagom.cli import COMMANDS

    assert {r[1][0] for r in ROWS} <= set(COMMANDS)
    assert len({r[0] for r in ROWS}) == len(ROWS)


def test_an_output_that_appears_during_the_work_is_kept_and_the_new_one_written_beside(scene, tmp_path, capsys):
    """Issue 24: a file the user (here, the job itself) creates at an output while the command works was
    replaced without a word; the check happened only before the work."""
    audit = tmp_path / "audit.json"
    code = main(["run", "--config", str(scene / "cfg.yaml"), "--audit", str(audit), "--", "sh", "-c",
                 f"echo mine > {audit}"])
    err = capsys.readouterr().err
    assert code == 0, err  # the job's status: the audit is a warning
    assert audit.read_text() == "mine\n"
    assert f"{audit}: appeared or changed since this command checked it" in err and f"{audit}.new" in err
    assert '"format": "lagom.audit"' in (tmp_path / "audit.json.new").read_text()
    forced = main(["run", "--config", str(scene / "cfg.yaml"), "--audit", str(audit), "--force", "--", "sh", "-c",
                   f"echo again > {audit}"])
    assert forced == 0 and '"format": "lagom.audit"' in audit.read_text()


def test_a_few_kernels_whose_time_cannot_be_are_dropped_with_one_warning(tmp_path, capsys):
    """Three kernels of 2,700 with negative durations: read without them, one line says so (all of
    them: refused, a row above)."""
    trace = tmp_path / "neg3.json"
    _kernels_changed(trace, _negative, every=False)
    code = main(["analyze", str(trace), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    (line,) = [line for line in err.splitlines() if "dropped" in line]
    assert re.match(r"^warning: \S+neg3.json: dropped 3 of [\d,]+ timed events whose time cannot be \(no ts or a "
                    r"negative duration\), first traceEvents\[[\d,]+\] kernel ", line), line
    from traces.kineto import read_trace

    (workload,) = read_trace(trace)
    (whole,) = read_trace(TRACE)
    assert len(workload.compute_ops) + len(workload.collectives) == len(whole.compute_ops) + len(whole.collectives) - 3

