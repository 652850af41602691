"""The plugin under AddressSanitizer + UndefinedBehaviorSanitizer (and ThreadSanitizer), driven by a C fuzz loop.

tests/c/tuner_fuzz.c is compiled together with the plugin source (one executable, so
the sanitizers see every access) and run as a subprocess: 1,000 random or corrupted
table files, 120,000 random getCollInfo/getChunkSize calls over ABI v2-v6, then four
reader threads against live table swaps. Zero sanitizer reports allowed. A smaller
run under ThreadSanitizer checks the concurrent part (readers, swaps).
tests/c/tuner_swap.c, under both, checks what the concurrent part promises: every
answer comes whole from one of the tables set, the per-entry call counts are exact,
and a communicator init never overwrites a table set through the C API.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from nccl_env.plugin_build import PLUGIN_DIR, SANITIZE_FLAGS, compile_c, find_compiler

DRIVER = Path(__file__).resolve().parent / "c" / "tuner_fuzz.c"
SWAP_DRIVER = DRIVER.with_name("tuner_swap.c")
SAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}
FLAGS = ["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", *SANITIZE_FLAGS, f"-I{PLUGIN_DIR}"]
TSAN_FLAGS = ["-std=c11", "-O1", "-g", "-pthread", "-fsanitize=thread", f"-I{PLUGIN_DIR}"]
TSAN_ENV = {"TSAN_OPTIONS": "halt_on_error=1"}


def _run(exe, *args, cwd):
    env = {**os.environ, **SAN_ENV, "NCCL_DEBUG": "WARN"}  # also exercise the stderr fallback logger
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, errors="replace", timeout=120,
                          cwd=cwd, env=env)


def test_sanitizers_are_live(tmp_path):
    """Negative control: the same flags catch a use-after-free and a signed overflow."""
    src = tmp_path / "bugs.c"
    src.write_text(
        "#include <limits.h>\n#include <stdlib.h>\n"
        "int main(int argc, char** argv) {\n"
        "  (void)argv;\n"
        "  if (argc == 2) { int* a = malloc(8); a[0] = 1; free(a); return a[0]; }\n"
        "  int big = INT_MAX - 1 + argc;\n  return big + argc > 0;\n}\n"
    )
    exe = tmp_path / "bugs"
    compile_c(find_compiler(), [src], exe, [f for f in FLAGS if not f.startswith("-W")])
    uaf = _run(exe, "x", cwd=tmp_path)
    assert uaf.returncode != 0 and "heap-use-after-free" in uaf.stderr
    overflow = _run(exe, cwd=tmp_path)
    assert overflow.returncode != 0 and "signed integer overflow" in overflow.stderr


@pytest.mark.parametrize("seed", [1])
def test_fuzz_under_asan_ubsan_has_no_reports(tmp_path, seed):
    exe = tmp_path / "tuner_fuzz"
    compile_c(find_compiler(), [DRIVER, *sorted(PLUGIN_DIR.glob("*.c"))], exe, [*FLAGS, "-lm"])
    proc = _run(exe, seed, tmp_path, 1000, 100, cwd=tmp_path)
    report = proc.stderr
    assert "AddressSanitizer" not in report and "runtime error" not in report and "LeakSanitizer" not in report
    assert "FUZZ FAILURE" not in report, report[-2000:]
    assert proc.returncode == 0, report[-2000:]
    counts = dict(re.findall(r"(\w+)=(\d+)", proc.stdout))
    assert int(counts["files"]) >= 1000
    assert int(counts["calls"]) >= 100_000
    # the random tables were not all rejected: thousands of entries loaded and applied
    assert int(counts["entries_loaded"]) > 1000 and int(counts["effects"]) > 1000
    assert "lagom-tuner WARN" in report  # NULL logger: warnings went to the stderr fallback


def test_concurrent_calls_and_live_swaps_are_race_free_under_tsan(tmp_path):
    tsan = TSAN_FLAGS
    racy = tmp_path / "racy.c"
    racy.write_text("#include <pthread.h>\nstatic int n;\nstatic void* f(void* a) { (void)a; n++; return 0; }\n"
                    "int main(void) { pthread_t t; pthread_create(&t, 0, f, 0); n++; pthread_join(t, 0);"
                    " return 0; }\n")
    compile_c(find_compiler(), [racy], tmp_path / "racy", tsan)
    env = {**os.environ, **TSAN_ENV}
    control = subprocess.run([str(tmp_path / "racy")], capture_output=True, text=True, env=env, timeout=60)
    assert "ThreadSanitizer: data race" in control.stderr  # the detector works here
    exe = tmp_path / "tuner_fuzz_tsan"
    compile_c(find_compiler(), [DRIVER, *sorted(PLUGIN_DIR.glob("*.c"))], exe, [*tsan, "-Wall", "-Werror", "-lm"])
    proc = subprocess.run([str(exe), "5", str(tmp_path), "50", "50"], capture_output=True, text=True,
                          errors="replace", env=env, timeout=120, cwd=tmp_path)
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 0 and "calls=22500" in proc.stdout


def _swap_run(tmp_path, flags, env, swaps, rounds):
    exe = tmp_path / "tuner_swap"
    compile_c(find_compiler(), [SWAP_DRIVER, *sorted(PLUGIN_DIR.glob("*.c"))], exe, flags)
    proc = subprocess.run([str(exe), str(tmp_path), str(swaps), str(rounds)], check=False, capture_output=True,
                          text=True, errors="replace", env={**os.environ, **env}, timeout=120, cwd=tmp_path)
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, proc.stderr[-3000:]
    assert "SWAP FAILURE" not in proc.stderr and proc.returncode == 0, proc.stderr[-3000:]
    counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", proc.stdout)}
    assert counts["swaps"] >= swaps and counts["race_rounds"] == rounds and counts["exact_calls"] == 8000
    assert counts["lookups"] >= swaps and counts["chunk_calls"] > 0 and counts["counter_reads"] > 0  # overlapped


@pytest.mark.parametrize("sanitizer", ["asan+ubsan", "tsan"])
def test_live_swaps_give_whole_tables_exact_counts_and_keep_api_tables(tmp_path, sanitizer):
    """Readers, a counter reader and communicator inits against swaps by set_table, load_file and reload."""
    if sanitizer == "tsan":
        _swap_run(tmp_path, [*TSAN_FLAGS, "-Wall", "-Wextra", "-Werror"], TSAN_ENV, 300, 40)
    else:
        _swap_run(tmp_path, FLAGS, SAN_ENV, 1000, 100)
