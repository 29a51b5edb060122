"""One optimizer step: micro-batches with gradient accumulation, mixed precision, clipping.

Only the last micro-batch synchronises gradients (DDP's no_sync, FSDP2's
set_requires_gradient_sync): the others accumulate locally, so accumulation costs no extra
communication. Each micro-batch's loss is divided by the number of micro-batches, so
``k`` micro-batches of ``b`` give the same gradient as one batch of ``k x b``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from launcher.runtime import torch_private
from .models import loss_fn
from .precision import Precision

Batch = Tuple[torch.Tensor, torch.Tensor]


@dataclass
class StepResult:
    loss: torch.Tensor  # mean loss over the micro-batches (detached)
    grad_norm: Optional[torch.Tensor]  # global gradient norm before clipping (0-d, on the device); None when not clipping
    data_wait_s: float  # time spent waiting for batches and copying them to the device
    output_dtype: Optional[torch.dtype]  # dtype of the model's output (bf16/fp16 under autocast)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter inside this block when not enabled."""
    if enabled:
        yield
    elif isinstance(model, DistributedDataParallel):
        with model.no_sync():
            yield
    elif hasattr(model, "set_requires_gradient_sync"):  # FSDP2's fully_shard
        set_sync = getattr(model, "set_requires_gradient_sync")  # noqa: B009 (model.X types as Tensor | Module: nn.Module's __getattr__)
        set_sync(False)
        try:
            yield
        finally:
            set_sync(True)
    else:  # dp, naive_mp, tensor: no gradient collective to skip
        yield


def settle_gradient_buckets(model: nn.Module, batch: Batch, device: torch.device, precision: Precision) -> bool:
    """Give DDP the gradient buckets of its steady state before the first step of this attempt.

    DDP reduces the first step's gradients in one bucket laid out in parameter order, then
    rebuilds its buckets in the order gradients became ready. Where a value sits in a bucket
    decides the order in which gloo's and NCCL's rings add the ranks' values, and with three or
    more ranks that order changes the float result: a job resumed at step k reduced step k in the
    first-step layout while the uninterrupted job used the rebuilt one, so resumed runs drifted
    (1e-8 at once, chaotically after). One forward and backward on this attempt's first batch, in
    eval mode, with the RNG state kept and the gradients dropped, records the ready order; every
    real step, the first included, then reduces in the rebuilt layout, so a resumed run is bitwise
    the uninterrupted one at any world size. Other strategies have no buckets to settle. True when
    it ran that extra iteration.
    """
    if not isinstance(model, DistributedDataParallel) or torch_private.ddp_buckets_rebuilt(model):
        return False
    if getattr(model, "_launcher_settled", False):  # a DDP that never rebuilds (find_unused_parameters): once
        return False
    model._launcher_settled = True  # type: ignore[assignment]  # any value goes: torch types only Tensor | Module
    was_training = model.training
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        model.eval()
        try:
            x, y = batch
            with precision.autocast():
                loss = loss_fn(model(x.to(device)), y.to(device))
            loss.float().backward()
        finally:
            model.train(was_training)
    model.zero_grad(set_to_none=True)
    return True


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer, micro_batches: List[Tuple[Batch, float]],
                   device: torch.device, precision: Precision, max_grad_norm: float, meter: Any = None) -> StepResult:
    """``micro_batches``: (batch, seconds waited for it) pairs from trainers.data.grouped_batches.

    meter (trainers.metrics.steps.StepMeter) times forward, backward and optimizer; a pipeline's
    schedule interleaves forward and backward, so its whole step counts as backward.
    """
    phase = meter.phase if meter is not None else (lambda name: None)
    optimizer.zero_grad(set_to_none=True)
    losses: List[torch.Tensor] = []
    wait, out_dtype, count = 0.0, None, len(micro_batches)
    for micro, ((x, y), waited) in enumerate(micro_batches):
        t0 = time.perf_counter()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # async from pinned memory
        wait += waited + time.perf_counter() - t0
        with gradient_sync(model, micro == count - 1):
            if hasattr(model, "train_step"):  # pipeline: its schedule runs forward and backward
                with precision.autocast():
                    losses.append(getattr(model, "train_step")(x, y))  # noqa: B009 (as above: an FSDP or pipeline method)
                phase("backward")
                continue
            with precision.autocast():
                out = model(x)
                loss = loss_fn(out, y)
            out_dtype = out.dtype
            phase("forward")
            precision.backward(loss / count)
            phase("backward")
            losses.append(loss.detach())
    precision.unscale(optimizer)
    norm = clip_grad_norm(model, max_grad_norm) if max_grad_norm > 0 else None  # else read at log steps only
    precision.step(optimizer)
    phase("optimizer")
    return StepResult(torch.stack(losses).mean(), norm, wait, out_dtype)


def grad_norm(model: nn.Module) -> torch.Tensor:
    """The global L2 norm of all gradients, as a 0-d float32 tensor on their device.

    Sharded gradients (DTensors under FSDP and tensor parallel) contribute their full norm
    (a collective), replicated ones count once, and pipeline stages add theirs across the
    pipeline, so every strategy reports the norm a single process would. With sharded or
    pipelined models it is a collective: call it on every rank at the same step.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    squares = []
    for g in grads:
        if hasattr(g, "full_tensor"):  # DTensor: its norm needs the other shards (a collective)
            squares.append(torch.linalg.vector_norm(g, dtype=torch.float32).full_tensor().detach() ** 2)
        else:  # a dot product: on CPU 10x faster than vector_norm when squares underflow to denormals
            flat = g.detach().reshape(-1).float()
            squares.append(torch.dot(flat, flat))
    device = grads[0].device if grads else torch.device("cpu")
    total_sq = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
    pp_group = getattr(model, "pp_group", None)
    if pp_group is not None and getattr(model, "stages", 1) > 1:
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Scale all gradients so that their global norm is at most max_norm; returns the norm before.

    The factor is clamped on the device, as torch's clip_grad_norm_ does: no host sync per step.
    """
    norm = grad_norm(model)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    host_coef = float(coef) if any(hasattr(g, "full_tensor") for g in grads) else None  # DTensors take a number
    for g in grads:
        g.mul_(host_coef if host_coef is not None and hasattr(g, "full_tensor") else coef)
    return norm
