"""Peak memory of ``lagom tune`` against the trace's size: a synthetic FSDP-like trace of N kernels.

    python3 bench/tune_memory.py [--kernels 999000] [--keep DIR] [--no-autoccl]
    python3 bench/tune_memory.py --table-entries 200000 [--keep DIR]

Writes one trace with tests/kineto_builder.py's TraceBuilder (one rank of 8; per layer an
all-gather beside two GEMMs, then a reduce-scatter beside a GEMM: four kernels, each with its
launch), runs ``python3 -m lagom tune`` on it under ``/usr/bin/time -v`` and prints the trace's
kernels and JSON bytes, the tune's wall and CPU seconds and its peak resident memory. A search's
memory was the number of evaluations times the trace's ops (every Timing kept: 5.5 GB at 999,000
kernels); now the per-op timings kept are bounded (tuner.objective.FULL_TIMINGS_BYTES).
``--table-entries N`` times ``lagom plugin table`` on a tuned file of N allgather entries instead.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from kineto_builder import TraceBuilder  # noqa: E402  (tests/ is not a package)

AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
LAYERS_PER_STEP = 25  # four kernels a layer: 100 kernels a profiler step


def comm_args(name: str, elements: int) -> dict:
    return {"Collective name": name, "dtype": "BFloat16", "In msg nelems": elements, "Out msg nelems": elements * 8,
            "Process Group Name": "0", "Group size": 8}


def build(kernels: int, path: Path) -> Path:
    b = TraceBuilder(rank=0, world_size=8, device="NVIDIA A100-SXM4-80GB", nccl_version="2.21.5")
    t = 0.0
    layers = kernels // 4
    for layer in range(layers):
        if layer % LAYERS_PER_STEP == 0:
            b.step(layer // LAYERS_PER_STEP, t, LAYERS_PER_STEP * 400.0)
        b.kernel(AG, 20, t, 120.0, grid=(2, 1, 1), block=(512, 1, 1), **comm_args("_allgather_base", 1 << 20))
        b.kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_nn", 7, t + 2, 110.0)
        b.kernel("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", 7, t + 125, 90.0)
        b.kernel(RS, 20, t + 220, 150.0, grid=(2, 1, 1), block=(512, 1, 1), **comm_args("_reduce_scatter_base",
                                                                                        1 << 20))
        t += 400.0
    return b.write(path)


def tuned_file(entries: int, path: Path) -> Path:
    """A tuned file of ``entries`` allgather entries, each its own 16-byte size range (JSON is YAML)."""
    collectives = [{"match": {"collective": "allgather", "group": "0", "min_bytes": 16 * i + 1,
                              "max_bytes": 16 * i + 16, "ranks": 8, "nodes": 1}, "set": {"channels": 2 + i % 4}}
                   for i in range(entries)]
    doc = {"format": "lagom.tuned-config", "version": 1, "nccl_version": "2.21.5", "collectives": collectives}
    path.write_text(json.dumps(doc, indent=1))
    return path


def timed(cmd: list[str]) -> tuple[str, float, float]:
    """``cmd`` under /usr/bin/time -v: its wall time, CPU seconds and peak resident MiB."""
    done = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])

    def field(label: str) -> str:
        match = re.search(rf"{re.escape(label)}: (.+)", done.stderr)
        return match.group(1).strip() if match else "0"

    cpu_s = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return field("Elapsed (wall clock) time (h:mm:ss or m:ss)"), cpu_s, int(field("Maximum resident set size "
                                                                                 "(kbytes)")) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=999_000)
    parser.add_argument("--table-entries", type=int, help="time lagom plugin table on a file of N entries")
    parser.add_argument("--keep", type=Path, help="write the trace here (default: a temporary folder)")
    parser.add_argument("--no-autoccl", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        if args.table_entries:
            config = tuned_file(args.table_entries, folder / f"tuned_{args.table_entries}.yaml")
            wall, cpu_s, peak_mib = timed([sys.executable, "-m", "lagom", "plugin", "table", str(config), "-o",
                                           str(folder / "table.csv"), "--force"])
            print(f"{args.table_entries:,} entries, {config.stat().st_size / 1e6:,.1f} MB: plugin table {wall} wall, "
                  f"{cpu_s:.1f} s CPU, peak {peak_mib:,.0f} MiB")
            return 0
        trace = build(args.kernels, folder / f"fsdp_{args.kernels}.json")
        wall, cpu_s, peak_mib = timed([sys.executable, "-m", "lagom", "tune", str(trace), "--cluster", "a100-nvswitch",
                                       "-o", str(folder / "tuned.yaml"), "--force", "--json"]
                                      + (["--no-autoccl"] if args.no_autoccl else []))
        print(f"{args.kernels:,} kernels, {trace.stat().st_size / 1e6:,.0f} MB of JSON: tune "
              f"{wall} wall, {cpu_s:.0f} s CPU, peak {peak_mib:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
