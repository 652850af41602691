"""A small training job for the online-tuning tests (torchrun, gloo, CPU): a torch optimizer, no Lagom code.

Each step: forward, backward, all-reduce of the gradients (the job's own collectives),
``optimizer.step()`` (the step boundary Lagom's global optimizer hook sees). Each rank
writes ``rank-R.json`` into ``--out`` with its losses as float.hex (bit-exact
comparison with and without Lagom) and the NCCL_* / TORCH_NCCL_* / LAGOM_* environment
it ran with. ``--die-at RANK:STEP`` makes that rank exit
abruptly after that many steps (the test that a lost rank ends the job, not hangs it).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--die-at", default=None, metavar="RANK:STEP")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from gloo_exit import leave_gloo_job

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    die_rank, die_step = (int(x) for x in args.die_at.split(":")) if args.die_at else (-1, -1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(100 + rank)
    losses = []
    for step in range(args.steps):
        if rank == die_rank and step == die_step:
            os._exit(9)
        x = torch.randn(8, 16, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            grad = p.grad
            if grad is None:  # every parameter takes part in the loss; None would be a bug in the job
                raise RuntimeError("a parameter got no gradient")
            dist.all_reduce(grad)
            grad /= world
        optimizer.step()
        losses.append(float(loss.detach()).hex())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_", "LAGOM_"))}
    (out / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "losses": losses, "env": env}))
    leave_gloo_job()


if __name__ == "__main__":
    main()
