"""No input takes the machine down: the bounds of traces/limits.py hold, and are checked before anything is built.

The refusals themselves (one line, exit 2) are rows of test_bad_input_matrix.py; here:
the refusal comes before any allocation (in well under a second, in little memory), the
op estimate a spec is bounded by is an upper bound of what the generator builds, a
gzip trace's JSON size is read from its trailer, and the memory check compares what a
file needs with what is given.
"""

from __future__ import annotations

import gzip
import os
import re
import resource
import subprocess
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

import orjson
import pytest
from conftest import EXAMPLES, REPO_ROOT

from lagom.cli import main
from nccl_env.errors import LagomError
from traces.generate import OPS_PER_LAYER_STEP, PAPER_WORKLOADS, generate_workload, parse_spec
from traces.limits import MAX_OPS, MAX_RANKS, TRACE_MEMORY_PER_JSON_BYTE, check_fits_memory, json_bytes


@pytest.mark.parametrize("spec", ["tp:phi2:tp=8,dp=99999999999", f"fsdp:phi2:gpus={MAX_RANKS + 8}",
                                  "fsdp:phi2:steps=1000000", "ep:olmoe:ep=8,gpus=10000000000",
                                  "fsdp:hidden=64,layers=99999999,ffn=64,heads=1,vocab=10:gpus=8"])
def test_an_oversized_spec_is_refused_before_anything_is_built(spec, capsys):
    main(["simulate", "fsdp:phi2:gpus=8", "--cluster", "high-bw", "--json"])  # imports done: time the check only
    capsys.readouterr()
    tracemalloc.start()
    started = time.perf_counter()
    code = main(["simulate", spec, "--cluster", "high-bw"])
    elapsed_s = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "over Lagom's bound" in err, err
    assert elapsed_s < 0.5 and peak < 5e6, (elapsed_s, peak)


@pytest.mark.parametrize("spec", [*sorted(set(PAPER_WORKLOADS)), "fsdp:hidden=64,layers=1,ffn=64,heads=1,vocab=10",
                                  "tp:phi2:tp=8,dp=2,steps=3", "ep:olmoe:ep=8,gpus=16,steps=2"])
def test_the_op_estimate_bounds_what_the_generator_builds(spec):
    parsed = parse_spec(spec)
    workload = generate_workload(spec)
    ops = len(workload.compute_ops) + len(workload.collectives)
    assert ops <= OPS_PER_LAYER_STEP * parsed.model.layers * parsed.steps, (spec, ops)


def test_the_largest_spec_within_the_bounds_is_accepted():
    layers_steps = MAX_OPS // OPS_PER_LAYER_STEP
    parse_spec(f"fsdp:phi2:gpus={MAX_RANKS},steps={layers_steps // 32}")  # phi-2 has 32 layers
    with pytest.raises(LagomError, match="layers x steps"):
        parse_spec(f"fsdp:phi2:steps={layers_steps // 32 + 1}")


def test_a_gzip_traces_json_size_comes_from_its_trailer(tmp_path):
    trace = EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"
    assert json_bytes(trace) == len(gzip.decompress(trace.read_bytes()))
    plain = tmp_path / "t.json"
    plain.write_bytes(b"{}" * 1000)
    assert json_bytes(plain) == 2000
    tiny = tmp_path / "tiny.json.gz"  # compresses less than JSON usually does: still its own size, not 4 GiB more
    tiny.write_bytes(gzip.compress(b'{"a": 1}'))
    assert json_bytes(tiny) == 8


def test_the_memory_check_compares_the_estimate_with_what_is_available(tmp_path):
    trace = EXAMPLES / "a100_w2_allreduce_broadcast.json.gz"
    needed = json_bytes(trace) * TRACE_MEMORY_PER_JSON_BYTE
    check_fits_memory([trace], trace, TRACE_MEMORY_PER_JSON_BYTE, available=int(needed) + 1)
    with pytest.raises(LagomError, match=r"needs about 0\.0 GB of memory to read, more than the 0\.0 GB available"):
        check_fits_memory([trace], trace, TRACE_MEMORY_PER_JSON_BYTE, available=int(needed) - 1)


@pytest.mark.parametrize("argv", [["bench", "--exhaustive-max-points", "1000000000"],
                                  ["calibrate", "--backend", "sim:low-bw", "--measurements", "1000000",
                                   "-o", "c.yaml"]])
