"""Built-in models, chosen by ``model.name``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    """A plain ReLU MLP; the default (4 x 512 hidden) has about 0.9M parameters."""

    def __init__(self, in_dim: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * depth
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(dims[:-1], dims[1:])
        )
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model(model_cfg: Any) -> nn.Module:
    if model_cfg.name == "mlp":
        return MLP(model_cfg.in_dim, model_cfg.hidden, model_cfg.depth, model_cfg.classes)
    raise ValueError(f"unknown model {model_cfg.name}")


def param_checksum(model: nn.Module) -> float:
    """A float summary of every parameter; equal on replicas that hold identical weights."""
    total = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(model.parameters()):
        t = p.detach().to("cpu", torch.float64)
        total += t.sum() + (i + 1) * t.square().sum()
    return float(total)
