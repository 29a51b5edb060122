"""Deterministic built-in datasets that a model can learn, and their distributed loaders."""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def teacher_dataset(size: int, in_dim: int, classes: int, seed: int) -> TensorDataset:
    """Gaussian inputs labelled by a fixed random two-layer teacher: learnable, and the same everywhere."""
    g = torch.Generator().manual_seed(seed + 12345)
    x = torch.randn(size, in_dim, generator=g)
    w1 = torch.randn(in_dim, 64, generator=g) / in_dim**0.5
    w2 = torch.randn(64, classes, generator=g) / 8.0
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return TensorDataset(x, y)


def build_dataset(cfg: Any) -> TensorDataset:
    return teacher_dataset(cfg.data.dataset_size, cfg.model.in_dim, cfg.model.classes, cfg.seed)


def build_loader(dataset: TensorDataset, batch_size: int, rank: int, world: int, seed: int) -> Tuple[DataLoader, DistributedSampler]:
    """Each rank reads a disjoint shard; drop_last keeps every rank at the same step count."""
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    return loader, sampler
