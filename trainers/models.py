"""Built-in models, chosen by ``model.name``: mlp, gpt (a small transformer LM) and cnn.

Every model is ``head(blocks(stem(x)))`` with ``blocks`` an ``nn.ModuleList`` of equal layers, so
the strategies can shard (FSDP), split (pipeline, naive model parallel) or slice (tensor
parallel) the same model without knowing which one it is.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class Layered(nn.Module):
    """The shape every built-in model has, as the strategies and transforms see it (declared for the type checker:
    nn.Module's attribute lookup types a submodule as Tensor | Module)."""

    stem: nn.Module
    blocks: nn.ModuleList
    head: nn.Module


class MLP(Layered):
    """A plain ReLU MLP; the default (4 x 512 hidden) has about 0.9M parameters."""

    def __init__(self, in_dim: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        dims = [in_dim] + [hidden] * depth
        self.stem = nn.Identity()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(dims[:-1], dims[1:])
        )
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(self, x)


class TokenEmbedding(nn.Module):
    """Token embedding plus a learnable position embedding (GPT-2 style)."""

    def __init__(self, vocab: int, dim: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(seq_len, dim) * 0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx) + self.pos[: idx.size(1)]


class SelfAttention(nn.Module):
    """Causal multi-head attention with separate q/k/v projections, so tensor parallel can split heads.

    The head count comes from the tensor width at run time: under tensor parallel each rank holds
    heads / tp of them and the same code runs unchanged.
    """

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, heads)
        self.ln2, self.mlp = nn.LayerNorm(dim), FeedForward(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(Layered):
    """A small GPT-style language model: embeddings, pre-norm blocks, a final norm and an LM head."""

    def __init__(self, vocab: int, dim: int, depth: int, heads: int, seq_len: int) -> None:
        super().__init__()
        self.stem = TokenEmbedding(vocab, dim, seq_len)
        self.blocks = nn.ModuleList(TransformerBlock(dim, heads) for _ in range(depth))
        self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, vocab))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return run_layers(self, idx)


class ConvHead(nn.Module):
    """Global average pool, then a two-layer classifier (the part tensor parallel can split)."""

    def __init__(self, channels: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(channels, hidden), nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.mean(dim=(2, 3)))))


class CNN(Layered):
    """A small all-convolutional image classifier for the synthetic image dataset."""

    def __init__(self, channels: int, depth: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU()) for _ in range(depth)
        )
        self.head = ConvHead(channels, hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(self, x)


def run_layers(model: Layered, x: torch.Tensor) -> torch.Tensor:
    x = model.stem(x)
    for block in model.blocks:
        x = block(x)
    return model.head(x)


def build_model(model_cfg: Any) -> Layered:
    m = model_cfg
    if m.name == "mlp":
        return MLP(m.in_dim, m.hidden, m.depth, m.classes)
    if m.name == "gpt":
        return GPT(m.vocab, m.hidden, m.depth, m.heads, m.seq_len)
    if m.name == "cnn":
        return CNN(m.channels, m.depth, m.hidden, m.classes)
    raise ValueError(f"unknown model {m.name}")


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every prediction: samples (mlp, cnn) or tokens (gpt)."""
    return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1).to(output.device))


def param_checksum(model: nn.Module) -> float:
    """A float summary of every parameter; equal on replicas that hold identical weights.

    Sharded parameters (DTensors under FSDP and tensor parallel) count as the full tensor, so
    every rank of a sharded model reports the whole model's checksum (a collective: call it on
    every rank).
    """
    total = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(model.parameters()):
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        t = t.to("cpu", torch.float64)
        total += t.sum() + (i + 1) * t.square().sum()
    return float(total)
