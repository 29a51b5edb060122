"""gloo all-reduce through our code path (the launcher's bootstrap and the DDP comm hook's
CommTimer.all_reduce_mean) against a raw dist.all_reduce, alternating, in the same processes.

Run under the launcher: python -m launcher --gpus 2 bench/allreduce_job.py OUT.json REPEATS
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from trainers.dist import DistEnv, init_process_group  # noqa: E402
from trainers.metrics import CommTimer  # noqa: E402

SIZES_MB = (1, 16)


def main() -> None:
    out, repeats = sys.argv[1], int(sys.argv[2])
    env = DistEnv.from_environ()
    init_process_group(env, torch.device("cpu"))
    timer = CommTimer(env.world_size)
    rows = {}
    for mb in SIZES_MB:
        tensor = torch.ones(mb * 1024 * 1024 // 4)
        ours, raw = [], []
        for i in range(repeats + 2):
            first, second = (ours, raw) if i % 2 else (raw, ours)  # alternate which goes first
            for times in (first, second):
                t0 = time.perf_counter()
                if times is ours:
                    timer.all_reduce_mean(tensor).wait()
                else:
                    dist.all_reduce(tensor)
                if i >= 2:  # the first rounds connect and warm the buffers
                    times.append(time.perf_counter() - t0)
        rows[f"{mb}MB"] = {"ours_gbps": mb / 1024 / statistics.median(ours), "raw_gbps": mb / 1024 / statistics.median(raw)}
    if env.rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": env.world_size, "sizes": rows}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
