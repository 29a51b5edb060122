"""A small DDP script for bench/spare_recovery.py: every rank writes OUT/first-<pid> (the unix time of its first
optimizer step), so a bench can time a lost node to the first step of the ranks started after it; it steps until
stopped.

    first_steps.py OUT
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(out: str) -> None:
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 64)
    step = 0
    while True:
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
        if step == 0:
            path = os.path.join(out, f"first-{os.getpid()}")
            with open(path + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.replace(path + ".tmp", path)
        step += 1
        time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1])
