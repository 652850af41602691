"""A small DistributedDataParallel job (torchrun, gloo, CPU) whose recording is tests/data/gloo_ddp_w2_rank{0,1}.

Each step: forward, backward (DDP all-reduces the gradients in two buckets, from C++,
on gloo's own thread), ``optimizer.step()`` (the step boundary ``lagom record`` sees).
No Lagom code: ``lagom record -o DIR --skip 2 --timed 2 --warmup 1 --active 5 --
torchrun --standalone --nproc_per_node 2 tests/ddp_job.py`` wrote the committed traces.
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from gloo_exit import leave_gloo_job
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 64))
    # two buckets once DDP rebuilds them after the first step (its logging data says so):
    # the second layer and the first bias (262,400 bytes), then the first layer (2,101,248)
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.08)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(100 + rank)
    for _ in range(args.steps):
        x = torch.randn(32, 512, generator=generator)
        loss = ddp(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    leave_gloo_job()


if __name__ == "__main__":
    main()
