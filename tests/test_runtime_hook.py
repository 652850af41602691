"""The torch.distributed hook in this process, on a real 1-rank gloo group.

What torchrun adds (two ranks, the bootstrap, the launcher) is in
test_runtime_e2e.py; this module pins the hook's own contract: counts per
signature, one lookup per signature, untouched call semantics, the failure policy,
per-group options, and uninstall restoring torch exactly.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT

import lagom
import lagom.runtime as runtime
from lagom.files.tuned_config import TunedConfig, parse_tuned_config
from lagom.runtime import audit
from lagom.runtime.collectives import C10D_OPS, SPECS
from lagom.runtime.env import merge_env
from lagom.runtime.process_groups import build_nccl_options, settings_for
from nccl_env.knobs import cta_policy_value

CONFIG = {
    "format": "lagom.tuned-config",
    "version": 1,
    "env": {"NCCL_LL128_NTHREADS": "320"},
    "process_groups": {"0": {"min_ctas": 2, "max_ctas": 8}},
    "collectives": [
        {"match": {"collective": "allreduce", "max_bytes": 64}, "set": {"channels": 2}},
        {"match": {"collective": "reducescatter", "group": "0"}, "set": {"channels": 4, "chunk_bytes": 524288}},
    ],
}


@pytest.fixture(autouse=True)
def no_test_knob():
    """The tuned file sets NCCL_LL128_NTHREADS in os.environ: never let it outlive a test."""
    os.environ.pop("NCCL_LL128_NTHREADS", None)
    yield
    os.environ.pop("NCCL_LL128_NTHREADS", None)


@pytest.fixture
def config_file(tmp_path):
    import yaml

    path = tmp_path / "lagom.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    return path


@pytest.fixture
def hook(world, config_file, tmp_path):
    stream = io.StringIO()
    installed = runtime.install(config_file, run_dir=tmp_path / "run", stream=stream)
    installed.test_stream = stream
    yield installed
    runtime.uninstall()


def _counts(hook) -> dict[tuple, tuple[int, int | None]]:
    return {(c.collective, c.group, c.bytes): (c.count, c.entry) for c in hook.signature_counts()}


def test_counts_every_call_under_its_signature_and_matches_the_tuned_entries(hook, world):
    a = torch.ones(8)  # 32 B
    big = torch.ones(64)  # 256 B: above the all-reduce entry's max_bytes
    for _ in range(3):
        dist.all_reduce(a)
    dist.all_reduce(big, group=world)
    dist.all_reduce(tensor=big)
    out = torch.empty(8)
    dist.reduce_scatter_tensor(out, torch.ones(8))
    dist.all_gather([torch.empty(8)], a)
    dist.broadcast(a, 0)
    assert _counts(hook) == {
        ("allreduce", "0", 32): (3, 0),
        ("allreduce", "0", 256): (2, None),
        ("reducescatter", "0", 32): (1, 1),
        ("allgather", "0", 32): (1, None),
        ("broadcast", "0", 32): (1, None),
    }
    summary = hook.summary()
    assert (summary.collectives, summary.matched) == (8, 4)
    assert summary.bytes_matched == 3 * 32 + 32


def test_the_tuned_file_is_consulted_once_per_signature(world, config_file):
    class CountingConfig(TunedConfig):
        lookups = 0

        def lookup(self, *args, **kwargs):
            CountingConfig.lookups += 1
            return super().lookup(*args, **kwargs)

    loaded = parse_tuned_config(CONFIG)
    config = CountingConfig(**{f: getattr(loaded, f) for f in loaded.__dataclass_fields__})
    hook = runtime.Hook(config=config, stream=io.StringIO())
    hook.install()
    try:
        for _ in range(50):
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(16))
    finally:
        hook.uninstall()
    assert CountingConfig.lookups == 2
    assert _counts(hook)[("allreduce", "0", 16)] == (50, 0)


def test_call_semantics_are_untouched(hook, world):
    x = torch.arange(6, dtype=torch.float32)
    work = dist.all_reduce(x, async_op=True)
    assert isinstance(work, dist.Work)  # the async handle comes back as torch made it
    work.wait()
    assert torch.equal(x, torch.arange(6, dtype=torch.float32))
    assert dist.all_reduce(x) is None
    out = torch.empty(6)
    assert dist.all_gather_into_tensor(out, x) is None and torch.equal(out, x)
    # torch's own errors still reach the caller unchanged
    with pytest.raises((ValueError, RuntimeError)):
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(7))
    # P2POp checks its op against c10d's isend/irecv: the wrapped ones must pass
    op = dist.P2POp(dist.isend, torch.ones(1), 0)
    assert op.op is dist.isend
    assert dist.all_reduce.__name__ == "all_reduce" and dist.all_reduce.__doc__


def test_a_call_torch_rejects_raises_torchs_error_and_keeps_the_hook_on(hook, world):
    # wrong arguments are the script's bug, not the hook's: the same error as without
    # Lagom, no warning, and later calls are still counted
    with pytest.raises(TypeError):
        dist.all_reduce("not a tensor")
    with pytest.raises(TypeError):
        dist.all_gather([torch.empty(2)], "not a tensor")
    with pytest.raises(ValueError):
        dist.all_reduce(torch.ones(2), group="no-such-group")
    dist.all_reduce(torch.ones(8))
    assert hook.observing and not hook.failed
    assert "warning" not in hook.test_stream.getvalue()
    assert _counts(hook)[("allreduce", "0", 32)] == (1, 0)


def test_torch_compile_traces_through_the_hook(hook, world):
    """Under torch.compile the wrapper steps aside: dynamo sees torch's own collective. What the
    compiled code runs (functional collectives) is counted at the dispatcher, once per run, and
    tracing (fake tensors) counts nothing."""
    import torch._dynamo

    def step(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1

    compiled = torch.compile(step, backend="aot_eager")
    try:
        for n in (4, 7):  # the second size makes the shapes symbolic
            assert torch.equal(compiled(torch.ones(n)), torch.full((n,), 3.0))
    finally:
        torch._dynamo.reset()
    assert torch.equal(step(torch.ones(2)), torch.full((2,), 3.0))
    assert _counts(hook) == {("allreduce", "0", 16): (1, 0), ("allreduce", "0", 28): (1, 0),
                             ("allreduce", "0", 8): (1, 0)}


def test_collectives_issued_outside_pythons_functions_are_counted_once(hook, world):
    """DDP's buckets (its C++ reducer), the functional collectives of DeviceMesh and DTensor,
    and a call under inference_mode (the dispatcher's autograd keys are off there: the Python
    wrapper counts it): each collective once, whoever issued it."""
    import torch.distributed._functional_collectives as funcol
    from torch.nn.parallel import DistributedDataParallel

    assert hook.dispatcher_counts
    model = torch.nn.Linear(4, 2)  # 32 B of weight, 8 B of bias: one bucket of 40 B
    ddp = DistributedDataParallel(model)
    before = _counts(hook)
    ddp(torch.ones(3, 4)).sum().backward()
    after = _counts(hook)
    assert after[("allreduce", "0", 40)][0] - before.get(("allreduce", "0", 40), (0, None))[0] == 1
    funcol.wait_tensor(funcol.all_reduce(torch.ones(5), "sum", dist.group.WORLD))  # 20 B
    funcol.wait_tensor(funcol.all_gather_tensor(torch.ones(3), 0, dist.group.WORLD))  # 12 B x 1 rank
    with torch.inference_mode():
        dist.all_reduce(torch.ones(7))  # 28 B
    counts = _counts(hook)
    assert counts[("allreduce", "0", 20)][0] == 1
    assert counts[("allgather", "0", 12)][0] == 1
    assert counts[("allreduce", "0", 28)][0] == 1


def test_uninstall_restores_torch_exactly(world, config_file):
    import torch.distributed.distributed_c10d as c10d

    before = {s.function: getattr(dist, s.function, None) for s in SPECS}
    helper = c10d._new_process_group_helper
    isend = c10d.isend
    runtime.install(config_file, stream=io.StringIO())
    assert dist.all_reduce is not before["all_reduce"]
    assert c10d.isend is dist.isend is not isend
    assert "Autograd[alias]: registered at" in torch._C._dispatch_dump("c10d::allreduce_")  # the counting kernel
    runtime.uninstall()
    assert {s.function: getattr(dist, s.function, None) for s in SPECS} == before
    assert c10d._new_process_group_helper is helper and c10d.isend is isend
    assert not [op.name for op in C10D_OPS if "c10d_observer" in torch._C._dispatch_dump(op.qualified)]


def test_an_internal_failure_disables_the_hook_with_one_warning_and_the_call_proceeds(world):
    class BrokenConfig(TunedConfig):
        def lookup(self, *args, **kwargs):
            raise RuntimeError("simulated bug in the matcher")

    stream = io.StringIO()
    hook = runtime.Hook(config=BrokenConfig(), stream=stream)
    hook.install()
    try:
        x = torch.ones(3)
        for _ in range(4):
            assert dist.all_reduce(x) is None
        dist.all_reduce(torch.ones(9))
    finally:
        hook.uninstall()
    assert torch.equal(x, torch.ones(3))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "warning" in lines[0] and "simulated bug" in lines[0]
    assert hook.observing is False and hook.signature_counts() == []


def test_a_corrupt_config_leaves_torch_untouched_with_one_warning(world, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: lagom.tuned-config\nversion: 1\ncollectives: {oops: 1}\n")
    original = dist.all_reduce
    stream = io.StringIO()
    hook = lagom.install(bad, stream=stream)
    assert dist.all_reduce is original and not hook.observing
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0] and "'collectives' must be a list" in lines[0]


def test_env_knobs_are_set_but_the_users_own_value_wins(world, config_file):
    runtime.install(config_file, stream=io.StringIO())
    runtime.uninstall()
    assert os.environ["NCCL_LL128_NTHREADS"] == "320"
    os.environ["NCCL_LL128_NTHREADS"] = "5"
    stream = io.StringIO()
    runtime.install(config_file, stream=stream)
    runtime.uninstall()
    assert os.environ["NCCL_LL128_NTHREADS"] == "5"
    assert stream.getvalue() == "lagom: note: your environment wins for NCCL_LL128_NTHREADS=5 (tuned: 320)\n"
    env = {"NCCL_A": "1"}
    merged = merge_env({"NCCL_A": "2", "NCCL_B": "3"}, env)
    assert env == {"NCCL_A": "1", "NCCL_B": "3"}
    assert merged.kept == {"NCCL_A": ("1", "2")} and "NCCL_A=1 (tuned: 2)" in merged.kept_line()


def test_an_entry_for_one_group_does_not_match_another(hook, world):
    sub = dist.new_group([0])
    assert sub.group_name != "0"
    for group in (None, sub):
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(4), group=group)
        dist.all_reduce(torch.ones(2), group=group)
    counts = _counts(hook)
    assert counts[("reducescatter", "0", 16)] == (1, 1)
    assert counts[("reducescatter", sub.group_name, 16)] == (1, None)  # entry 1 says group "0"
    assert counts[("allreduce", sub.group_name, 8)] == (1, 0)  # entry 0 names no group
    assert hook._injector.decisions == []  # no tuned options for the new group
    dist.destroy_process_group(sub)


def test_gloo_default_group_with_tuned_options_is_reported_not_touched(config_file, tmp_path):
    """Group "0" with tuned NCCL options, created on gloo: untouched, one note."""
    script = textwrap.dedent(
        f"""
        import io, sys, torch, torch.distributed as dist
        import lagom
        hook = lagom.install({str(config_file)!r})
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.new_group([0])
        print([d.to_dict() for d in hook._injector.decisions])
        """
    )
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "[{'group': '0', 'desc': 'default_pg', 'status': 'not-nccl', 'applied': {}}]" in done.stdout
    notes = [line for line in done.stderr.splitlines() if line.startswith("lagom:")]
    assert notes == [
        "lagom: note: process group '0' does not use NCCL: its tuned options do not apply",
        "lagom: rank 0: 0 collectives, 0 matched a tuned entry (-), 0 B of 0 B covered (-)",
    ]


def test_nccl_options_carry_the_tuned_fields_this_torch_has():
    """ProcessGroupNCCL is absent from this CPU torch: a stand-in with the same shape."""

    class Config:  # like ProcessGroupNCCL.Options().config on torch >= 2.3 without cta_policy
        min_ctas = -1
        max_ctas = -1

    class Options:
        def __init__(self):
            self.config = Config()
            self.is_high_priority_stream = True

    options, applied, missing = build_nccl_options(Options, {"min_ctas": 2, "max_ctas": 8, "cta_policy": "efficiency"})
    assert (options.config.min_ctas, options.config.max_ctas) == (2, 8)
    assert options.is_high_priority_stream is False
    assert applied == {"min_ctas": 2, "max_ctas": 8} and missing == ["cta_policy"]
    assert cta_policy_value("zero") == 2 and cta_policy_value(1) == 1 and cta_policy_value("3") == 3
    with pytest.raises(ValueError):
        cta_policy_value("fastest")
    with pytest.raises(ValueError):
        build_nccl_options(Options, {"min_ctas": -2})
    assert settings_for({"mesh_dp": {"max_ctas": 4}}, "3", "mesh_dp") == {"max_ctas": 4}
    assert settings_for({"0": {"max_ctas": 4}}, "1", "default_pg") is None


def test_rank_part_summary_and_merge(hook, world, tmp_path):
    dist.all_reduce(torch.ones(8))
    dist.all_reduce(torch.ones(8))
    dist.reduce_scatter_tensor(torch.empty(8), torch.ones(8))
    hook.finish()
    part_file = tmp_path / "run" / "audit" / "rank-0.json"
    assert part_file.is_file()
    assert hook.test_stream.getvalue().splitlines()[-1] == (
        "lagom: rank 0: 3 collectives, 3 matched a tuned entry (100%), 96 B of 96 B covered (100%)"
    )
    parts = audit.read_parts(tmp_path / "run")
    other = dict(parts[0], rank=1)
    merged = audit.merge_parts([parts[0], other], [{"channels": 2}, {"channels": 4}], "lagom.yaml")
    assert merged["ranks"] == 2 and merged["summary"]["collectives"] == 6
    row = next(r for r in merged["signatures"] if r["collective"] == "allreduce")
    assert (row["count"], row["ranks"], row["set"]) == (4, [0, 1], {"channels": 2})


def test_bootstrap_chains_an_existing_sitecustomize_and_hooks_on_torch_import(tmp_path, config_file):
    from lagom.runtime.bootstrap import SITECUSTOMIZE

    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    script = textwrap.dedent(
        """
        import os, sys
        print("before", "torch" in sys.modules, os.environ.get("USER_SITECUSTOMIZE_RAN"))
        from torch.distributed import all_reduce
        import torch.distributed as dist
        print("after", hasattr(all_reduce, "__lagom_original__"), hasattr(dist.isend, "__lagom_original__"))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(boot), str(user), str(REPO_ROOT)]),
               LAGOM_CONFIG=str(config_file))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["before False 1", "after True True"]
    assert "lagom:" not in done.stderr  # nothing to say: no group was created
