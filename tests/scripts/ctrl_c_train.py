"""A plain DDP script that trains for a few seconds, for Ctrl-C rounds (tests/ctrl_c_rounds.py).

    ctrl_c_train.py [STEPS]

The shape of PyTorch's DDP tutorial, with a line at each phase so a round can aim its Ctrl-C:
"start" before init_process_group, "step N" every 20 steps, "done" after the last step (then the
process group is destroyed and the script returns).
"""

import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def main(steps: int) -> None:
    print("start", flush=True)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)))
    optimizer = optim.SGD(model.parameters(), lr=0.001)
    for step in range(steps):
        optimizer.zero_grad()
        nn.MSELoss()(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
        time.sleep(0.01)
        if step % 20 == 0:
            print(f"step {step}", flush=True)
    print(f"done on rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
