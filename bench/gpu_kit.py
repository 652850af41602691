"""The one-GPU kit: measure on one CUDA GPU what Lagom's contention mechanism assumes.

    python3 bench/gpu_kit.py --out DIR [--no-nccl]
    python3 bench/gpu_kit.py --out DIR --simulate PRESET     # the simulator's GPU: no CUDA needed

In under five minutes on one GPU (docs/gpu_kit.md): a bf16 GEMM alone and beside a
kernel that streams memory on k CTAs (k = 1 .. the CTA ceiling, the stand-in for k NCCL
channels), beside a copy-engine copy, and beside both; the streaming kernel's and the
copy's rates alone; a step timed by CUDA events against the host clock; and Lagom's tuner
plugin loaded into the real libnccl on a one-rank communicator, read back from NCCL's own
log. It writes:

- ``DIR/cluster.yaml``: a cluster file (the preset of this GPU, its ``gpu`` and ``sim``
  efficiencies replaced by the measured ones) that ``--cluster`` and ``lagom calibrate
  --backend sim:DIR/cluster.yaml`` read;
- ``DIR/kit.json``: every measurement, the fitted figures, the simulator's prediction
  for the same plan beside each measured slowdown, and the NCCL log's findings.

Without CUDA it says so in one line and exits 2; ``--simulate`` runs the same kit on the
simulator's GPU (its tests: tests/test_gpu_kit.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_kit_device import (  # noqa: E402
    Beside,
    CudaDevice,
    Device,
    DeviceInfo,
    SimDevice,
    cuda_missing,
    gemm_flops,
    median,
)

from costmodel.cluster import ClusterSpec, load_cluster, preset_names  # noqa: E402
from costmodel.gpu_specs import DeviceFacts, gpu_spec, match_gpu  # noqa: E402
from nccl_env.errors import LagomError  # noqa: E402

CLUSTER_HEADER = "# Lagom cluster file"  # what lagom calibrate writes first (lagom.commands.calibrate)
CLOCK_STEPS = 20
DEFAULT_CTA_CEILING = 64  # NCCL's MAXCHANNELS from 2.25 (docs/reference.md §3)


@dataclass(frozen=True)
class SweepPoint:
    """One k of the sweep: the streaming kernel alone on k CTAs, and the GEMM beside it (and the copy)."""

    ctas: int
    stream_alone_gb_per_s: float
    gemm_beside_stream_us: float
    gemm_beside_both_us: float


@dataclass(frozen=True)
class KitMeasurements:
    device: DeviceInfo
    gemm_alone_us: float
    gemm_beside_copy_us: float
    copy_alone_gb_per_s: float
    saturating_ctas: int
    stream_saturated_gb_per_s: float
    sweep: list[SweepPoint]
    clock: list[tuple[float, float]]  # (CUDA-event us, host us) per step


@dataclass(frozen=True)
class KitFit:
    """What the measurements say, in the cluster file's terms where it has them."""

    gemm_tflops: float
    peak_tflops: float  # the datasheet's (the cluster's gpu.peak_tflops)
    gemm_efficiency: float  # sim.gemm_efficiency: the GEMM's share of the peak
    dram_gb_per_s: float  # DRAM bytes/s the streaming kernel reaches on the whole GPU
    mem_efficiency: float  # sim.mem_efficiency: that over the datasheet's bandwidth
    stream_per_cta_gb_per_s: float  # one CTA's copy rate (the simulator's per-channel rate stands for it)
    copy_gb_per_s: float
    slowdown_copy: float
    slowdowns: dict[int, tuple[float, float]]  # k -> (beside the stream, beside stream and copy)
    clock_host_minus_event_us: float  # median per step: launch and synchronisation the host clock adds
    clock_ratio: float  # median event/host


def cta_ceiling(info: DeviceInfo) -> int:
    """NCCL's CTA ceiling for the libnccl at hand (MAXCHANNELS), at most the SMs."""
    try:
        from nccl_env.libnccl import find_libnccl, nccl_version
        from nccl_env.rules import max_channels

        ceiling = max_channels(nccl_version(find_libnccl().path))
    except (LagomError, OSError):
        ceiling = DEFAULT_CTA_CEILING
    return min(ceiling, info.sm_count)


