"""Functions that tests/test_python_api.py hands to launcher.launch/submit from this imported module: they travel
by name, and a rank imports this module to unpickle them (the caller's sys.path goes with the call)."""

from __future__ import annotations

import os
import time
from typing import Dict

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID")


def environment(tag: str) -> Dict[str, str]:
    """The rank's torchrun environment, and a line in its log."""
    print(f"rank {os.environ['RANK']} says {tag}", flush=True)
    return {"tag": tag, **{name: os.environ.get(name, "") for name in CONTRACT}}


def fail_on_rank(bad: int) -> str:
    """The bad rank raises at once; the others wait (the launcher stops them when the bad rank fails)."""
    if int(os.environ["RANK"]) == bad:
        raise ValueError(f"rank {bad} broke on purpose")
    time.sleep(120)
    return "not reached"


def sleep_then_return(seconds: float) -> int:
    print(f"rank {os.environ['RANK']} sleeping", flush=True)
    time.sleep(seconds)
    return int(os.environ["RANK"])


def train_steps(steps: int) -> int:
    """A few optimizer steps under DDP (the launcher's step records, its W&B run's rows); the rank."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        loss = model(torch.full((2, 4), float(step))).pow(2).mean()
        optimizer.zero_grad(); loss.backward(); optimizer.step()  # noqa: E702
    dist.destroy_process_group()
    return int(os.environ["RANK"])
