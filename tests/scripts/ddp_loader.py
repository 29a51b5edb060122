"""A DDP script in the tutorials' shape, with a DataLoader and a DistributedSampler (tests/test_script_metrics.py).

    ddp_loader.py --out DIR [--epochs E] [--accum K] [--launcher-log] [--wandb] [--fail-rank R --fail-step S] [--sleep S]
                  [--global-batch B]

Nothing in it knows the launcher except --launcher-log, which calls launcher.log() (a no-op under torchrun). Rank 0
writes DIR/result.json: its optimizer steps, its last loss, with --wandb the id of the W&B run it started, and
whether it started with a W&B service's token in its environment (a fresh torchrun worker has none).
--fail-rank R --fail-step S: rank R raises at optimizer step S of the first attempt (to be restarted).
--global-batch B: each rank's DataLoader takes B / WORLD_SIZE, as a script that keeps its global batch does (strong
scaling, tests/test_scale_scripts.py); without it every rank takes 16 whatever the world size.
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

BATCH = 16
INHERITED = "WANDB_SERVICE" in os.environ  # before this script's own wandb.init sets it


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--launcher-log", action="store_true")
    p.add_argument("--wandb", action="store_true")
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-step", type=int, default=-1)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--global-batch", type=int, default=0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = None
    if args.wandb and rank == 0:
        import wandb

        run = wandb.init(project="user-project", mode="offline", dir=args.out)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = TensorDataset(torch.randn(1024, 32, generator=torch.Generator().manual_seed(1)),
                         torch.randint(0, 4, (1024,), generator=torch.Generator().manual_seed(2)))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    batch = args.global_batch // dist.get_world_size() if args.global_batch else BATCH
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    steps, last = 0, None
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.cross_entropy(model(x), y) / args.accum
            loss.backward()
            if (i + 1) % args.accum:
                continue
            optimizer.step()
            optimizer.zero_grad()
            steps, last = steps + 1, loss.item() * args.accum
            if args.launcher_log:
                import launcher

                launcher.log({"loss": last, "lr": 0.05})
                launcher.log({"seen": float(steps * batch * args.accum)}, per_rank=True)
            if run is not None:
                run.log({"loss": last})
            if attempt == 0 and rank == args.fail_rank and steps == args.fail_step:
                raise RuntimeError(f"rank {rank} fails at step {steps}")
            time.sleep(args.sleep)
    if rank == 0:
        with open(os.path.join(args.out, "result.json"), "w") as f:
            json.dump({"steps": steps, "loss": last, "wandb_id": run.id if run is not None else None,
                       "wandb_service_inherited": INHERITED}, f)
    if run is not None:
        run.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