def test_a_budget_of_evaluations_is_bounded(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "100000" in err and not (tmp_path / "c.yaml").exists()


def test_a_gzip_stream_is_bounded_by_what_it_decompresses_to_not_by_its_trailer(tmp_path):
    """A gzip trailer's size wraps at 4 GiB (a 4 MB file of 4 GiB of blanks said 4 MB): the reader
    counts the bytes as they come and stops at the bound, having held no more than it."""
    from nccl_env.files import read_bounded

    limit = 8 << 20
    data = gzip.compress(b" " * (limit + (1 << 20)))
    lying = tmp_path / "lying.json.gz"
    lying.write_bytes(data[:-4] + (100).to_bytes(4, "little"))  # the trailer says 100 bytes
    assert json_bytes(lying) == 100
    tracemalloc.start()
    with pytest.raises(LagomError, match=r"lying.json.gz: a gzip stream that decompresses to more than the "
                                         r"8,388,608 bytes a trace can be here"):
        read_bounded(lying, limit, str(lying), "a trace")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * limit
    whole = tmp_path / "whole.json.gz"
    whole.write_bytes(gzip.compress(b'{"a": 1}') + gzip.compress(b" "))  # two members: both read
    assert read_bounded(whole, limit) == b'{"a": 1} '
    plain = tmp_path / "plain.json"
    plain.write_bytes(b"x" * (limit + 1))
    with pytest.raises(LagomError, match=r"plain.json: 8,388,609 bytes, more than the 8,388,608 a file can be"):
        read_bounded(plain, limit)


def _lagom_under_rlimit_as(limit_bytes: int, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m lagom argv`` in a child whose address space is capped (``ulimit -v``) at ``limit_bytes``."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lagom", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, preexec_fn=cap, timeout=120)


def test_the_memory_check_honours_the_process_own_limit(tmp_path):
    """Issue 31: the check read MemAvailable and the cgroup, not ``ulimit -v``: 256 MiB of blanks in a
    1 MB gzip (1 GB to read) under a 500 MB address space ended in a MemoryError traceback."""
    compressor = zlib.compressobj(1, zlib.DEFLATED, 31)  # wbits 31: a gzip stream
    blanks = b" " * (16 << 20)
    parts = [compressor.compress(b'{"traceEvents": [')]
    parts += [compressor.compress(blanks) for _ in range(16)]
    parts += [compressor.compress(b"]}"), compressor.flush()]
    bomb = tmp_path / "blanks.json.gz"
    bomb.write_bytes(b"".join(parts))
    done = _lagom_under_rlimit_as(500 << 20, "analyze", str(bomb), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert re.fullmatch(r"lagom analyze: error: \S+blanks.json.gz: 0.3 GB of JSON needs about 1.1 GB of memory "
                        r"to read, more than the 0.\d GB available here\n", done.stderr), done.stderr


@pytest.mark.slow
def test_a_memory_error_anywhere_is_one_line_and_exit_2(tmp_path):
    """A workload that outgrows a 300 MB address space while it is built (no estimate guards a spec's
    memory, only its ops): one line, exit 2, never a MemoryError traceback."""
    done = _lagom_under_rlimit_as(300 << 20, "simulate", "tp:phi2:tp=8,dp=2,steps=200", "--cluster", "high-bw",
                                  cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("lagom simulate: error: out of memory") and done.stderr.count("\n") == 1, \
        done.stderr


def test_a_long_event_name_is_cut_where_the_trace_is_read_with_one_warning(tmp_path):
    """Issue 31: a 1 GB kernel name was carried whole through analyze (busy past 300 s); a name is now cut
    to MAX_NAME_CHARS as the events are read, and one line says how many and which was first."""
    from traces.kineto import read_trace
    from traces.kineto_events import MAX_NAME_CHARS

    doc = orjson.loads(gzip.decompress((EXAMPLES / "a100_w2_allreduce_broadcast.json.gz").read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    long_name = "void gemm_kernel<" + "x" * (4 * MAX_NAME_CHARS) + ">"
    for e in kernels[:3]:
        e["name"] = long_name
    trace = tmp_path / "long.json"
    trace.write_bytes(orjson.dumps(doc))
    (workload,) = read_trace(trace)
    names = [op.name for op in workload.compute_ops if op.name.startswith("void gemm_kernel<xx")]
    assert len(names) == 3 and {len(n) for n in names} == {MAX_NAME_CHARS}
    (warning,) = [w for w in workload.input_warnings if "cut" in w]
    assert re.search(r"long.json: 3 event names longer than 16,384 characters cut to that length, first "
                     r"traceEvents\[[\d,]+\] kernel 'void gemm_kernel<x+'\.\.\. \(65,554 characters\)$",
                     warning), warning


@pytest.mark.parametrize("text", [
    "a: yes\nb: no\nc: on\nd: '010'\ne: 010\nf: 0x1f\ng: 1e3\nh: ~\ni: 2001-12-14\nj: \"12\"\nk: |\n  two\n  lines\n"
    "l: [1, 2, {m: .inf}]\nn: -.5\no: 1_000\np: 0b101\nq: 1:30\nr: null\ns: !!str 12\nt:\nu: ''\n",
    "x: &a {k: 1}\ny: *a\nz: [&b 3, *b]\n", "<<: {a: 1}\nb: 2\n", "- a\n- - b\n  - c\n", "just a string", "42", "",
    *[(p).read_text() for p in sorted((REPO_ROOT / "costmodel" / "presets").glob("*.yaml"))],
])
def test_a_yaml_file_reads_as_pyyaml_safe_load_reads_it(text):
    """The tuned-file reader builds documents from libyaml's events (a 200,000-entry file: PyYAML's node
    graph took most of plugin table's time and memory); every value comes out as yaml.safe_load's."""
    import yaml

    from nccl_env.files import load_yaml_text

    want = yaml.safe_load(text)
    got = load_yaml_text(text)
    assert got == want and type(got) is type(want)
