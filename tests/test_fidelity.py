"""The simulator against published measurements (bench/fidelity.py, costmodel/published_cases.py).

The verdicts below are the simulator's standing against other people's measurements: a
change to the simulator that breaks one fails here. The cases file is the copy in
tests/data/fidelity (provenance in its README); the shared original is checked too when a
checkout has it beside it.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, shared_traces_dir

from costmodel.cluster import load_cluster
from costmodel.sim.published_cases import (
    assign_splits,
    gemm_beside_us,
    harness_floor,
    load_cases,
    overlap_slowdown,
    parse_cases,
    run_cases,
)
from costmodel.sim.simulator import Simulator
from nccl_env import CollectiveType, CommConfig, Plan, Signature
from nccl_env.errors import LagomError
from nccl_env.knobs import CommPath
from nccl_env.rules import NcclVersion
from traces.gemm_names import GemmDtype
from traces.generate import gemm_op, generate_workload

BUNDLED = REPO_ROOT / "tests" / "data" / "fidelity" / "published.json"
CONTENTION = REPO_ROOT / "tests" / "data" / "fidelity" / "contention.json"
SHARED_CONTENTION = shared_traces_dir().parent / "fidelity" / "contention.json"
PATHS = REPO_ROOT / "tests" / "data" / "fidelity" / "paths.json"
SHARED = shared_traces_dir().parent / "fidelity" / "published.json"
CLI = REPO_ROOT / "bench" / "fidelity.py"

# Each published case's verdict today (docs/simulator.md, "Published measurements").
VERDICTS = {
    "a100x8-allreduce-64MiB-ring-simple-channels": True,
    "allreduce-busbw-one-100G-nic": True,
    "overlap-compute-slowdown-a100-h100": True,
}


# The path cases' verdicts today (tests/data/fidelity/README.md: which one was fitted).
PATH_VERDICTS = {
    "h100x8-allgather-busbw-ring": True,
    "h100x8-reducescatter-busbw-ring": True,
    # every figure holds since the FIFO's L2 footprint is one slice per channel (half a chunk, NCCL's
    # SLICESTEPS/CHUNKSTEPS); with a whole chunk (32 channels x 2 MiB, more than H100's 50 MB L2)
    # NCCL's kernels beside the GEMM came out 26% slow (issue 23)
    "h100x8-matmul-allgather-copy-engine": True,
}


def test_path_cases_hold_as_recorded():
    results = {r.id: r for r in run_cases(load_cases(PATHS))}
    assert {k: r.holds for k, r in results.items()} == PATH_VERDICTS
    case = results["h100x8-matmul-allgather-copy-engine"]
    assert case.detail["paths"]["zero"]["mechanism"] == "copy engine"
    assert case.detail["paths"]["default"]["mechanism"] == "sm kernel"
    # sequential is the two alone, back to back; overlapping hides the shorter under the longer
    seq = case.model["sequential"] * 1e3
    gemm, coll = case.detail["gemm_alone_us"], case.detail["collective_alone_us"]
    assert gemm + coll <= seq <= gemm + coll + 20.0
    assert max(gemm, coll) <= case.model["overlap"]["zero"] * 1e3 < case.model["overlap"]["default"] * 1e3 < seq
    # beside the copy engines the GEMM keeps its SMs: it runs as alone (it is compute-bound)
    assert case.detail["paths"]["zero"]["gemm_us"] == pytest.approx(gemm, rel=1e-6)
    for label in ("sequential (NCCL's defaults)", "overlap, CTA policy default", "overlap, CTA policy zero"):
        assert next(r for r in case.rows if r.label.strip() == label).holds


def test_overlap_vs_sequential_is_validated_field_by_field():
    good = json.loads(PATHS.read_text())["cases"][2]
    for change, message in (
        ({"nccl_version": "2.x"}, "nccl_version"),
        ({"measured_ms": {"sequential": 2.0, "overlap": {}}}, "at least one CTA policy"),
        ({"measured_ms": {"sequential": 2.0, "overlap": {"fastest": 1.0}}}, "'fastest'"),
        ({"measured_ms": {"overlap": {"zero": 1.0}}}, "measured_ms.sequential"),
        ({"gemm": {"m": 8, "n": 8, "k": 8, "dtype": "int4"}}, "gemm.dtype"),
    ):
        case = {**copy.deepcopy(good), **change}
        with pytest.raises(LagomError, match=message):
            parse_cases({"format": "lagom.published-cases", "version": 1, "cases": [case]}, "t")


def _cli_main():
    spec = importlib.util.spec_from_file_location("bench_fidelity", CLI)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _published() -> dict:
    return json.loads(BUNDLED.read_text())


def test_published_cases_hold_as_recorded():
    results = {r.id: r for r in run_cases(load_cases(BUNDLED))}
    assert {k: r.holds for k, r in results.items()} == VERDICTS
    sweep = results["a100x8-allreduce-64MiB-ring-simple-channels"]
    # per point: within max(15 %, 400 us) of the measured excess over the plateau
    for point in sweep.detail["points"]:
        assert abs(point["model_us"] - point["measured_us"]) <= point["limit_us"]
    # one channel is the per-channel copy rate alone: ~5.3 ms above the plateau, not a link limit
    assert 4500 < sweep.model[0]["delta_us"] < 6100
    busbw = results["allreduce-busbw-one-100G-nic"]
    assert busbw.model == pytest.approx(12.2, rel=0.10)
    overlap = results["overlap-compute-slowdown-a100-h100"]
    assert 1.09 <= overlap.model["slowdown_mean"] <= 1.29
    # the judged maximum is the largest workload's mean; per-kernel maxima are reported beside it
    assert overlap.model["slowdown_max"] == max(w["slowdown"] for w in overlap.detail["workloads"])
    assert all(w["largest_kernel_slowdown"] >= w["slowdown"] for w in overlap.detail["workloads"])


@pytest.mark.skipif(not SHARED.is_file(), reason="no shared/fidelity/published.json beside this checkout")
def test_shared_published_file_holds():
    results = run_cases(load_cases(SHARED))
    failing = [r.id for r in results if not r.holds]
    assert not failing, f"published measurements the simulator now misses: {failing}"
    for r in results:
        if r.id in VERDICTS:
            assert r.holds == VERDICTS[r.id]


def test_cli_table_and_json_exit_status():
    table = subprocess.run([sys.executable, str(CLI), str(BUNDLED)], capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "3 of 3 judged cases hold (100%)" in table.stdout
    assert "allreduce-busbw-one-100G-nic (busbw_ceiling)" in table.stdout
    assert "8 channels" in table.stdout  # one row per point of the sweep
    out = subprocess.run([sys.executable, str(CLI), str(BUNDLED), "--json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    cases = json.loads(out.stdout)["cases"]
    assert [c["id"] for c in cases] == list(VERDICTS)
    for c in cases:
        assert set(c) == {"id", "kind", "holds", "model", "measured", "detail", "split", "not_judged", "cluster"}
        assert c["split"] is None and c["not_judged"] is None
        assert c["holds"] is VERDICTS[c["id"]]


def _mutated(mutate) -> dict:
    data = copy.deepcopy(_published())
    mutate(data)
    return data


SCHEMA_ERRORS = [
    ("wrong format", lambda d: d.update(format="nccl-tests"), "'format' is 'nccl-tests'"),
    ("wrong version", lambda d: d.update(version=2), "version 2 is not supported"),
    ("no cases", lambda d: d.update(cases=[]), "'cases' must be a non-empty list"),
    ("missing field", lambda d: d["cases"][0].pop("bytes"), "missing field 'bytes'"),
    ("missing common field", lambda d: d["cases"][1].pop("source"), "missing field 'source'"),
    ("unknown kind", lambda d: d["cases"][1].update(kind="latency_floor"), "unknown kind 'latency_floor'"),
    ("unknown preset", lambda d: d["cases"][1].update(cluster="dgx-b200"), "unknown preset 'dgx-b200'"),
    ("not a collective", lambda d: d["cases"][1].update(collective="allsum"), "'collective' 'allsum'"),
    ("unmodelled algorithm", lambda d: d["cases"][0].update(algorithm="nvls"), "models only ring, tree"),
    ("bad number", lambda d: d["cases"][0]["tolerance"].update(relative="15%"), "'tolerance.relative' must be"),
    ("bad point", lambda d: d["cases"][0]["points"][2].pop("delta_us"), "missing field 'points[2].delta_us'"),
    ("ranks do not fit", lambda d: d["cases"][1].update(ranks=17), "17 ranks on 2 node(s)"),
    ("bad workload", lambda d: d["cases"][2]["workloads"].append("fsdp:gpt5"), "workload 'fsdp:gpt5'"),
    ("duplicate id", lambda d: d["cases"][1].update(id=d["cases"][0]["id"]), "is used twice"),
    ("range upside down", lambda d: d["cases"][2]["slowdown_mean"].update(min=2.0), "is above"),
]


@pytest.mark.parametrize("name,mutate,message", SCHEMA_ERRORS, ids=[e[0] for e in SCHEMA_ERRORS])
def test_schema_errors_name_the_problem(name, mutate, message, tmp_path, capsys):
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(_mutated(mutate)))
    with pytest.raises(LagomError) as excinfo:
        load_cases(path)
    assert message in str(excinfo.value)
    assert "\n" not in str(excinfo.value)
    assert _cli_main()([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_not_json_and_missing_file_exit_2(tmp_path):
    path = tmp_path / "cases.json"
    path.write_text("{not json")
    run = subprocess.run([sys.executable, str(CLI), str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "not JSON" in run.stderr
    with pytest.raises(LagomError, match="no such file"):
        load_cases(tmp_path / "absent.json")


# ---- gemm_beside_collective, on cases built from the simulator's own wave mechanism ----------------
# a100-nvswitch has 108 SMs; a 256x128-tile GEMM runs one block per SM. 96 blocks fit the 96 SMs
# 12 channels leave (one wave, as alone); 13 channels leave 95, so one block runs a second wave.
# A long k keeps the GEMM compute-bound, so L2 and DRAM barely matter.


def _gemm_case(channels: int, low: float, high: float, case_id: str = "gemm") -> dict:
    return {
        "id": case_id, "source": "built from the simulator's wave mechanism", "note": "not a measurement",
        "kind": "gemm_beside_collective", "cluster": "a100-nvswitch",
        "gemm": {"m": 4096, "n": 3072, "k": 16384, "dtype": "bf16", "grid_blocks": 96},
        "collective": {"collective": "allreduce", "bytes": 64 << 20, "ranks": 8, "nodes": 1, "channels": channels},
        "slowdown": {"min": low, "max": high},
    }


def _file(*cases: dict) -> dict:
    return {"format": "lagom.published-cases", "version": 1, "cases": list(cases)}


def test_gemm_beside_collective_follows_the_waves():
    one_wave, two_waves = run_cases(parse_cases(_file(_gemm_case(12, 1.0, 1.05, "a"), _gemm_case(13, 1.9, 2.05, "b")),
                                                "built"))
    assert one_wave.holds and two_waves.holds
    assert one_wave.model < 1.05 < 1.9 < two_waves.model
    # the collective ran beside the GEMM for its whole duration: enough back-to-back copies
    for r in (one_wave, two_waves):
        assert r.detail["collective_copies"] * r.detail["collective_alone_us"] >= r.detail["gemm_beside_us"]


def test_gemm_beside_matches_the_kernel_under_the_collectives_sms():
    """Beside for its whole duration = the kernel's time on the SMs and L2 the collective leaves it."""
    cluster = load_cluster("a100-nvswitch")
    sim = Simulator(cluster, noise=0.0)
    op = gemm_op("g", 4096, 3072, 16384, grid_blocks=96, stream=1)
    signature = Signature("g", CollectiveType.ALLREDUCE, 1 << 20, 8, 1)  # short: many copies needed
    config = CommConfig(channels=30)
    beside, copies = gemm_beside_us(sim, op, signature, config)
    assert copies > 10
    assert beside == pytest.approx(sim.compute_time_us(op, ctas=30), rel=0.01)


