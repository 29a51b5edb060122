"""A DDP script for the board's pages (tests/test_board_pages.py): STEPS steps, each logging its loss and lr with
launcher.log (every call kept: more calls than a chart draws), every 10th its rank's samples seen (per_rank=True);
rank SLOW sleeps 40 ms a step from step FROM to TO, so the other ranks wait for it there (a straggler the launcher
names while it lasts).

    slow_while_logging.py STEPS SLOW FROM TO
"""

import sys
import time

import torch
import torch.distributed as dist

import launcher


def main(steps: int, slow: int, start: int, end: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        if rank == slow and start <= i < end:
            time.sleep(0.04)
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        launcher.log({"loss": loss, "lr": 0.01 * (1 - i / steps)})
        if i % 10 == 0:
            launcher.log({"seen": 4 * (i + 1)}, per_rank=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:5]))
