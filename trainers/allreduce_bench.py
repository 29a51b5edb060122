"""All-reduce bandwidth across the job's ranks, in the style of nccl-tests' all_reduce_perf.

A torchrun-style program (``doctor --comm`` launches it through the launcher; it also runs under
plain torchrun): every rank all-reduces float32 buffers from --min-bytes to --max-bytes, growing by
--factor; rank 0 writes one record per size to --out (JSON) with the mean time per call,
algbw = bytes / time and busbw = algbw * 2(n-1)/n, the bandwidth each link must carry in a ring.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from launcher.runtime.beats import TIMEOUT_ENV, heartbeat
from .parallel.dist import DistEnv, init_process_group, pick_device, process_group_timeout, set_threads

WARMUP = 5  # untimed calls per size: connection setup and allocator warm-up


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> List[int]:
    sizes, size = [], max(4, min_bytes)
    while size <= max_bytes:
        sizes.append(size)
        size *= factor
    return sizes


def iterations(size: int, budget_bytes: int = 1 << 30, most: int = 50, least: int = 5) -> int:
    """Many calls for small messages (noise), few for large ones (time): about budget_bytes per size."""
    return max(least, min(most, budget_bytes // max(size, 1)))


def bus_factor(world: int) -> float:
    """nccl-tests' all-reduce correction: a ring moves 2(n-1)/n of the buffer through every link."""
    return 2 * (world - 1) / world if world > 1 else 0.0


def measure(size: int, device: torch.device, world: int) -> Dict[str, Any]:
    count = size // 4
    buf = torch.ones(count, dtype=torch.float32, device=device)
    for _ in range(WARMUP):
        dist.all_reduce(buf)
    iters = iterations(size)
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    _sync(device)
    elapsed = (time.perf_counter() - start) / iters
    heartbeat()  # a collective stuck on a bad link is caught and explained by the launcher's watchdog
    algbw = count * 4 / elapsed / 1e9
    return {"bytes": count * 4, "count": count, "iters": iters, "time_us": elapsed * 1e6,
            "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(world)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--out", required=True, help="JSON file rank 0 writes the results to")
    args = p.parse_args(argv)
    env = DistEnv.from_environ()
    set_threads()
    device = pick_device(env)
    backend = init_process_group(env, device, process_group_timeout(float(os.environ.get(TIMEOUT_ENV, "0"))))
    heartbeat()
    try:
        rows = [measure(size, device, env.world_size) for size in message_sizes(args.min_bytes, args.max_bytes, args.factor)]
    finally:
        dist.destroy_process_group()
    if env.rank == 0:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"world_size": env.world_size, "backend": backend, "device": device.type, "rows": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
