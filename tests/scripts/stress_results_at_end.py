"""A plain torchrun-style script that writes its results at the very end, for exit stress runs
(tests/test_exit_stress.py, bench/launch_stress.py).

    stress_results_at_end.py OUT_DIR

A few all_reduce calls, a little training of a local model kept in step by averaging its gradients
by hand, then each rank writes OUT_DIR/done-<RANK> (its loss and the all_reduce sum) and calls
destroy_process_group() as the script's last act.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.zeros(1)
    for i in range(3):
        t = torch.full((1,), float(rank + i))
        dist.all_reduce(t)
        total += t
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(2000 + rank)
    for _ in range(5):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(16, 8, generator=data)), torch.randn(16, 1, generator=data))
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        optimizer.step()
    with open(os.path.join(out, f"done-{rank}"), "w") as f:
        f.write(f"{loss.item():.6f} {total.item():.1f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
