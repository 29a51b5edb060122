"""Model transforms applied before a strategy wraps the model: activation checkpointing, torch.compile.

Both replace each block's ``forward`` on the instance instead of wrapping the block in another
module, so parameter names stay ``blocks.N...``: tensor parallel plans, FSDP's per-block
sharding and checkpoints keep working unchanged. Order matters and follows torchtitan:
checkpointing, then compile, then the strategy (DDP(compiled) works; torch.compile(DDP(m))
silently stays uncompiled, measured on torch 2.13).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils.checkpoint import checkpoint

from .models import Layered


def apply_activation_checkpointing(model: Layered) -> int:
    """Each block keeps only its input for backward and recomputes the rest; returns blocks changed."""
    blocks = model.blocks
    for block in blocks:
        block.forward = functools.partial(_checkpointed, block.forward)
    return len(blocks)


def _checkpointed(forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # non-reentrant: works with autocast, keyword arguments and FSDP2's hooks, and is torch's advice
    return checkpoint(forward, *args, use_reentrant=False, **kwargs)


def apply_compile(model: Layered) -> int:
    """Compile each block's forward (the blocks share one graph: same code, parameters as inputs)."""
    blocks = model.blocks
    for block in blocks:
        block.forward = torch.compile(block.forward)
    return len(blocks)


def prepare_model(model: Layered, trainer_cfg: Any) -> Layered:
    """The transforms the config asks for, in the order that works; the strategy wraps the result."""
    if trainer_cfg.activation_checkpointing:
        apply_activation_checkpointing(model)
    if trainer_cfg.compile:
        apply_compile(model)
    return model
