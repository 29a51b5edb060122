"""A DDP script one rank of which is slow (tests/test_stragglers.py): the others then wait for it in each step's
gradient all-reduce, so every rank's step time is the slow rank's.

    slow_rank.py RANK HOW STEPS

HOW: sleep (rank RANK sleeps 40 ms a step, outside forward and backward), cgroup:DIR (rank RANK moves itself into
the cgroup-v1 CPU group DIR, which the test limited, and computes there), none (a uniform run). With CUDA the
model and batch are on the rank's GPU (NCCL where each rank has one, else gloo on a shared GPU): DDP then times its
iterations with CUDA events (tests/test_stragglers_gpu.py).
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def main(slow: int, how: str, steps: int) -> None:
    gpus, local = torch.cuda.device_count(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local % gpus) if gpus else torch.device("cpu")
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    dist.init_process_group("nccl" if gpus >= per_node else "gloo", device_id=device if gpus >= per_node else None)
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(layers, device_ids=[device.index] if gpus else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 256, device=device)
    if rank == slow and how.startswith("cgroup:"):  # from the first step on (not DDP's start, seconds of CPU)
        with open(os.path.join(how.split(":", 1)[1], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))  # every thread of this rank: all it does is throttled
    for _ in range(steps):
        if rank == slow and how == "sleep":
            time.sleep(0.04)
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
