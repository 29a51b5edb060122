"""data.record_shards=true: which samples each rank read, for tests and audits of the data split.

shards/rank-<r>.json      the indices rank r's sampler deals it in epoch 0 (its whole shard)
shards/seen-<a>-rank-<r>.jsonl   per optimizer step of attempt a (LAUNCHER_ATTEMPT): the step, its
                          epoch and the indices rank r trained on; across an elastic membership change (another
                          world size, other ranks) the kept steps' indices show no sample dropped or repeated
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Optional

from launcher.runtime import safefs


def record_shard(run_dir: str, rank: int, indices: List[int]) -> None:
    path = Path(run_dir) / "shards" / f"rank-{rank}.json"
    with safefs.open_file(str(path), "w", root=run_dir) as f:  # never through a planted link
        f.write(json.dumps(indices))


class SeenRecorder:
    """Appends one line per optimizer step: the indices this rank's batches held (a no-op when off)."""

    def __init__(self, run_dir: Optional[str], on: bool, rank: int, attempt: int, batch_size: int) -> None:
        self._path = Path(run_dir) / "shards" / f"seen-{attempt}-rank-{rank}.jsonl" if (on and run_dir) else None
        self._root, self._batch = run_dir, batch_size
        self._epoch_indices: List[int] = []

    def open_epoch(self, sampler: Any) -> None:
        """The indices the sampler deals this rank from where the epoch (re)starts."""
        if self._path is not None:
            self._epoch_indices = list(iter(sampler))

    def step(self, step: int, epoch: int, first_batch: int, batches: int) -> None:
        """first_batch: the step's first batch, counted from where this attempt opened the epoch."""
        if self._path is None:
            return
        indices = self._epoch_indices[first_batch * self._batch:(first_batch + batches) * self._batch]
        with safefs.open_file(str(self._path), "a", root=str(self._root)) as f:
            f.write(json.dumps({"step": step, "epoch": epoch, "indices": indices}) + "\n")
