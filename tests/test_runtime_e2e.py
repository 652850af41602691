"""End to end: `lagom run` around real torchrun jobs (2 ranks, gloo backend, CPU).

Why the knobs themselves cannot take effect here: with the gloo backend, torch runs
every collective in gloo's own CPU code and never loads libnccl. NCCL_* variables,
``ProcessGroupNCCL.Options`` and the tuner plugin are read only by NCCL, when it
creates a communicator and picks an algorithm/protocol/channel count per collective;
none of that exists on a CPU-only torch. So these tests check the *delivery* and the
*harmlessness*: what reaches each worker (the env knobs, the plugin's absolute path,
the table written from the tuned file), that the hook sees every collective the job
issued and matches it against the file, that a job's numbers are bit-identical with
and without Lagom, and that the failure paths leave the job running. Whether NCCL
acts on the settings is checked on a GPU cluster with NCCL_DEBUG (README,
"Applying a tuned config").

The job (tests/runtime_job.py) all-reduces, all-gathers (list and single-tensor),
reduce-scatters (list and single-tensor: gloo on CPU supports both in torch 2.13),
broadcasts, all-reduces on a subgroup with an async handle, and trains the same MLP
under FSDP2 (``fully_shard`` runs on CPU/gloo here); it tallies every collective it
issues, FSDP's through FSDP's custom-collective API. Four torchrun runs are started
once, side by side, and shared by the tests below.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, run_jobs

from lagom.files.plugin_export import plugin_entries_from_config, render_plugin_table
from lagom.files.tuned_config import load_tuned_config
from lagom.runtime import audit
from nccl_env.knobs import CollectiveType
from nccl_env.plugin_build import build_plugin
from nccl_env.plugin_table import parse_table

pytestmark = pytest.mark.slow  # a real two-process torchrun job, run once (about 30 s)

JOB = REPO_ROOT / "tests" / "runtime_job.py"
STEPS = 3
CONFIG = {
    "format": "lagom.tuned-config",
    "version": 1,
    "cluster": "low-bw",
    "nccl_version": "2.30.3",  # loads the plugin: the table carries every per-collective setting
    "method": "lagom",
    "env": {"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "2097152"},
    "process_groups": {"0": {"min_ctas": 2, "max_ctas": 8}},
    "collectives": [
        {"match": {"collective": "allreduce", "group": "0", "max_bytes": 64},
         "set": {"algorithm": "ring", "protocol": "ll", "channels": 2}},
        {"match": {"collective": "reducescatter", "min_bytes": 1024}, "set": {"channels": 4, "chunk_bytes": 524288}},
        {"match": {"collective": "allgather", "ranks": 2, "nodes": 1}, "set": {"protocol": "simple", "channels": 8}},
    ],
}


def _torchrun(out: Path, *job_args: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(JOB), "--out", str(out), *job_args,
    ]


def _lagom(*args: str) -> list[str]:
    return [sys.executable, "-m", "lagom", "run", *args]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start the four jobs together, wait for all; {name: (returncode, stderr, out dir)}."""
    tmp = tmp_path_factory.mktemp("e2e")
    good = tmp / "lagom.yaml"
    good.write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    corrupt = tmp / "corrupt.yaml"
    corrupt.write_text("format: lagom.tuned-config\nversion: 1\ncollectives:\n  - match: {collective: allreduce}\n    "
                       "set: {channels: many}\n")
    build_plugin()  # the cached .so the launcher will reuse
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("NCCL_", "LAGOM_")) or k == "LAGOM_CACHE_DIR"}  # the suite's own cache
    base_env["PYTHONPATH"] = str(REPO_ROOT)
    plans = {
        "plain": (_torchrun(tmp / "plain", "--steps", str(STEPS), "--fsdp"), {}),
        "lagom": (
            _lagom("--config", str(good), "--audit", str(tmp / "audit.json"), "--workdir", str(tmp / "wd"), "--")
            + _torchrun(tmp / "lagom", "--steps", str(STEPS), "--fsdp"),
            {"NCCL_NTHREADS": "128"},  # the user's own knob must win
        ),
        "no_compiler": (
            _lagom("--config", str(good), "--") + _torchrun(tmp / "no_compiler", "--steps", "1"),
            {"CC": "/nonexistent/cc"},
        ),
        "corrupt": (_torchrun(tmp / "corrupt", "--steps", "1", "--install", str(corrupt)), {}),
        "ddp": (
            _lagom("--config", str(good), "--audit", str(tmp / "audit-ddp.json"), "--workdir", str(tmp / "wd-ddp"),
                   "--") + _torchrun(tmp / "ddp", "--steps", str(STEPS), "--ddp"),
            {},
        ),
    }
    jobs = run_jobs({name: (cmd, {**base_env, **extra}) for name, (cmd, extra) in plans.items()}, timeout_s=240)
    results: dict = {name: (status, err, tmp / name) for name, (status, err, _) in jobs.items()}
    results["config"] = good
    results["corrupt_file"] = corrupt
    results["audit"] = tmp / "audit.json"
    results["audit_ddp"] = tmp / "audit-ddp.json"
    return results


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]


