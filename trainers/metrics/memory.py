"""Per-rank memory: figures for metrics and the summary, a clear CUDA out-of-memory message, and
``data.batch_size=auto`` (the largest per-worker batch that fits, found before training starts).

What auto measures: on CUDA, the allocator's real peak during a trial forward and backward (an
out-of-memory error counts as "does not fit"), plus the optimizer state the trial has not yet
allocated. On CPU, where running out of memory means swapping or the OOM killer rather than a
catchable error, it uses an estimate: parameters + gradients + AdamW state + the bytes autograd
saves for backward in a trial forward. It leaves out allocator overhead and temporaries, so it
is a lower bound of the true peak; ``data.max_memory_gb`` caps that estimate.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist
from torch import nn

from launcher.runtime import torch_private
from .footprint import this_process

GIB = 1024**3
ADAMW_STATE_PER_PARAM = 2  # exp_avg and exp_avg_sq, each the size of the parameter


class OutOfMemory(RuntimeError):
    """A rank ran out of device memory; the message says where and what to change."""


def memory_stats(device: torch.device) -> Dict[str, int]:
    """This process's memory now: RSS everywhere, and the CUDA allocator's figures on a GPU."""
    stats = {"rss_bytes": int(this_process().memory_info().rss)}
    if device.type == "cuda":
        stats.update({
            "cuda_allocated_bytes": int(torch.cuda.memory_allocated(device)),
            "cuda_reserved_bytes": int(torch.cuda.memory_reserved(device)),
            "cuda_peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
        })
    return stats


def oom_message(rank: int, device: torch.device, step: Optional[int], cfg: Any) -> str:
    """One line: the rank, its memory when it failed, and the switches that lower memory."""
    when = f"at step {step}" if step is not None else "before training (model or batch_size=auto)"
    where = f"rank {rank} ran out of {device.type.upper()} memory on {device} {when}"
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        held = (f"{torch.cuda.memory_allocated(device) / GIB:.2f} GiB allocated, "
                f"{torch.cuda.memory_reserved(device) / GIB:.2f} GiB reserved, {free / GIB:.2f} of {total / GIB:.2f} GiB free")
    else:
        held = f"RSS {memory_stats(device)['rss_bytes'] / GIB:.2f} GiB"
    return (f"{where} ({held}): lower data.batch_size (now {cfg.data.batch_size}) and raise trainer.grad_accum_steps "
            f"to keep the same batch, or set trainer.activation_checkpointing=true, trainer.precision=bf16, "
            f"or trainer.strategy=fsdp")


@contextlib.contextmanager
def saved_activation_bytes(counter: List[int], param_storages: set) -> Iterator[None]:
    """Count the bytes autograd saves for backward inside the block (parameters and views of them excluded)."""
    def pack(t: torch.Tensor) -> torch.Tensor:
        local = torch_private.dtensor_shard(t)
        if not isinstance(t, nn.Parameter) and local.untyped_storage().data_ptr() not in param_storages:
            counter[0] += local.numel() * local.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def local_state_bytes(model: nn.Module) -> int:
    """Parameters + gradients + AdamW state this rank will hold (local shards only)."""
    params = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        params += local.numel() * local.element_size()
    return params * (2 + ADAMW_STATE_PER_PARAM)


def default_cap_bytes(device: torch.device, local_workers: int) -> int:
    """No cap given: 90% of the GPU, or on CPU an equal share of half the free RAM per local worker."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1] * 0.9)
    import psutil

    return int(psutil.virtual_memory().available * 0.5 / max(1, local_workers))


def find_batch_size(trial: Callable[[int], float], cap_bytes: int, largest: int) -> Dict[str, Any]:
    """The largest batch in [1, largest] whose trial fits under cap_bytes: double, then bisect.

    ``trial(b)`` returns the bytes a step of b samples needs (inf when it ran out of memory); it
    must return the same on every rank (see ``agreed``) so ranks take the same path.
    """
    tried: Dict[int, float] = {}

    def fits(b: int) -> bool:
        tried[b] = trial(b)
        return tried[b] <= cap_bytes

    if not fits(1):
        return {"batch_size": 0, "tried": tried, "cap_bytes": cap_bytes}
    low, high = 1, None
    while high is None and low < largest:
        candidate = min(low * 2, largest)
        if fits(candidate):
            low = candidate
        else:
            high = candidate
    while high is not None and high - low > max(1, low // 16):  # within 1/16 is close enough
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return {"batch_size": low, "tried": tried, "cap_bytes": cap_bytes}


def agreed(value: float, device: torch.device) -> float:
    """The largest value over all ranks, so every rank makes the same fit/no-fit decision."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([min(value, 1e30)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())