def test_gemm_case_that_misses_exits_1(tmp_path, capsys):
    path = tmp_path / "gemm.json"
    path.write_text(json.dumps(_file(_gemm_case(12, 1.0, 1.05, "a"), _gemm_case(13, 1.0, 1.05, "b"))))
    assert _cli_main()([str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 judged cases hold (50%)" in out and "\nNO " in out


def test_gemm_precision_sets_its_peak():
    """FP32 runs on the CUDA cores (A100: 19.5 of 312 TFLOP/s), TF32 at half the BF16 tensor rate."""
    sim = Simulator(load_cluster("a100-nvswitch"), noise=0.0)
    alone = {d: sim.compute_time_us(gemm_op("g", 4096, 4096, 4096, dtype=d)) for d in GemmDtype}
    assert alone[GemmDtype.FP16] == alone[GemmDtype.BF16]
    assert alone[GemmDtype.TF32] == pytest.approx(2 * alone[GemmDtype.BF16], rel=0.05)
    assert alone[GemmDtype.FP32] == pytest.approx(312 / 19.5 * alone[GemmDtype.BF16], rel=0.05)
    case = _gemm_case(12, 1.0, 1.05)
    case["gemm"]["dtype"] = "fp32"  # slower blocks, same waves: still one wave beside 12 channels
    assert run_cases(parse_cases(_file(case), "built"))[0].holds
    case["gemm"]["dtype"] = "fp8"
    with pytest.raises(LagomError, match="'gemm.dtype' 'fp8' is not one of bf16, fp16, tf32, fp32"):
        parse_cases(_file(case), "built")


# ---- contention.json: 27 measurements on NVIDIA GPUs, split into a fitting and a checking set -----------

# Why each case the simulator cannot be asked is not judged (the runner prints the reason).
NOT_JUDGED = {
    "a100-gpt-training-gemm-beside-allgather-nccl1428": "does not state the GEMM's shape",
    "h20x8-fsdp-rollout-symk-allgather-unirl467": "no preset models a H20",
    "gb200x4-gpt-oss-20b-fsdp-symm-mem-compile-on-torchtitan3105": "mixture of experts",
    "gb200x4-gpt-oss-20b-fsdp-symm-mem-compile-off-torchtitan3105": "mixture of experts",
    "cuda13.2-32MiB-ce-p2p-nccl2177": "names no GPU model",
    "cuda13.2-32MiB-ce-local-nccl2177": "names no GPU model",
    "cuda13.2-32MiB-sm-local-nccl2177": "names no GPU model",
    "v100x2-allgather-256MiB-alone-and-beside-d2h-nccl2218": "no preset models a V100",
    "v100x4-allgather-256MiB-alone-and-beside-d2h-nccl2218": "no preset models a V100",
    # pytorch #182850's symm_mem variants: each one's time is flat across its sizes (a per-call floor)
    **{f"h100x8-allgather-bf16-v{v}-alone-pr182850": "per-call floor" for v in range(1, 6)},
}
# The judged cases that hold today (docs/simulator.md, "Fitting and checking"); every other judged case
# is a recorded miss.
CONTENTION_HOLDS = {
    "h100x8-gemm8192-fp16-ag64MiBshard-nccl-vs-zerocta-pr172714",
    "arxiv2507.03114-overlap-compute-slowdown-a100-h100-mi250-mi210",
    # NCCL's Blackwell symmetric-kernel constants (600 GiB/s peak, 55 per CTA): with Hopper's the symmetric
    # kernels were slower than the NVLink5 ring and these came out -0.7% and +0.7%
    "gb200x4-llama3-8b-fsdp-symm-mem-compile-on-torchtitan3105",
    "gb200x4-qwen3-32b-fsdp-symm-mem-compile-on-torchtitan3105",
    "gb200x4-qwen3-32b-fsdp-symm-mem-compile-off-torchtitan3105",
    # its 1-16 MiB points are bounds (the source's per-call floor), its 64 MiB point a rate
    "h100x8-allgather-bf16-nccl-alone-pr182850",
    # the symmetric kernel's fixed cost is a launch and a hop, not NCCL's picker's base latency
    "h100x8-allgather-bf16-symk-alone-megatron5596",
    "h100x8-reducescatter-bf16-symk-alone-megatron5596",
}


def test_every_contention_case_is_judged_or_says_why():
    results = {r.id: r for r in run_cases(load_cases(CONTENTION))}
    assert len(results) == 27
    assert {k for k, r in results.items() if r.holds is None} == set(NOT_JUDGED)
    for case_id, why in NOT_JUDGED.items():
        assert why in results[case_id].not_judged
    assert {k for k, r in results.items() if r.holds} == CONTENTION_HOLDS
    # pytorch #172714: sequential, overlap beside NCCL's kernels and beside the copy engines, each within 15%
    case = results["h100x8-gemm8192-fp16-ag64MiBshard-nccl-vs-zerocta-pr172714"]
    assert case.model["sequential"] == pytest.approx(2.96, rel=0.15)
    assert case.model["overlap"]["default"] == pytest.approx(2.02, rel=0.15)
    assert case.model["overlap"]["zero"] == pytest.approx(1.77, rel=0.15)
    # an other: cluster naming A100 and H100 (and AMD parts) is judged on both NVIDIA presets, on stand-ins
    arxiv = results["arxiv2507.03114-overlap-compute-slowdown-a100-h100-mi250-mi210"]
    assert {w["spec"].split(" on ")[1] for w in arxiv.detail["workloads"]} == {"a100-nvswitch", "h100-nvswitch"}
    # a path gain without a workload names the stand-in it was judged on
    xla = results["h100x8-llama31-8b-xla-min-sm-cta-policy-xla33613"]
    assert xla.detail["stand_in"] and xla.detail["workload"] == "fsdp:llama3-8b:gpus=8,mb=2,seq=4096"
    assert "copy engine" in xla.detail["mechanisms"]


def test_points_on_a_per_call_floor_are_found_from_their_own_times_and_judged_as_bounds():
    data = {c["id"]: c for c in json.loads(CONTENTION.read_text())["cases"]}

    def times(case_id: str) -> list[tuple[int, float]]:  # us, or ns for a rate: one factor per case
        return [(p["bytes"], p["time_us"] if p.get("time_us") is not None else p["bytes"] / p["GBps"])
                for p in data[case_id]["points"]]

    # NCCL's AllGather in pytorch #182850: flat from 1 to 16 MiB per rank, then x2.4 time for x4 bytes
    assert harness_floor(times("h100x8-allgather-bf16-nccl-alone-pr182850")) == (True, True, True, False)
    # Megatron-LM #5596's kernel device times grow with the bytes: no floor
    assert not any(harness_floor(times("h100x8-allgather-bf16-ring-alone-megatron5596")))
    assert not any(harness_floor(times("h100x8-allgather-bf16-symk-alone-megatron5596")))
    # points of one size share their verdict, in any order
    assert harness_floor([(4 << 20, 41.0), (1 << 20, 40.0), (1 << 20, 39.0)]) == (True, True, True)
    # a floor point is a bound the model's device time must stay under: a floor below it is a miss
    case = {**data["h100x8-allgather-bf16-nccl-alone-pr182850"], "id": "floor"}
    case.pop("split")
    (held,) = run_cases(parse_cases(_file(case), "t"))
    assert held.holds and [p["convention"] for p in held.model] == ["floor", "floor", "floor", "algbw"]
    fast = {**case, "points": [{"bytes": p["bytes"], "GBps": p["GBps"] * 12} for p in case["points"][:3]]
            + case["points"][3:]}
    (missed,) = run_cases(parse_cases(_file(fast), "t"))  # floors of 43-49 us: still over 3x NCCL's latency
    assert missed.holds is False and missed.model[1]["convention"] == "floor" and not missed.model[1]["holds"]
    # a flat series at the scale of NCCL's own latency (~11 us here) is the collective's latency: judged as it
    # stands (the model's 2 MiB LL ring, 22.7 us, against a flat 15 us: a miss), never a bound
    latency = {**case, "bw_convention": "algbw", "points": [{"bytes": b, "time_us": 15.0} for b in (1 << 15, 1 << 17)]}
    (judged,) = run_cases(parse_cases(_file(latency), "t"))
    assert judged.holds is False and {p["convention"] for p in judged.model} == {"time"}


def test_the_split_is_the_rule_applied_to_the_cases():
    data = json.loads(CONTENTION.read_text())
    cases = data["cases"]
    assert assign_splits(cases) == {c["id"]: c["split"] for c in cases}
    assert {c["split"] for c in cases} == {"fit", "check"}
    assert abs(sum(c["split"] == "fit" for c in cases) - sum(c["split"] == "check" for c in cases)) <= 1
    if SHARED_CONTENTION.is_file():  # the copy is the shared file plus the split, nothing else
        shared = json.loads(SHARED_CONTENTION.read_text())
        assert [{k: v for k, v in c.items() if k != "split"} for c in cases] == shared["cases"]


def test_cli_reports_both_sets_and_the_fitting_sets_worst_miss():
    run = subprocess.run([sys.executable, str(CLI), str(CONTENTION)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr  # some judged cases miss
    assert "fitting set: " in run.stdout and "checking set: " in run.stdout
    assert "worst miss of the fitting set: " in run.stdout
    assert "not judged" in run.stdout and "no preset models a V100" in run.stdout
    if SHARED_CONTENTION.is_file():  # the shared file has no split: one line, every case run
        shared = subprocess.run([sys.executable, str(CLI), str(SHARED_CONTENTION)], capture_output=True, text=True,
                                timeout=300)
        assert shared.returncode == 1 and "judged cases hold" in shared.stdout and "14 not judged" in shared.stdout


def test_fsdp_llama3_on_h100_sits_in_the_published_ranges():
    """Issue 23's reference job: compute beside NCCL's defaults within arXiv 2507.03114's H100 range
    (mean x1.189 +-15%, at most x1.40), copy-engine AllGathers within the published end-to-end gains
    (+1.1% torchtitan #3105 to +7% openxla #33613)."""
    spec = "fsdp:llama3-8b:gpus=8,mb=2,seq=4096"
    cluster = load_cluster("h100-nvswitch")
    sim = Simulator(cluster.__class__(**{**cluster.__dict__, "nccl_version": NcclVersion(2, 30, 7)}), noise=0.0)
    workload = generate_workload(spec)
    slowdown = overlap_slowdown(sim, spec, workload)
    assert 1.189 * 0.85 <= slowdown.slowdown <= 1.40
    gpn = cluster.gpus_per_node
    signatures = {workload.signature(c, gpn) for c in workload.collectives}
    before = sim.evaluate(workload, Plan()).iteration_us
    after = sim.evaluate(workload, Plan(entries={s: CommConfig(comm_path=CommPath.COPY_ENGINE) for s in signatures
                                                 if s.collective is CollectiveType.ALLGATHER})).iteration_us
    assert 1.1 <= (before / after - 1) * 100 <= 7.0


def test_other_clusters_and_null_fields_are_not_judged_with_the_reason():
    case = {"id": "x", "source": "s", "note": "n", "kind": "busbw_ceiling", "cluster": "other:h20",
            "collective": "allreduce", "bytes": 1 << 30, "ranks": 8, "nodes": 1, "busbw_GBps": 100.0,
            "tolerance": {"relative": 0.1}}
    (r,) = run_cases(parse_cases(_file(case), "t"))
    assert r.holds is None and r.not_judged == "no preset: h20: no preset models a H20"
    (r,) = run_cases(parse_cases(_file({**case, "cluster": "h100-nvswitch", "bytes": None}), "t"))
    assert r.holds is None and "does not state the collective's bytes" in r.not_judged
    with pytest.raises(LagomError, match="'split' must be one of fit, check"):
        parse_cases(_file({**case, "split": "train"}), "t")