def _ok(runs, name) -> list[dict]:
    code, err, out = runs[name]
    assert code == 0, f"{name} failed ({code}):\n{err[-3000:]}"
    return _ranks(out)


def _lagom_lines(err: str, kind: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("lagom") and f"{kind}" in line]


def test_losses_are_bit_identical_with_and_without_lagom(runs):
    plain, tuned = _ok(runs, "plain"), _ok(runs, "lagom")
    for p, t in zip(plain, tuned):
        assert len(p["losses"]) == STEPS and len(p["fsdp_losses"]) == STEPS
        assert (t["losses"], t["fsdp_losses"], t["params"]) == (p["losses"], p["fsdp_losses"], p["params"])
    assert plain[0]["losses"] == plain[1]["losses"]  # all-reduced: the ranks agree


def test_workers_see_the_plugin_the_table_and_the_knobs(runs):
    tuned = _ok(runs, "lagom")
    config = load_tuned_config(runs["config"])
    plugin = build_plugin()
    for rank in tuned:
        env = rank["env"]
        assert env["NCCL_TUNER_PLUGIN"] == str(plugin) and Path(env["NCCL_TUNER_PLUGIN"]).is_absolute()
        table = Path(env["NCCL_TUNER_CONFIG_FILE"])
        assert table.is_absolute() and table.parent == runs["lagom"][2].parent / "wd"
        text = table.read_text()
        assert text == render_plugin_table(config)
        entries, rejected = parse_table(text)
        assert rejected == [] and entries == plugin_entries_from_config(config)
        assert [(e.collective, e.settings.channels) for e in entries] == [
            (CollectiveType.ALLREDUCE, 2), (CollectiveType.REDUCESCATTER, 4), (CollectiveType.ALLGATHER, 8)
        ]
        assert env["NCCL_BUFFSIZE"] == "2097152"
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(table.parent / "bootstrap")


def test_the_users_own_nccl_env_wins_and_is_logged(runs):
    tuned = _ok(runs, "lagom")
    assert all(rank["env"]["NCCL_NTHREADS"] == "128" for rank in tuned)
    err = runs["lagom"][1]
    assert _lagom_lines(err, "wins") == ["lagom run: your environment wins for NCCL_NTHREADS=128 (tuned: 256)"]
    assert _lagom_lines(err, "warning") == []
    # the tuned options for group "0" are reported once, as not applicable to gloo
    notes = _lagom_lines(err, "note")
    assert "lagom: note: process group '0' does not use NCCL: its tuned options do not apply" in notes
    # the workers' note once; the launcher has none (the file's NCCL 2.30.3 loads the plugin)
    assert len([n for n in notes if n.startswith("lagom: ")]) == 1
    assert not [n for n in notes if n.startswith("lagom run: ")]


