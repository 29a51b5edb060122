"""``data.batch_size=auto``: try trial steps of growing size on the wrapped model before training.

See trainers/metrics/memory.py for what is measured on CUDA (the real peak) and on CPU (an estimate).
"""

from __future__ import annotations

import math
from typing import Any, Dict

import torch
from torch import nn

from .metrics.memory import GIB, agreed, default_cap_bytes, find_batch_size, local_state_bytes, saved_activation_bytes
from .models import loss_fn
from .parallel.strategies import data_layout
from .precision import Precision


def resolve_auto_batch(model: nn.Module, dataset: Any, cfg: Any, env: Any, device: torch.device,
                       precision: Precision) -> Dict[str, Any]:
    """Set cfg.data.batch_size to the largest per-worker batch that fits; returns what was tried."""
    def per_process(b: int) -> Any:
        cfg.data.batch_size = b
        return data_layout(cfg, env.rank, env.world_size, device)

    one = per_process(1)
    # an optimizer step must fit in one epoch of this rank's shard: grad_accum_steps batches of it
    largest = max(1, (len(dataset) // one.shard_count) // one.batch_size // cfg.trainer.grad_accum_steps)
    cap = int(cfg.data.max_memory_gb * GIB) if cfg.data.max_memory_gb > 0 else default_cap_bytes(device, env.local_world_size)
    x_all, y_all = dataset.tensors

    def trial(b: int) -> float:
        n = per_process(b).batch_size
        need = measure_step(model, x_all[:n].to(device), y_all[:n].to(device), precision, device)
        return agreed(need, device)

    found = find_batch_size(trial, cap, largest)
    if found["batch_size"] < 1:
        raise MemoryError(f"data.batch_size=auto: not even a batch of 1 fits in {cap / 2**20:.1f} MiB "
                          f"(it needs {found['tried'][1] / 2**20:.1f} MiB): raise data.max_memory_gb, "
                          "or set trainer.activation_checkpointing=true or trainer.strategy=fsdp")
    cfg.data.batch_size = found["batch_size"]
    if env.rank == 0:
        sizes = ", ".join(f"{b}: {v / 2**20:.1f} MiB" if math.isfinite(v) else f"{b}: out of memory"
                          for b, v in sorted(found["tried"].items()))
        print(f"data.batch_size=auto chose {found['batch_size']} per worker under {cap / 2**20:.1f} MiB "
              f"({'measured peak' if device.type == 'cuda' else 'estimate'}; tried {sizes})", flush=True)
    return {"auto_batch_size": found["batch_size"], "auto_batch_cap_bytes": cap,
            "auto_batch_tried": {str(b): v if math.isfinite(v) else None for b, v in sorted(found["tried"].items())}}


def measure_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: Precision, device: torch.device) -> float:
    """Bytes one training step of this batch needs on this rank (inf when it ran out of CUDA memory)."""
    optimizer_state = local_state_bytes(model) // 2  # AdamW state: allocated at the first real step
    try:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # a fresh peak for each trial, not the previous trial's cache
            torch.cuda.reset_peak_memory_stats(device)
            _forward_backward(model, x, y, precision)
            torch.cuda.synchronize(device)
            return float(torch.cuda.max_memory_allocated(device) + optimizer_state)
        counter = [0]
        with saved_activation_bytes(counter, _param_storages(model)):
            out = _forward(model, x, y, precision)
        precision.backward(out)
        return float(local_state_bytes(model) + counter[0])
    except torch.OutOfMemoryError:
        return math.inf
    finally:
        model.zero_grad(set_to_none=True)


def _forward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: Precision) -> torch.Tensor:
    with precision.autocast():
        return loss_fn(model(x), y)


def _forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: Precision) -> None:
    precision.backward(_forward(model, x, y, precision))


def _param_storages(model: nn.Module) -> set:
    return {(p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr() for p in model.parameters()}


def activation_bytes(model: nn.Module, dataset: Any, batch: int, device: torch.device, precision: Precision) -> Any:
    """Bytes autograd keeps for backward in one forward of ``batch`` samples (the figure activation
    checkpointing shrinks); None for the pipeline, whose schedule runs the forward itself."""
    if hasattr(model, "train_step"):
        return None
    x, y = (t[:batch].to(device) for t in dataset.tensors)
    counter = [0]
    try:
        with saved_activation_bytes(counter, _param_storages(model)):
            loss = _forward(model, x, y, precision)
        precision.backward(loss)  # complete the step so DDP and FSDP are left in a clean state
    finally:
        model.zero_grad(set_to_none=True)
    return counter[0]