def sweep_ctas(ceiling: int) -> list[int]:
    """1, 2, 4, ... below the ceiling, and the ceiling."""
    out = [1]
    while out[-1] * 2 < ceiling:
        out.append(out[-1] * 2)
    return out + [ceiling] if ceiling > 1 else out


def measure(device: Device, ceiling: int) -> KitMeasurements:
    info = device.info
    saturating = 4 * info.sm_count  # several CTAs per SM: the streaming kernel's best DRAM rate
    sweep = [SweepPoint(k, device.stream_gb_per_s(k), device.gemm_us(Beside(stream_ctas=k)),
                        device.gemm_us(Beside(stream_ctas=k, copy=True))) for k in sweep_ctas(ceiling)]
    return KitMeasurements(info, device.gemm_us(Beside()), device.gemm_us(Beside(copy=True)), device.copy_gb_per_s(),
                           saturating, device.stream_gb_per_s(saturating), sweep, device.clock_pairs(CLOCK_STEPS))


def fit(m: KitMeasurements, base: ClusterSpec) -> KitFit:
    tflops = gemm_flops() / m.gemm_alone_us / 1e6
    dram = 2 * m.stream_saturated_gb_per_s  # a copied byte is read once and written once
    slowdowns = {p.ctas: (p.gemm_beside_stream_us / m.gemm_alone_us, p.gemm_beside_both_us / m.gemm_alone_us)
                 for p in m.sweep}
    return KitFit(tflops, base.gpu.peak_tflops, tflops / base.gpu.peak_tflops, dram, dram / base.gpu.mem_bw_gb_per_s,
                  m.sweep[0].stream_alone_gb_per_s / m.sweep[0].ctas, m.copy_alone_gb_per_s,
                  m.gemm_beside_copy_us / m.gemm_alone_us, slowdowns,
                  median([h - e for e, h in m.clock]), median([e / h for e, h in m.clock if h > 0]))


def base_cluster(info: DeviceInfo) -> tuple[ClusterSpec, str]:
    """The preset of this GPU (its topology and NCCL facts stand), with the datasheet row of the GPU."""
    presets = [load_cluster(name) for name in preset_names()]
    match = match_gpu(DeviceFacts(info.name, info.sm_count, info.mem_bytes, info.compute_capability))
    if match is not None:
        same = [p for p in presets if p.gpu.name == match.row.key]
        if same:
            return same[0], f"preset {same[0].name} ({match.basis})"
        nearest = min(presets, key=lambda p: abs(p.gpu.sm_count - info.sm_count))
        return replace(nearest, gpu=gpu_spec(match.row, info.sm_count)), \
            f"GPU row {match.row.key} ({match.basis}) in preset {nearest.name}'s topology"
    nearest = min(presets, key=lambda p: abs(p.gpu.sm_count - info.sm_count))
    return nearest, f"no datasheet row for {info.name}: preset {nearest.name}, the nearest in SMs"


def kit_cluster(base: ClusterSpec, info: DeviceInfo, f: KitFit) -> ClusterSpec:
    """``base`` with the measured GPU: its SMs and L2 as the device says, the efficiencies as measured."""
    gpu = replace(base.gpu, sm_count=info.sm_count, l2_bytes=info.l2_bytes or base.gpu.l2_bytes)
    sim = {**base.sim, "gemm_efficiency": round(min(1.0, f.gemm_efficiency), 4),
           "mem_efficiency": round(min(1.0, f.mem_efficiency), 4)}
    return replace(base, name=f"gpu-kit-{base.name}", gpu=gpu, sim=sim)


def model_check(m: KitMeasurements, cluster: ClusterSpec) -> list[dict]:
    """The simulator of the written cluster on the same plan, beside each measured slowdown."""
    sim = SimDevice(cluster)
    alone = sim.gemm_us(Beside())
    rows = [{"beside": "copy", "measured": m.gemm_beside_copy_us / m.gemm_alone_us,
             "model": sim.gemm_us(Beside(copy=True)) / alone}]
    for p in m.sweep:
        rows.append({"beside": f"stream k={p.ctas}", "measured": p.gemm_beside_stream_us / m.gemm_alone_us,
                     "model": sim.gemm_us(Beside(stream_ctas=p.ctas)) / alone})
        rows.append({"beside": f"stream k={p.ctas} + copy", "measured": p.gemm_beside_both_us / m.gemm_alone_us,
                     "model": sim.gemm_us(Beside(stream_ctas=p.ctas, copy=True)) / alone})
    return rows


