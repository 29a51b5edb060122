"""DDP's gradient all-reduce with our communication timing on (trainers.metrics.steps.CommTimer, read every
step as the trainer does) against the same all-reduce without it, alternating, in the same processes;
a raw dist.all_reduce of the same bytes is reported beside them.

Run under the launcher: python -m launcher --gpus 2 bench/allreduce_job.py OUT.json REPEATS
"""

import json
import os
import statistics
import sys
import time
from typing import Callable, Dict

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launcher.trainers.parallel.dist import DistEnv, init_process_group  # noqa: E402
from launcher.trainers.metrics.steps import attach_comm_timer  # noqa: E402

SIZES_MB = (1, 16)


class Flat(torch.nn.Module):
    """One parameter of the given size and a loss whose backward is a fill: the step is the all-reduce."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(numel))

    def forward(self) -> torch.Tensor:
        return self.weight.sum()


def make_variants(numel: int, mb: int, world_size: int) -> Dict[str, Callable[[], object]]:
    """One step of each variant on its own fresh model: ours (timed), plain DDP, a raw all-reduce of the bytes."""
    timed, plain = DDP(Flat(numel), bucket_cap_mb=mb + 1), DDP(Flat(numel), bucket_cap_mb=mb + 1)
    timer = attach_comm_timer(timed, world_size)
    tensor = torch.ones(numel)

    def ours() -> None:
        timed().backward()
        timer.take()

    return {"ours": ours, "ddp": lambda: plain().backward(), "raw": lambda: dist.all_reduce(tensor)}


def main() -> None:
    out, repeats = sys.argv[1], int(sys.argv[2])
    env = DistEnv.from_environ()
    init_process_group(env, torch.device("cpu"))
    rows = {}
    for mb in SIZES_MB:
        numel = mb * 1024 * 1024 // 4
        variants = make_variants(numel, mb, env.world_size)
        times = {name: [] for name in variants}
        names = list(variants)
        for i in range(repeats + 2):
            for name in names[i % 3:] + names[:i % 3]:  # rotate which goes first
                dist.barrier()
                t0 = time.perf_counter()
                variants[name]()
                if i >= 2:  # the first rounds connect, build buckets and warm the buffers
                    times[name].append(time.perf_counter() - t0)
        rows[f"{mb}MB"] = {f"{name}_gbps": mb / 1024 / statistics.median(values) for name, values in times.items()}
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": env.world_size, "sizes": rows}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
