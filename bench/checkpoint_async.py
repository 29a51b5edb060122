"""What an async checkpoint saves the training loop, against synchronous saves, in one process.

    python bench/checkpoint_async.py [ROUNDS] [STEPS]

The default model (MLP 256-512x4-10, AdamW, batch 32) trains on one gloo rank, one intra-op thread. Two figures, each as a
ratio to the synchronous baseline measured in the same script:
  blocking: how long the loop waits for one save (median of ROUNDS saves each, alternating);
  throughput cost of checkpoint.every_steps=50: STEPS steps with no checkpoints, sync saves and async
  saves, in rotating order each round; cost = 1 - samples/s / samples/s without checkpoints (median).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launcher.trainers.checkpoint.checkpointer import Checkpointer  # noqa: E402
from launcher.trainers.models import MLP  # noqa: E402

BATCH, EVERY = 32, 50


def checkpointer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, where: str, every: int,
                 async_save: bool) -> Checkpointer:
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir=where, every_steps=every, every_seconds=0, keep=2,
                                                     async_save=async_save))
    return Checkpointer(cfg, None, 0, 1, torch.device("cpu"), model, optimizer)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ckpt: Checkpointer, steps: int) -> float:
    """samples/s over `steps` steps, saves included (the last one waited for)."""
    x, y = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))
    started = time.perf_counter()
    for step in range(1, steps + 1):
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        ckpt.after_step(step, 0, step, lambda: 0.0, last=False)
    ckpt.finish()
    return steps * BATCH / (time.perf_counter() - started)


def blocking(model: torch.nn.Module, optimizer: torch.optim.Optimizer, root: str, rounds: int) -> Dict[str, float]:
    """Median seconds the loop waits for one save, sync and async (each async write finishes untimed)."""
    times: Dict[str, List[float]] = {"sync": [], "async": []}
    savers = {kind: checkpointer(model, optimizer, os.path.join(root, f"block-{kind}"), 1, kind == "async")
              for kind in times}
    for step in range(1, rounds + 1):
        for kind, saver in savers.items():
            t0 = time.perf_counter()
            saver.after_step(step, 0, step, lambda: 0.0, last=False)
            times[kind].append(time.perf_counter() - t0)
            saver.finish()
    return {kind: statistics.median(v) for kind, v in times.items()}


def main(rounds: int, steps: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as each worker runs under the launcher with 2+ workers (OMP_NUM_THREADS=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    model = MLP(256, 512, 4, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    root = tempfile.mkdtemp(prefix="bench-ckpt-")
    try:
        block = blocking(model, optimizer, root, rounds)
        print(f"blocking per save: sync {block['sync'] * 1000:.1f} ms, async {block['async'] * 1000:.1f} ms; "
              f"async/sync = {block['async'] / block['sync']:.3f}", flush=True)
        variants = {"none": (0, False), "sync": (EVERY, False), "async": (EVERY, True)}
        speed: Dict[str, List[float]] = {name: [] for name in variants}
        train(model, optimizer, checkpointer(model, optimizer, os.path.join(root, "warm"), 0, False), 20)
        for r in range(rounds):
            names = list(variants)
            for name in names[r % 3:] + names[:r % 3]:
                every, is_async = variants[name]
                where = os.path.join(root, f"run-{name}-{r}")
                speed[name].append(train(model, optimizer, checkpointer(model, optimizer, where, every, is_async), steps))
                shutil.rmtree(where, ignore_errors=True)
        base = statistics.median(speed["none"])
        for name in ("sync", "async"):
            cost = 1 - statistics.median(speed[name]) / base
            print(f"checkpoint.every_steps={EVERY} {name}: {statistics.median(speed[name]):.0f} samples/s "
                  f"vs {base:.0f} without checkpoints: throughput cost {cost:.1%}", flush=True)
        sync_cost = 1 - statistics.median(speed["sync"]) / base
        async_cost = 1 - statistics.median(speed["async"]) / base
        print(f"async cost / sync cost = {async_cost / sync_cost:.2f}" if sync_cost > 0 else "sync cost not measurable")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5, int(sys.argv[2]) if len(sys.argv) > 2 else 300)