def test_audit_counts_equal_the_collectives_the_job_issued(runs):
    tuned = _ok(runs, "lagom")
    config = load_tuned_config(runs["config"])
    document = json.loads(runs["audit"].read_text())
    assert document["format"] == "lagom.audit" and document["ranks"] == 2
    totals = Counter()
    for rank in tuned:
        issued = {(kind, group, nbytes): count for kind, group, nbytes, count in rank["issued"]}
        seen = {(s["collective"], s["group"], s["bytes"]): s
                for s in document["per_rank"][str(rank["rank"])]["signatures"]}
        assert {k: s["count"] for k, s in seen.items()} == issued
        kinds = {kind for kind, _, _ in issued}
        assert {"allreduce", "allgather", "reducescatter", "broadcast"} <= kinds
        for (kind, group, nbytes), s in seen.items():
            entry = config.lookup(CollectiveType.parse(kind), group, nbytes, 2, 1)
            expected = None if entry is None else config.collectives.index(entry)
            assert s["entry"] == expected, (kind, group, nbytes)
        totals.update({k: s["count"] for k, s in seen.items()})
    summary = audit.Summary(**document["summary"])
    assert summary.collectives == sum(totals.values())
    assert 0 < summary.matched < summary.collectives  # the file covers part of this job
    rank0 = [audit.SignatureCount(**s) for s in document["per_rank"]["0"]["signatures"]]
    err = runs["lagom"][1]
    assert audit.summary_line("rank 0", audit.Summary.of(rank0)) in err.splitlines()
    assert f"audit of 2 rank(s) written to {runs['audit']}" in err


def test_a_missing_compiler_degrades_to_a_warning(runs):
    degraded, plain = _ok(runs, "no_compiler"), _ok(runs, "plain")
    warnings = _lagom_lines(runs["no_compiler"][1], "warning")
    assert len(warnings) == 1 and "tuner plugin unavailable" in warnings[0] and "/nonexistent/cc" in warnings[0]
    for d, p in zip(degraded, plain):
        assert "NCCL_TUNER_PLUGIN" not in d["env"] and "NCCL_TUNER_CONFIG_FILE" not in d["env"]
        assert d["env"]["NCCL_NTHREADS"] == "256"  # the env door still works
        assert d["losses"] == p["losses"][:1]


def test_a_corrupt_config_degrades_to_a_warning(runs):
    degraded, plain = _ok(runs, "corrupt"), _ok(runs, "plain")
    warnings = _lagom_lines(runs["corrupt"][1], "warning")
    assert len(warnings) == 1 and str(runs["corrupt_file"]) in warnings[0] and "NCCL's own choices" in warnings[0]
    for d, p in zip(degraded, plain):
        assert d["losses"] == p["losses"][:1]


def test_a_ddp_jobs_audit_counts_the_all_reduces_ddp_issues_from_cpp(runs):
    """DDP's reducer all-reduces its gradient buckets from C++ (never through the Python
    functions): the audit counts them at the c10d dispatcher, one per bucket per step, and
    the module's broadcast from rank 0 at construction."""
    ranks = _ok(runs, "ddp")
    document = json.loads(runs["audit_ddp"].read_text())
    for rank in ranks:
        issued = {(kind, group, nbytes): count for kind, group, nbytes, count in rank["issued"]}
        seen = Counter()
        for s in document["per_rank"][str(rank["rank"])]["signatures"]:
            seen[(s["collective"], s["group"], s["bytes"])] += s["count"]
        all_reduces = {k: n for k, n in seen.items() if k[0] == "allreduce"}
        assert all_reduces == {k: n for k, n in issued.items() if k[0] == "allreduce"}
        assert sum(all_reduces.values()) == 1 + 4 * (STEPS - 1)  # the first bucket, then 4 gradients' buckets
        model_broadcast = next(k for k in issued if k[0] == "broadcast")
        assert seen[model_broadcast] == 1
    assert document["summary"]["collectives"] >= 2 * (1 + 4 * (STEPS - 1))
