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

import pytest
from conftest import REPO_ROOT

from costmodel.analytic.params import params_for
from costmodel.cluster import load_cluster


@pytest.mark.slow  # a two-process gloo job measuring 24 items
def test_torch_backend_calibrates_a_two_process_gloo_job(tmp_path):
    out = tmp_path / "cluster.yaml"
    dump = tmp_path / "measurements.json"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "lagom", "calibrate", "--backend", "torch", "--cluster", "low-bw", "--measurements", "24",
           "-o", str(out), "--dump-measurements", str(dump), "--json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])  # rank 0 alone prints the report
    assert report["backend"] == "torch:gloo"
    assert report["measurements"] == 24
    cluster = load_cluster(out)  # the file is a cluster every --cluster accepts
    assert cluster.model["fitted_from"] == "torch:gloo"
    assert params_for(cluster)["intra_bw_gb_per_s"] > 0
    items = json.loads(dump.read_text())["measurements"]
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


def test_each_setting_exports_what_nccl_reads_for_that_collective_and_nothing_left_over(monkeypatch):
    """The GPU path's env (a fresh communicator per setting): an AllToAll's step goes to
    NCCL_P2P_*_CHUNKSIZE (NCCL reads no NTHREADS, ALGO or BUFFSIZE-as-chunk for p2p), and one
    setting's knobs never leak into the next: the user's own value comes back instead."""
    from costmodel.calibration.torch_backend import MANAGED_ENV, apply_env, nccl_env_for
    from nccl_env import Algorithm, CollectiveType, CommConfig, Signature
    from nccl_env.rules import NcclVersion

    v = NcclVersion.parse("2.21.5")  # caps a p2p step at NCCL_BUFFSIZE / 8, has NCCL_MIN_CTAS

    a2a = Signature("0", CollectiveType.ALLTOALL, 64 << 20, 16, 2)
    env = nccl_env_for(CommConfig(channels=4, threads=128, chunk_bytes=1 << 20), v, a2a)
    assert env["NCCL_P2P_NET_CHUNKSIZE"] == str(1 << 20) and env["NCCL_BUFFSIZE"] == str(8 << 20)
    assert not {"NCCL_NTHREADS", "NCCL_MIN_NCHANNELS", "NCCL_P2P_PCI_CHUNKSIZE"} & set(env)
    inside = nccl_env_for(CommConfig(chunk_bytes=1 << 18), v, Signature("0", CollectiveType.ALLTOALL, 1 << 20, 8, 1))
    assert inside["NCCL_P2P_NVL_CHUNKSIZE"] == inside["NCCL_P2P_PCI_CHUNKSIZE"] == str(1 << 18)
    ring = nccl_env_for(CommConfig(threads=256, chunk_bytes=1 << 20), v,
                        Signature("0", CollectiveType.ALLREDUCE, 1 << 26, 8, 1))
    tree = nccl_env_for(CommConfig(algorithm=Algorithm.TREE, chunk_bytes=1 << 20), v,
                        Signature("0", CollectiveType.ALLREDUCE, 1 << 26, 8, 1))
    assert ring["NCCL_NTHREADS"] == "256" and ring["NCCL_BUFFSIZE"] == str(2 << 20)  # Ring/Simple: BUFFSIZE/8 x 4
    assert tree["NCCL_BUFFSIZE"] == str(8 << 20)  # one chunk step per slot

    for name in MANAGED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_PROTO", "Simple")  # the user's own choice
    user = {name: os.environ.get(name) for name in MANAGED_ENV}
    apply_env(nccl_env_for(CommConfig(threads=128, protocol=None, channels=2), v), user)
    assert os.environ["NCCL_NTHREADS"] == "128" and os.environ["NCCL_MIN_CTAS"] == "2"
    apply_env(ring, user)
    assert "NCCL_MIN_CTAS" not in os.environ and os.environ["NCCL_NTHREADS"] == "256"
    assert os.environ["NCCL_PROTO"] == "Simple"
    apply_env(nccl_env_for(CommConfig(), v), user)
    assert not {"NCCL_NTHREADS", "NCCL_BUFFSIZE"} & set(os.environ) and os.environ["NCCL_PROTO"] == "Simple"
