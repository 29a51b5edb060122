"""The shape of PyTorch's "Getting Started with Distributed Data Parallel" tutorial (tests/test_torchrun_fidelity.py).

    ddp_tutorial.py --out DIR

A few SGD steps of a small DDP-wrapped model on seeded random data; rank 0 writes DIR/result.json
(a parameter checksum and every parameter's values). The process group is destroyed while the DDP model is
still alive, as the tutorial does.
"""

import json
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
    torch.manual_seed(0)  # the same initial weights on every rank (DDP would broadcast rank 0's anyway)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    for _ in range(5):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=data))
        labels = torch.randn(20, 5, generator=data)
        loss_fn(outputs, labels).backward()
        optimizer.step()
    if rank == 0:
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        params = {name: p.detach().flatten().tolist() for name, p in model.named_parameters()}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"checksum": checksum, "params": params}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    demo_basic(sys.argv[sys.argv.index("--out") + 1])
