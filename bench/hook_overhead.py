"""What Lagom's torch.distributed hook adds per collective call and per training step.

    python3 bench/hook_overhead.py [--calls 20000] [--rounds 7] [--steps 40]

Three measurements, each side by side in one run: hooked and plain blocks alternate,
so drift hits both alike. On a shared machine other processes steal time from random
blocks; the minimum over the rounds is the figure least touched by that, so each line
gives min-based figures and, in brackets, the median of the paired differences.

1. isolated: the hook's wrapper around a no-op stand-in for the collective: exactly
   the time the hook adds (flag test, byte count, cached signature lookup, increment);
2. live: real gloo collectives on a 1-rank group (small all_reduce, all_gather_single,
   reduce_scatter_single), plain vs hooked;
3. e2e: a 2-rank gloo job under torchrun running the end-to-end test's training step
   (ZeRO-style MLP with reduce-scatter, all-gather, all-reduces), plain vs hooked
   step time.

Targets: < 2 us added per call, < 1% on the step time. On a busy shared
machine (2 cores, other jobs) paired blocks differ by several percent either way,
more than the hook can cost; so the last line also bounds the step-time cost from
(1): added us per call x calls per step / step time, which that noise cannot blur.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from runtime_job import flat_layout, mlp  # noqa: E402  (the end-to-end test's job: tests/ is not a package)

CONFIG = """\
format: lagom.tuned-config
version: 1
collectives:
  - match: {collective: allreduce, max_bytes: 64}
    set: {channels: 2}
  - match: {collective: reducescatter}
    set: {channels: 4, chunk_bytes: 524288}
"""


def _config_path() -> str:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        handle.write(CONFIG)
    return handle.name


def _block(fn, calls: int) -> float:
    """Mean seconds per call of ``fn`` over ``calls`` calls (after a full GC, so that
    garbage left by installing the hook is not collected inside a hooked block)."""
    gc.collect()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def single_process(calls: int, rounds: int) -> float:
    """Runs (1) and (2); returns the isolated added us per call."""
    import torch
    import torch.distributed as dist

    import lagom.runtime as runtime
    from lagom.runtime.collectives import SPECS

    config = _config_path()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    small = torch.ones(16)
    out = torch.empty(16)

    # 1. isolated: the wrapper around a no-op with all_reduce's signature.
    def noop(tensor, op=None, group=None, async_op=False):
        return None

    hook = runtime.install(config)
    spec = next(s for s in SPECS if s.function == "all_reduce")
    wrapped = hook._wrap(spec, noop, ["tensor", "op", "group", "async_op"])
    plain_us, hooked_us = [], []
    block = max(calls // 10, 100)  # many short blocks: the minimum then dodges other load
    for _ in range(10 * rounds):
        plain_us.append(_block(lambda: noop(small), block) * 1e6)
        hooked_us.append(_block(lambda: wrapped(small), block) * 1e6)
    runtime.uninstall()
    added = min(hooked_us) - min(plain_us)
    print(
        f"isolated  wrapper around a no-op      plain {min(plain_us):7.3f} us  hooked {min(hooked_us):7.3f} us  "
        f"added {added:6.3f} us/call  [median paired "
        f"{statistics.median(h - p for h, p in zip(hooked_us, plain_us)):.3f}]"
    )

    # 2. live gloo collectives, 1 rank.
    cases = {
        "all_reduce 64 B": lambda: dist.all_reduce(small),
        "all_gather_single 64 B": lambda: dist.all_gather_single(out, small),
        "reduce_scatter_single 64 B": lambda: dist.reduce_scatter_single(out, small),
    }
    live_calls = max(calls // 60, 100)
    for name, call in cases.items():
        plain_us, hooked_us = [], []
        for i in range(2 * rounds):
            for hooked in (False, True) if i % 2 == 0 else (True, False):  # ABBA: no order bias
                if hooked:
                    runtime.install(config)
                    hooked_us.append(_block(call, live_calls) * 1e6)
                    runtime.uninstall()
                else:
                    plain_us.append(_block(call, live_calls) * 1e6)
        p, h = min(plain_us), min(hooked_us)
        paired = statistics.median(hh - pp for hh, pp in zip(hooked_us, plain_us))
        print(f"live      {name:28s} plain {p:7.2f} us  hooked {h:7.2f} us  added {h - p:6.2f} us/call  [median paired "
              f"{paired:+.2f}]")
    dist.destroy_process_group()
    os.unlink(config)
    return added


def worker(steps: int, rounds: int) -> None:
    """One rank of the e2e measurement (started by torchrun)."""
    import torch
    import torch.distributed as dist

    import lagom.runtime as runtime

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = mlp(0)
    params, numel, padded, shard = flat_layout(model, world)
    flat = torch.zeros(padded)
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(16, 32, generator=generator)
    y = torch.randn(16, 8, generator=generator)

    def step() -> int:
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params] + [torch.zeros(padded - numel)])
        grad_shard = torch.empty(shard)
        dist.reduce_scatter_single(grad_shard, grads)
        dist.all_gather_single(flat, flat[rank * shard : (rank + 1) * shard] - 0.01 * grad_shard)
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        gathered = [torch.empty(1) for _ in range(world)]
        dist.all_gather(gathered, loss.detach().reshape(1))
        dist.all_reduce(grads.norm().reshape(1))
        return 5  # collectives per step

    config = os.environ["BENCH_CONFIG"]
    for _ in range(5):
        step()  # warm-up
    plain_ms, hooked_ms = [], []
    per_step = 0
    for i in range(rounds):
        for hooked in (False, True) if i % 2 == 0 else (True, False):  # ABBA: no order bias
            if hooked:
                runtime.install(config)
            gc.collect()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                per_step = step()
            (hooked_ms if hooked else plain_ms).append((time.perf_counter() - start) / steps * 1e3)
            if hooked:
                runtime.uninstall()
    if rank == 0:
        p, h = min(plain_ms), min(hooked_ms)
        ratios = [hh / pp for hh, pp in zip(hooked_ms, plain_ms)]
        print(
            f"e2e       2-rank gloo step ({per_step} collectives)  plain {p:7.3f} ms  hooked {h:7.3f} ms  "
            f"ratio {h / p:.4f}  [median paired {statistics.median(ratios):.4f} over {rounds} rounds]"
        )
        print(f"STEP {p} {per_step}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="calls per isolated block")
    parser.add_argument("--rounds", type=int, default=20, help="paired plain/hooked blocks")
    parser.add_argument("--steps", type=int, default=5, help="training steps per e2e block")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.rounds)
        return
    import torch

    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    added_us = single_process(args.calls, args.rounds)
    config = _config_path()
    env = dict(os.environ, BENCH_CONFIG=config, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__, "--worker",
           "--steps", str(args.steps), "--rounds", str(2 * args.rounds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith("STEP "):
            step_ms, per_step = float(line.split()[1]), int(line.split()[2])
            bound = added_us * per_step / (step_ms * 1e3)
            print(f"bound     {added_us:.3f} us x {per_step} calls / {step_ms:.3f} ms step = {100 * bound:.3f}% of the "
                  "step")
        else:
            print(line)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        sys.exit(done.returncode)
    os.unlink(config)


if __name__ == "__main__":
    main()
