"""Worker bootstrap from torchrun's environment contract: env -> process group -> device -> seeds."""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass
from typing import Any, Dict

import torch
import torch.distributed as dist

from launcher.runtime.env import ATTEMPT


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int
    restart_count: int  # torch's: restarts after a failure
    attempt: int  # the launcher's: every start of the workers, an elastic membership change's too (names records)

    @classmethod
    def from_environ(cls) -> "DistEnv":
        env = os.environ
        return cls(
            rank=int(env.get("RANK", "0")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
            group_rank=int(env.get("GROUP_RANK", "0")),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            attempt=int(env.get(ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or 0),  # torchrun: its restarts
        )


def pick_device(env: DistEnv) -> torch.device:
    """One CUDA device per local rank when there are enough of them, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= env.local_world_size:
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def process_group_timeout(watchdog_timeout_s: float, default_s: float = 300.0) -> float:
    """Collective timeout, well past the watchdog's, so a hang is explained by the watchdog's stack
    dump rather than cut short by a bare gloo/NCCL timeout error."""
    return max(default_s, 2 * watchdog_timeout_s + 60) if watchdog_timeout_s > 0 else default_s


def init_process_group(env: DistEnv, device: torch.device, timeout_s: float = 300.0) -> str:
    """NCCL when every worker has its own CUDA device, gloo otherwise."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        kwargs: Dict[str, Any] = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return backend


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:
        pass


def set_threads() -> None:
    """Honour OMP_NUM_THREADS even when torch was imported before it was set (forked workers)."""
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
