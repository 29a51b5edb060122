"""A minimal hand-written DDP loop: the baseline our trainer is measured against (run with torchrun).

Same model class, data, batch, optimizer and timing rule as trainers/train.py: wall clock per step
after 3 warm-up steps, data loading included. Rank 0 prints one JSON line.
"""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launcher.trainers.data import teacher_dataset  # noqa: E402
from launcher.trainers.models import MLP  # noqa: E402

WARMUP = 3


def main() -> None:
    steps, batch = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(MLP(256, 512, 4, 10))
    data = teacher_dataset(8192, 256, 10, 0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step, start = 0, 0.0
    while step < steps:
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step == WARMUP:
                start = time.perf_counter()
            if step == steps:
                break
    per_step = (time.perf_counter() - start) / (steps - WARMUP)
    if rank == 0:
        print(json.dumps({"step_time_s_wall": per_step, "samples_per_s": batch * world / per_step}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
