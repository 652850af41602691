"""A small training job for the runtime's end-to-end tests (run under torchrun, gloo, CPU).

Trains two models a few steps:

- a ZeRO-style MLP whose gradients are reduce-scattered (``reduce_scatter_tensor``), whose
  parameter shards are all-gathered back (``all_gather_into_tensor``), with the loss
  all-reduced, per-rank losses all-gathered (``all_gather``), a stats vector
  reduce-scattered through the list API (``reduce_scatter``) and a subgroup
  all-reduce, all on explicit calls;
- with ``--fsdp``, the same MLP under FSDP2 (``fully_shard``), whose all-gathers and
  reduce-scatters are counted through FSDP's own custom-collective API;
- with ``--ddp``, only an MLP under DistributedDataParallel, whose reducer all-reduces
  the gradient buckets from C++, never through torch.distributed's Python functions.
  The first step's bucket holds every gradient (DDP's first bucket is 1 MiB); then
  DDP rebuilds its buckets under a cap so small that each gradient is a bucket of its
  own: the job tallies one all-reduce of the whole model, then one per parameter per step.

Every collective the job issues is tallied by the job itself (type, group, bytes), so
a test can compare Lagom's audit against it. Each rank writes ``rank-R.json`` into
``--out`` with its losses (as float.hex, for bit-exact comparison), the NCCL_* /
LAGOM_* environment it saw, its tally and its group names. ``--install FILE`` calls
``lagom.install(FILE)`` first (the in-script door).
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--install", default=None)
    args = parser.parse_args()
    if args.install:
        import lagom

        lagom.install(args.install)

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    issued: Counter = Counter()

    def tally(kind: str, group, nbytes: int) -> None:
        name = (group if group is not None else dist.group.WORLD).group_name
        issued[(kind, name, nbytes)] += 1

    if args.ddp:
        losses = train_ddp(args.steps, rank, tally)
        record = {"rank": rank, "losses": [float(v).hex() for v in losses],
                  "issued": [[kind, group, nbytes, count] for (kind, group, nbytes), count in sorted(issued.items())],
                  "groups": {"world": dist.group.WORLD.group_name}}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps(record, indent=1))
        dist.destroy_process_group()
        return
    sub = dist.new_group(list(range(world)))
    model = mlp(0)
    params, _, padded, shard = flat_layout(model, world)
    flat = torch.zeros(padded)
    with torch.no_grad():
        offset = 0
        for p in params:
            flat[offset : offset + p.numel()] = p.reshape(-1)
            offset += p.numel()
    dist.broadcast(flat, src=0)
    tally("broadcast", None, flat.nbytes)

    def load(flat_params: torch.Tensor) -> None:
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(flat_params[offset : offset + p.numel()].view_as(p))
                offset += p.numel()

    load(flat)
    losses = []
    for x, y in batches(args.steps, 1000 + rank):
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        grads = torch.zeros(padded)
        offset = 0
        for p in params:
            grads[offset : offset + p.numel()] = p.grad.reshape(-1)
            offset += p.numel()
        grad_shard = torch.empty(shard)
        dist.reduce_scatter_tensor(grad_shard, grads)
        tally("reducescatter", None, grads.nbytes)
        param_shard = flat[rank * shard : (rank + 1) * shard] - 0.05 * grad_shard / world
        dist.all_gather_into_tensor(flat, param_shard)
        tally("allgather", None, flat.nbytes)
        load(flat)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        tally("allreduce", None, mean_loss.nbytes)
        per_rank = [torch.empty(1) for _ in range(world)]
        dist.all_gather(per_rank, loss.detach().reshape(1))
        tally("allgather", None, sum(t.nbytes for t in per_rank))
        stats = [torch.full((4,), float(rank + i)) for i in range(world)]
        stats_out = torch.empty(4)
        dist.reduce_scatter(stats_out, stats)
        tally("reducescatter", None, sum(t.nbytes for t in stats))
        norm = grads.norm().reshape(1)
        work = dist.all_reduce(norm, group=sub, async_op=True)
        work.wait()  # the async work handle must come back untouched
        tally("allreduce", sub, norm.nbytes)
        losses.append((mean_loss / world).item())

    fsdp_losses = []
    if args.fsdp:
        fsdp_losses = train_fsdp(args.steps, rank, tally)

    record = {
        "rank": rank,
        "losses": [float(v).hex() for v in losses],
        "fsdp_losses": [float(v).hex() for v in fsdp_losses],
        "params": [float(v).hex() for v in flat[:8].tolist()],
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "LAGOM_")) or k == "PYTHONPATH"},
        "issued": [[kind, group, nbytes, count] for (kind, group, nbytes), count in sorted(issued.items())],
        "groups": {"world": dist.group.WORLD.group_name, "sub": sub.group_name},
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank-{rank}.json").write_text(json.dumps(record, indent=1))
    dist.destroy_process_group()


def train_fsdp(steps: int, rank: int, tally) -> list[float]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

    class CountedAllGather(DefaultAllGather):
        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            tally("allgather", group, max(output_tensor.nbytes, input_tensor.nbytes))
            return super().__call__(output_tensor, input_tensor, group, async_op)

    class CountedReduceScatter(DefaultReduceScatter):
        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            tally("reducescatter", group, max(output_tensor.nbytes, input_tensor.nbytes))
            return super().__call__(output_tensor, input_tensor, group, op, async_op)

    model = mlp(1)
    units = [model[0], model[2]]
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    for unit in units:
        unit.set_custom_all_gather(CountedAllGather())
        unit.set_custom_reduce_scatter(CountedReduceScatter())
    return train(model, steps, 2000 + rank)


def train_ddp(steps: int, rank: int, tally) -> list[float]:
    from torch.nn.parallel import DistributedDataParallel

    model = mlp(2)
    # a cap below every gradient's size: each gradient is one bucket, one all-reduce per step
    ddp = DistributedDataParallel(model, bucket_cap_mb=1e-6)
    tally("broadcast", None, sum(p.nbytes for p in model.parameters()))  # the module's state, from rank 0

    def tally_buckets(step: int) -> None:
        if step == 0:
            tally("allreduce", None, sum(p.nbytes for p in model.parameters()))
        else:
            for p in model.parameters():
                tally("allreduce", None, p.nbytes)

    return train(ddp, steps, 3000 + rank, tally_buckets)


def mlp(seed: int):
    """The jobs' MLP (32 -> 64 -> 8), its weights drawn with torch's global seed ``seed``."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))


def flat_layout(model, world: int) -> tuple[list, int, int, int]:
    """ZeRO's flat view of ``model``: its parameters, their element count, that count padded to a
    multiple of ``world``, and one rank's shard of the padded count."""
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    padded = -(-numel // world) * world
    return params, numel, padded, padded // world


def batches(steps: int, seed: int) -> Iterator:
    """``steps`` (x, y) batches of the MLP's shapes, drawn from their own generator seeded ``seed``."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=generator)
        yield x, torch.randn(16, 8, generator=generator)


def train(module, steps: int, seed: int, after_backward: Callable[[int], None] = lambda step: None) -> list[float]:
    """``steps`` SGD steps (lr 0.05) of ``module`` on :func:`batches` drawn from ``seed``;
    ``after_backward(step)`` runs between each step's backward and its optimizer step. The losses."""
    import torch

    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    losses = []
    for step, (x, y) in enumerate(batches(steps, seed)):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(module(x), y)
        loss.backward()
        after_backward(step)
        optimizer.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    main()
