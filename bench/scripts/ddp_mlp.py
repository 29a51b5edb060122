"""A plain torchrun-style DDP script (what a user brings): the same ~0.8M-parameter MLP as the
built-in default. Rank 0 prints FIRST_STEP_AT=<unix time> after its first optimizer step."""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for step in range(int(os.environ.get("BENCH_STEPS", "20"))):
        x, y = torch.randn(32, 256, generator=g), torch.randint(0, 10, (32,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0 and rank == 0:
            print(f"FIRST_STEP_AT={time.time()!r}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