def run_kit(device: Device, out: Path, base: ClusterSpec, basis: str, ceiling: int, nccl: bool) -> dict:
    """Measure, fit, write ``out/cluster.yaml`` and ``out/kit.json``; the report as a dict."""
    started = time.monotonic()
    m = measure(device, ceiling)
    f = fit(m, base)
    cluster = kit_cluster(base, m.device, f)
    what = "the simulator's GPU" if m.device.simulated else m.device.name
    header = (f"{CLUSTER_HEADER} (measured by bench/gpu_kit.py on {what}; --cluster takes it)\n"
              f"# base: {basis}; gpu.sm_count and gpu.l2_bytes as the device reports them; sim.gemm_efficiency =\n"
              f"# an 8192^3 bf16 GEMM's rate over gpu.peak_tflops; sim.mem_efficiency = a copy kernel's DRAM rate\n"
              f"# over gpu.mem_bw_gb_per_s (docs/gpu_kit.md)\n")
    (out / "cluster.yaml").write_text(header + cluster.to_yaml())
    load_cluster(out / "cluster.yaml")  # it reads back, or this is a bug
    checks = model_check(m, cluster)
    report = {"format": "lagom.gpu-kit", "version": 1, "device": asdict(m.device), "base": basis,
              "cta_ceiling": ceiling, "measurements": asdict(m), "fit": asdict(f), "model_check": checks,
              "model_worst_miss": max(abs(r["model"] / r["measured"] - 1) for r in checks)}
    if nccl:
        from gpu_kit_nccl import run_probe

        report["nccl"] = run_probe(out).to_dict()
    report["seconds"] = round(time.monotonic() - started, 1)
    (out / "kit.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def print_report(report: dict) -> None:
    f = report["fit"]
    print(f"device: {report['device']['name']} ({report['device']['sm_count']} SMs); base: {report['base']}")
    print(f"GEMM alone: {f['gemm_tflops']:.0f} TFLOP/s = {f['gemm_efficiency']:.3f} of {f['peak_tflops']:.0f}; "
          f"DRAM {f['dram_gb_per_s']:.0f} GB/s = {f['mem_efficiency']:.3f} of the datasheet")
    print(f"streaming CTA: {f['stream_per_cta_gb_per_s']:.1f} GB/s each; copy alone {f['copy_gb_per_s']:.0f} GB/s; "
          f"step clock: host - events {f['clock_host_minus_event_us']:.1f} us")
    print(f"{'GEMM beside':<22}{'measured':>10}{'model':>10}")
    for row in report["model_check"]:
        print(f"{row['beside']:<22}{row['measured']:>10.3f}{row['model']:>10.3f}")
    print(f"model's worst miss: {report['model_worst_miss']:.1%}")
    if "nccl" in report:
        n = report["nccl"]
        print(f"NCCL {n['nccl_version']}: plugin {'loaded' if n['loaded'] else 'NOT loaded'} "
              f"({n['plugin_name']} v{n['abi_version']}), table {n['table_entries']} entries, "
              f"{n['served']} collectives served by it")
    print(f"{report['seconds']} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for cluster.yaml and kit.json")
    parser.add_argument("--simulate", metavar="PRESET", help="measure the simulator's GPU of this preset or file")
    parser.add_argument("--no-nccl", action="store_true", help="skip the tuner plugin check")
    args = parser.parse_args(argv)
    try:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise LagomError(f"--out {out}: not a folder")
        device: Device
        if args.simulate:
            base = load_cluster(args.simulate)
            device, basis = SimDevice(base), f"the simulated {base.name}"
            ceiling, nccl = min(DEFAULT_CTA_CEILING, base.gpu.sm_count), False
        else:
            missing = cuda_missing()
            if missing:
                raise LagomError(f"gpu_kit: {missing}; it measures a CUDA GPU (--simulate PRESET runs it on the "
                                 "simulator's)")
            device = CudaDevice()
            base, basis = base_cluster(device.info)
            ceiling, nccl = cta_ceiling(device.info), not args.no_nccl
        out.mkdir(parents=True, exist_ok=True)
        print_report(run_kit(device, out, base, basis, ceiling, nccl))
    except LagomError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
