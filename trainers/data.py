"""Deterministic built-in datasets that a model can learn, and their distributed loaders."""

from __future__ import annotations

import time
from typing import Any, Iterable, Iterator, List, Sized, Tuple

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


def text_dataset(size: int, vocab: int, seq_len: int, seed: int) -> TensorDataset:
    """A synthetic corpus from a fixed sparse bigram language (each token has 4 likely successors).

    Its entropy is known and low (about log 4 nats per token), so a language model's loss visibly
    falls from log(vocab) towards it. Samples are consecutive windows: inputs and next-token targets.
    """
    g = torch.Generator().manual_seed(seed + 23456)
    successors = torch.randint(0, vocab, (vocab, 4), generator=g).tolist()
    choices = torch.randint(0, 4, (size * seq_len + 1,), generator=g).tolist()
    walk = [0]
    for c in choices[1:]:  # plain Python: about 0.1 s for 8k windows of 32
        walk.append(successors[walk[-1]][c])
    tokens = torch.tensor(walk, dtype=torch.long)
    x = tokens[:-1].view(size, seq_len)
    y = tokens[1:].view(size, seq_len)
    return TensorDataset(x, y)


def image_dataset(size: int, image_size: int, classes: int, seed: int) -> TensorDataset:
    """Noisy 3-channel images, each class a fixed random pattern: a CNN learns it in a few steps."""
    g = torch.Generator().manual_seed(seed + 34567)
    patterns = torch.randn(classes, 3, image_size, image_size, generator=g)
    y = torch.randint(0, classes, (size,), generator=g)
    x = patterns[y] + 1.5 * torch.randn(size, 3, image_size, image_size, generator=g)
    return TensorDataset(x, y)


def build_dataset(cfg: Any) -> TensorDataset:
    m = cfg.model
    if m.name == "gpt":
        return text_dataset(cfg.data.dataset_size, m.vocab, m.seq_len, cfg.seed)
    if m.name == "cnn":
        return image_dataset(cfg.data.dataset_size, m.image_size, m.classes, cfg.seed)
    return teacher_dataset(cfg.data.dataset_size, m.in_dim, m.classes, cfg.seed)


class ResumableSampler(DistributedSampler):
    """DistributedSampler (shuffled, drop_last) whose epoch can start at a global sample offset.

    An epoch is one permutation of the dataset, seeded by seed + epoch; rank r of W reads every W-th index of
    it from position r, so after k batches of B per rank the ranks together consumed its first k*B*W
    indices. ``set_epoch(epoch, start)`` deals out what follows ``start`` among this sampler's ranks: a job
    resumed with another world size (elastic membership) reads the rest of the epoch, none dropped or repeated.
    Each rank gets whole batches of ``batch_size`` (the loader's drop_last, kept here), except where the epoch
    resumed at an offset that is not a whole number of this world's global batches (another world size
    stopped there): then the epoch ends with one smaller batch on every rank, rather than leave its tail unread.
    With start=0 the indices are DistributedSampler's own, and for the same world size they stay so at any start.
    """

    def __init__(self, dataset: Sized, num_replicas: int, rank: int, seed: int, batch_size: int = 1) -> None:
        # torch types it a Dataset, which declares no __len__; what the sampler needs is its len()
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True)  # type: ignore[arg-type]
        self.start, self.batch_size = 0, batch_size

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def order(self) -> List[int]:
        """The epoch's permutation, as DistributedSampler draws it."""
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        rest = self.order()[self.start:]
        return iter(rest[self.rank:len(self) * self.num_replicas:self.num_replicas])

    def __len__(self) -> int:
        per_rank = max(0, len(self.dataset) - self.start) // self.num_replicas  # type: ignore[arg-type]
        if self.start % (self.batch_size * self.num_replicas) == 0:  # whole batches, as the loader's drop_last
            per_rank -= per_rank % self.batch_size
        return per_rank


def build_loader(dataset: TensorDataset, batch_size: int, rank: int, world: int, seed: int,
                 num_workers: int = 0, pin_memory: bool = False) -> Tuple[DataLoader, ResumableSampler]:
    """Each rank reads a disjoint shard; the sampler deals every rank the same number of batches (drop_last).

    Loader processes stay alive across epochs (persistent_workers): restarting them costs more
    than an epoch of this in-memory data.
    """
    sampler = ResumableSampler(dataset, num_replicas=world, rank=rank, seed=seed, batch_size=batch_size)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=False, num_workers=num_workers,
                        pin_memory=pin_memory, persistent_workers=num_workers > 0)
    return loader, sampler


def grouped_batches(loader: Iterable[Any], size: int) -> Iterator[List[Any]]:
    """The loader's batches in groups of ``size`` (one optimizer step's micro-batches), each batch
    with the seconds the loop waited for it; a partial group at the end of the epoch is dropped."""
    group: List[Any] = []
    batches = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            return
        group.append((batch, time.perf_counter() - t0))
        if len(group) == size:
            yield group
            group = []
