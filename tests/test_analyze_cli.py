"""`lagom analyze` end to end: the README quickstart, --json, --include-last-step, --plot."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import matplotlib.image
import orjson
import pytest
from conftest import REPO_ROOT, trace_path

from lagom.cli import main

EXAMPLE = REPO_ROOT / "traces" / "examples" / "a100_w2_allreduce_broadcast.json.gz"


def _json(capsys, *argv) -> dict:
    assert main(["analyze", *map(str, argv), "--json"]) == 0
    return orjson.loads(capsys.readouterr().out)


def test_analyze_runs_as_a_process():
    # `python -m lagom analyze`, exactly as a user would run it.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "lagom", "analyze", "traces/examples/a100_w2_allreduce_broadcast.json.gz"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "14.31 %" in proc.stdout  # HTA 0.5's overlap figure for this trace
    assert "allreduce" in proc.stdout and "exposed" in proc.stdout


def test_json_shape_and_figures(capsys):
    out = _json(capsys, EXAMPLE)
    (r,) = out["ranks"]
    assert r["rank"] == 0
    assert ((r["comm_comp_overlap_pct"], r["idle_pct"], r["compute_pct"], r["non_compute_pct"])
            == (14.31, 77.78, 17.26, 4.97))
    kinds = {c["collective"] for c in r["collectives"]}
    assert kinds == {"allreduce", "broadcast"}
    assert sum(c["count"] for c in r["collectives"]) == 14  # 21 kernels, 7 in the dropped last step
    for c in r["collectives"]:
        assert 0 <= c["exposed_us"] <= c["total_us"] + 1e-6
    assert r["windows"] and all(w["compute_ops"] > 0 and w["collectives"] > 0 for w in r["windows"])
    assert [w["duration_us"] for w in r["windows"]] == sorted((w["duration_us"] for w in r["windows"]), reverse=True)
    assert r["contention"][0]["collective"] == "all" and r["contention"][0]["pairs"] > 0


def test_include_last_step_and_directory_of_ranks(capsys, tmp_path):
    for name in ("w128_sendrecv_rank0.json.gz", "w128_sendrecv_rank1.json.gz"):
        shutil.copy(trace_path(name), tmp_path / name)
    default = _json(capsys, tmp_path)
    last = _json(capsys, tmp_path, "--include-last-step")
    assert [r["rank"] for r in default["ranks"]] == [0, 1]
    # HTA 0.5's figures (../shared/traces/README.md).
    assert [r["comm_comp_overlap_pct"] for r in default["ranks"]] == [11.81, 20.05]
    assert [r["comm_comp_overlap_pct"] for r in last["ranks"]] == [14.95, 19.93]

    # a rank file named again, directly, is analysed once, with one warning
    assert main(["analyze", str(tmp_path), str(tmp_path / "w128_sendrecv_rank1.json.gz"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert [r["rank"] for r in orjson.loads(out)["ranks"]] == [0, 1]
    assert err.count("warning:") == 1 and "given more than once" in err


def test_cpu_only_trace_gets_an_answer_where_hta_raises(capsys):
    (r,) = _json(capsys, trace_path("cpu_only_rank34.json.gz"))["ranks"]
    assert r["rank"] == 34 and r["comm_comp_overlap_pct"] is None
    assert r["breakdown_basis"] == "cpu-collectives"
    assert r["non_compute_pct"] > 50 and sum(c["count"] for c in r["collectives"]) == 10


def test_plot_writes_a_png(capsys, tmp_path):
    png = tmp_path / "step.png"
    assert main(["analyze", str(trace_path("w128_sendrecv_rank0.json.gz")), "--plot", str(png)]) == 0
    assert "timeline written" in capsys.readouterr().out
    image = matplotlib.image.imread(png)
    height, width = image.shape[:2]
    assert width >= 1200 and height >= 300
    # Not blank: the lanes hold coloured bars.
    assert (image[..., :3].std(axis=(0, 1)) > 0.05).all()


def test_help_is_the_command_doc(capsys):
    try:
        main(["analyze", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    assert "--include-last-step" in out and "Holistic Trace Analysis" in out


def test_piped_text_output_keeps_whole_headers(capsys):
    """Redirected output used rich's 80-column default and cut headers to 'exposed…' / 'total …'."""
    assert main(["analyze", str(trace_path("a100_w16_sendrecv_3streams_rank0.json.gz"))]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert "exposed ms" in out and "exposed %" in out and "reducescatter" in out


def test_copy_engine_and_symmetric_collectives_are_communication_on_their_own_paths(tmp_path, capsys):
    """NCCL's copy-engine all-gather (memory copies launched inside the collective's call) and a
    symmetric kernel are collectives, each in a row of its own path; the all-gather overlaps the
    GEMM (not exposed) and, under the GEMM, is not counted as compute."""
    from kineto_builder import TraceBuilder

    b = TraceBuilder()
    b.step(1, 0, 400)
    b.cpu("record_param_comms", 50, 30, **{"Collective name": "all_gather_into_tensor", "In msg nelems": 1024,
                                          "Out msg nelems": 8192, "dtype": "BFloat16", "Process Group Name": "0"})
    for i, (ts, dur) in enumerate([(100, 2), (103, 40), (145, 2)]):
        b.kernel("Memcpy PtoP (Device -> Device)", 20, ts, dur, launch_ts=55 + i, cat="gpu_memcpy")
    b.kernel("gemm", 7, 90, 80, launch_ts=40)
    b.kernel("ncclSymkDevKernel_ReduceScatter_LD_sum_bf16(ncclSymkDevWorkArgs4K)", 21, 200, 30, grid=(9, 1, 1),
             **{"Collective name": "reduce_scatter_tensor", "In msg nelems": 8192, "Out msg nelems": 1024,
                "dtype": "BFloat16", "Process Group Name": "0"})
    (r,) = _json(capsys, b.write(tmp_path / "paths.json"), "--include-last-step")["ranks"]
    rows = {c["collective"]: c for c in r["collectives"]}
    assert rows["allgather"]["path"] == "copy_engine" and rows["allgather"]["exposed_us"] == 0.0
    assert rows["reducescatter"]["path"] == "symmetric" and rows["reducescatter"]["exposed_us"] == 30.0
    assert main(["analyze", str(tmp_path / "paths.json"), "--include-last-step"]) == 0
    text = capsys.readouterr().out
    assert "allgather (copy engines)" in text and "reducescatter (symmetric)" in text


def test_a_collective_seen_once_beside_ranks_not_recorded_is_mostly_wait(capsys, tmp_path):
    """The shared 128-rank pair: every collective ran once per step on each of the two recorded
    ranks, so the pattern of the 126 unrecorded ranks' arrivals cannot be read; a 3 KB all-to-all
    that took 30.7 ms was all "transfer" (the part that tunes). Its transfer is now the least the
    cluster allows for its size, and the rest wait for ranks not recorded, in the table and in JSON."""
    for name in ("w128_sendrecv_rank0.json.gz", "w128_sendrecv_rank1.json.gz"):
        shutil.copy(trace_path(name), tmp_path / name)
    for jobs in ("1", "2"):  # in this process, and on worker processes: the same figures
        ranks = _json(capsys, tmp_path, "--jobs", jobs)["ranks"]
        small = next(row for row in ranks[0]["wait_transfer"]
                     if row["collective"] == "alltoall" and row["message_bytes"] == 3072)
        assert small["total_us"] == 30669.0 and small["transfer_us"] <= 3000.0
        assert small["wait_us"] == pytest.approx(small["total_us"] - small["transfer_us"])
        assert small["transfer_bounded"] == 1 and small["waited_for"] == "no trace (1/1)"
        mid = next(row for row in ranks[1]["wait_transfer"] if row["message_bytes"] == 11386880)
        assert mid["total_us"] == 41375.0 and mid["transfer_us"] <= 3000.0
        for r in ranks:
            bound = r["transfer_bound"]
            assert bound["cluster"] == "a100-nvswitch" and bound["instances"] == 5
            assert bound["wait_us"] == pytest.approx(sum(row["wait_us"] for row in r["wait_transfer"]))
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("transfer bound: 5 collective instances in groups with ranks not recorded") == 2
    # a job whose every group is recorded whole: nothing bounded
    import kineto_ranks as kr

    p = kr.PROGRAMS["straggler"]
    whole = kr.write_ranks(p, kr.simulate(p), tmp_path / "whole")
    assert not any("transfer_bound" in r for r in _json(capsys, whole)["ranks"])
