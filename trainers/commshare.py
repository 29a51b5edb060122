"""The share of a step spent waiting for communication, where it can be measured honestly.

For DDP: time forward+backward with and without the gradient all-reduce (``no_sync``), paired
and alternated so load from other processes hits both alike. The difference is the exposed
(not overlapped) communication. Other strategies interleave communication with compute in ways
this cannot separate; they report None ("not measured") rather than a guess.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainers.models import loss_fn

METHOD = "ddp: 1 - (forward+backward time without gradient all-reduce) / (with it), medians of alternated repeats"


def measure_comm_share(model: nn.Module, x: torch.Tensor, y: torch.Tensor, repeats: int = 6) -> Optional[float]:
    """Run on every rank after training (collective); leaves parameters untouched and gradients cleared."""
    if not isinstance(model, DistributedDataParallel) or dist.get_world_size() < 2:
        return None
    timings: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * repeats):
        sync = i % 2 == 0
        start = time.perf_counter()
        with nullcontext() if sync else model.no_sync():
            loss_fn(model(x), y).backward()
        timings[sync].append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    with_comm, without = statistics.median(timings[True]), statistics.median(timings[False])
    return max(0.0, (with_comm - without) / with_comm) if with_comm > 0 else None
