"""The shape of PyTorch's "Getting Started with Distributed Data Parallel" tutorial, for exit stress runs
(tests/test_exit_stress.py, bench/launch_stress.py).

    stress_ddp_tutorial.py OUT_DIR

A few SGD steps of a small DDP-wrapped model on seeded random data; each rank writes
OUT_DIR/done-<RANK> with its last loss. The process group is then destroyed while the DDP model is
still alive (no `del`), as the tutorial does: the exit path that used to hang.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def demo_basic(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    data = torch.Generator().manual_seed(1000 + rank)
    for _ in range(5):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=data))
        labels = torch.randn(20, 5, generator=data)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
    with open(os.path.join(out, f"done-{rank}"), "w") as f:
        f.write(f"{loss.item():.6f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic(sys.argv[1])
