"""A small DDP script for bench/node_growth.py: each attempt's rank 0 writes OUT/first-step-<attempt> (the unix
time of its first optimizer step), so a bench can time a loss to the next attempt's first step.

    elastic_steps.py OUT STEPS [AFTER_RESTART_STEPS]
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main(out: str, steps: int, after_restart: int) -> None:
    dist.init_process_group("gloo")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 64)
    for step in range(steps if attempt == 0 else after_restart):
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
        if step == 0 and dist.get_rank() == 0:
            with open(os.path.join(out, f"first-step-{attempt}"), "w") as f:
                f.write(repr(time.time()))
        time.sleep(0.05)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 20)
