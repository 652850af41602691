"""`lagom calibrate --backend torch` under a real 2-process torchrun with gloo on CPU.

On CPU the collectives run over gloo, where NCCL's knobs (channels, chunk, threads,
protocol) have no effect: this test checks the orchestration (every rank runs the
same plan, timings are agreed across ranks, rank 0 fits and writes a cluster file
that loads) and that the measurements are real (bigger messages take longer), not
that the knobs matter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from costmodel.cluster import load_cluster
from costmodel.model_params import params_for

from conftest import REPO_ROOT


def test_torch_backend_calibrates_a_two_process_gloo_job(tmp_path):
    out = tmp_path / "cluster.yaml"
    dump = tmp_path / "measurements.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "lagom", "calibrate", "--backend", "torch", "--cluster", "low-bw", "--budget", "24",
           "--out", str(out), "--dump-measurements", str(dump), "--json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])  # rank 0 alone prints the report
    assert report["backend"] == "torch:gloo"
    assert report["measurements"] == 24
    cluster = load_cluster(out)  # the file is a cluster every --cluster accepts
    assert cluster.model["fitted_from"] == "torch:gloo"
    assert params_for(cluster)["intra_bw_gb_per_s"] > 0
    items = json.loads(dump.read_text())
    assert len(items) == 24
    assert all(v > 0 for m in items for v in m["measured_us"])
    assert all(m["signature"]["ranks"] == 2 for m in items if "signature" in m)
    # real measurements: the largest messages take longer than the smallest (medians of a few,
    # so one hiccup of this shared machine does not decide it)
    timed = sorted((m["signature"]["message_bytes"], m["measured_us"][0]) for m in items if m["kind"] == "collective")
    small, large = timed[:4], timed[-4:]
    assert large[0][0] >= 16 * small[-1][0]
    assert sorted(t for _, t in large)[2] > sorted(t for _, t in small)[2], timed
    # overlap: the matmul and the collective were both timed from a common start
    overlaps = [m for m in items if m["kind"] == "overlap"]
    assert overlaps and all(len(m["measured_us"]) == 2 for m in overlaps)
