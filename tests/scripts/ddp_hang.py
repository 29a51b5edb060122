"""The shape of PyTorch's DDP tutorial, with a rank that stops (tests/test_hangs.py). Imports nothing of the launcher.

    ddp_hang.py --hang RANK --at STEP   rank RANK sleeps forever before its step STEP (the others block in DDP's all-reduce)
    ddp_hang.py --hang RANK --at 0      rank RANK sleeps forever before init_process_group (the others wait in it)
    ddp_hang.py --steps N --step-s S    healthy: N steps, each taking S seconds more than its compute

Every rank prints "step K" after each optimizer step.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def sleep_forever() -> None:
    print(f"rank {os.environ['RANK']} hangs now", flush=True)
    while True:
        time.sleep(3600)


def demo_basic(args: argparse.Namespace) -> None:
    rank = int(os.environ["RANK"])
    if rank == args.hang and args.at == 0:
        sleep_forever()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5))
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    data = torch.Generator().manual_seed(1000 + rank)
    for step in range(1, args.steps + 1):
        if rank == args.hang and step == args.at:
            sleep_forever()
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=data))
        labels = torch.randn(20, 5, generator=data)
        loss_fn(outputs, labels).backward()
        time.sleep(args.step_s)
        optimizer.step()
        print(f"step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--hang", type=int, default=-1)
    p.add_argument("--at", type=int, default=-1)
    p.add_argument("--steps", type=int, default=1000000)
    p.add_argument("--step-s", type=float, default=0.05)
    demo_basic(p.parse_args())
