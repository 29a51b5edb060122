"""A DDP script whose rank RANK is slow in the job's first attempt only, as a node with a bad CPU is slow until a
spare takes its place (tests/test_eviction.py).

    slow_node.py OUT RANK HOW STEPS

HOW: sleep (40 ms more a step), cgroup:DIR (the rank moves itself into the cgroup-v1 CPU group DIR, which the test
limited), none (a uniform run). Every rank sleeps 10 ms a step beside its compute, so the step time is steady on a
loaded machine. Rank 0 writes each step's time to OUT/steps-<TORCHELASTIC_RESTART_COUNT>.txt.
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def main(out: str, slow: int, how: str, steps: int) -> None:
    dist.init_process_group("gloo")
    rank, attempt = dist.get_rank(), os.environ["TORCHELASTIC_RESTART_COUNT"]
    torch.manual_seed(0)
    layers = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    model = torch.nn.parallel.DistributedDataParallel(layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 256)
    slowed = rank == slow and attempt == "0"
    if slowed and how.startswith("cgroup:"):
        with open(os.path.join(how.split(":", 1)[1], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        time.sleep(0.05 if slowed and how == "sleep" else 0.01)
        opt.zero_grad()
        model(data).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - started)
    if rank == 0:
        with open(os.path.join(out, f"steps-{attempt}.txt"), "w") as f:
            f.write("\n".join(f"{t:.6f}" for t in times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
