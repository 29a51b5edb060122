"""A DDP script that logs every step (tests/test_logged_series.py): 500 steps, each after its optimizer step
launcher.log({"loss", "my_lr"}) on rank 0's side, launcher.log({"tokens"}, per_rank=True) on every rank, an
evaluation every 100 steps at a step of its own (step=N), and a string once; it writes what it logged to OUT.

    log_every_step.py OUT [--steps N] [--lr LR]
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

import launcher

def main(out: str, steps: int, lr: float) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    logged = {"loss": [], "tokens": [], "val": []}
    for i in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        launcher.log({"loss": loss, "my_lr": lr * (1 - i / steps)})  # a tensor: .item() off the training thread
        launcher.log({"tokens": rank * 10_000 + i}, per_rank=True)
        logged["loss"].append(loss.item())
        logged["tokens"].append(rank * 10_000 + i)
        if (i + 1) % 100 == 0:
            launcher.log({"val": float(i)}, step=10_000 + i)
            logged["val"].append(float(i))
    launcher.log({"note": "strings are not numbers"})
    with open(os.path.join(out, f"logged-{rank}.json"), "w") as f:
        json.dump(logged, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    main(args.out, args.steps, args.lr)
