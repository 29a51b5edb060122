"""When the training loop saves, and how it picks up exactly where a checkpoint left off.

Kept apart from trainers.checkpoint.store (the on-disk format) so a strategy or a cluster integration can
use the format without the loop's policy: every_steps, every_seconds, at the end, and on a stop request.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from launcher.runtime import safefs
from launcher.runtime.checkpoints import checkpoint_dir
from launcher.runtime.goodput import GoodputClock
from launcher.runtime.objects import is_url
from ..faults.stop import STOP, StepSignals
from . import remote_store, store
from .background import BackgroundWriter, stage, staged_bytes, writer_group
from .interval import young_daly_steps
from .store import Position, Resume, load_latest, rank_payload, restore_rng, state_dict


PROBE_STEPS = 10  # every_steps=auto: steps timed before the save whose cost sets the interval


@dataclass(frozen=True)
class Start:
    """Where the loop starts: from scratch, or just after a checkpoint."""

    step: int = 0
    epoch: int = 0
    offset: int = 0  # samples of `epoch` all ranks together consumed before (trainers.data.ResumableSampler)
    rng: Optional[dict] = None  # RNG states to restore at that point (open_epoch)
    resumed: Optional[Resume] = None


class Checkpointer:
    """The loop's checkpoint policy; every method is called by all ranks at the same step."""

    def __init__(self, cfg: Any, run_dir: Optional[str], rank: int, world_size: int, device: torch.device,
                 model: torch.nn.Module, optimizer: torch.optim.Optimizer, clock: Optional[GoodputClock] = None) -> None:
        self.dir = checkpoint_dir(cfg, run_dir)
        self._store: Any = remote_store if is_url(self.dir) else store  # a URL: object storage, published in place
        self._run_dir = Path(run_dir) if run_dir else None
        self._auto = cfg.checkpoint.every_steps == "auto"
        self._every_steps = 0 if self._auto else cfg.checkpoint.every_steps
        self._mtbf_s = getattr(cfg.checkpoint, "mtbf_s", 3600.0)
        self._probe: Optional[tuple] = None  # every_steps=auto: (first step seen, when) until the probe save
        self._every_s = cfg.checkpoint.every_seconds
        self._keep = cfg.checkpoint.keep
        self._rank, self._world = rank, world_size
        self._model, self._optimizer = model, optimizer
        self._signals = StepSignals(world_size, device)
        self._last_step = -1
        self._last_at = time.monotonic()
        self._clock = clock or GoodputClock(None, None, 0, rank)
        self.is_async = self._async = bool(getattr(cfg.checkpoint, "async_save", False)) and self.dir is not None
        self._writer = BackgroundWriter()
        self._group = writer_group() if self._async else None  # collective: every rank builds its Checkpointer
        self._staged: Any = None  # the async copy, reused by the next save once its write is done
        self.staged_bytes = 0  # host memory that copy holds: the bound on what async saves add

    def resume(self, samples_per_batch: int, batches_left: Callable[[int], int]) -> Start:
        """Load the newest good checkpoint, if any: a restarted or repeated job continues, never restarts.

        samples_per_batch: one batch of every rank together (for checkpoints that kept no sample offset, all of
        this world size); batches_left(offset): this rank's batches of an epoch picked up at that offset.
        """
        resumed = load_latest(self.dir, self._model, self._optimizer) if self.dir is not None else None
        if resumed is None:
            return Start()
        self._last_step = resumed.position.step
        if self._rank == 0:
            drop_metrics_after(self._run_dir, resumed.position.step)
        position = resumed.position
        step, epoch = position.step, position.epoch
        offset = position.samples if position.samples is not None else position.batch * samples_per_batch
        rng = resumed.rng
        if batches_left(offset) == 0:  # saved at the end of an epoch
            epoch, offset = epoch + 1, 0
        world = f", {position.world_size} ranks then" if position.world_size not in (None, self._world) else ""
        print(f"resumed from {resumed.path} at step {step} (epoch {epoch}, sample {offset}{world})", flush=True)
        return Start(step, epoch, offset, rng, resumed)

    def after_step(self, step: int, epoch: int, batch: int, mean_loss: Callable[[], float], last: bool,
                   samples: Optional[int] = None) -> bool:
        """Save when due; True when the ranks agreed to stop (a signal arrived on any of them).

        mean_loss is collective too, and called only when saving (it synchronises the device).
        samples: the epoch's samples all ranks together consumed (Position.samples).
        """
        time_due = self._rank == 0 and self._every_s > 0 and time.monotonic() - self._last_at >= self._every_s
        if time_due:
            self._last_at = time.monotonic()  # asked once: the agreed answer comes back a step later
        stop, time_due = self._signals.exchange(STOP.requested, time_due)
        if stop or last:
            self._signals.settle()  # the loop ends here: nothing may stay in flight
        step_due = self._every_steps > 0 and step % self._every_steps == 0
        probe_due = self._auto and self._probe_due(step)
        if stop or time_due or step_due or last or probe_due:
            started = time.monotonic()
            self.save(Position(step, epoch, batch, mean_loss(), self._wandb_run_id(), samples, self._world))
            if probe_due:
                self._choose_interval(step, started, time.monotonic() - started)
        return stop

    def _probe_due(self, step: int) -> bool:
        """every_steps=auto measures one save after PROBE_STEPS steps (the same step on every rank)."""
        if self._probe is None:
            self._probe = (step, time.monotonic())
        return self._every_steps == 0 and step == self._probe[0] + PROBE_STEPS

    def _choose_interval(self, step: int, save_started: float, save_s: float) -> None:
        """Rank 0's measurement decides for all ranks (a save is collective: they must agree)."""
        first, at = self._probe or (step, save_started)
        elapsed_s = time.time() - self._clock.started if self._clock.started is not None else 0.0
        chosen = [young_daly_steps(save_s, (save_started - at) / max(1, step - first), self._mtbf_s,
                                   self._clock.attempt, elapsed_s)]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(chosen, src=0)
        self._every_steps, reason = chosen[0]
        if self._rank == 0:
            print(f"checkpoint.every_steps=auto: {reason}", flush=True)

    def save(self, position: Position) -> None:
        if self.dir is None or position.step == self._last_step:
            return
        blocked_from = time.time()
        if self._async:
            self._writer.wait()  # at most one write in flight: the previous one first
            state = self._staged = stage(state_dict(self._model, self._optimizer), self._staged)
            payload = rank_payload(position)
            self.staged_bytes = staged_bytes(state)
            self._clock.blocked(blocked_from, time.time())
            snapshot = self._clock.snapshot()
            self._writer.start(lambda: self._written(
                self._store.write(self.dir, state, payload, position, self._keep, self._group), snapshot))
        else:
            path = self._store.save(self.dir, self._model, self._optimizer, position, self._keep)
            self._clock.blocked(blocked_from, time.time())
            self._written(path, self._clock.snapshot())
        self._last_step, self._last_at = position.step, time.monotonic()

    def _written(self, path: Any, snapshot: dict) -> None:
        """A checkpoint is published: the steps up to it are kept (in the writer's thread for async saves)."""
        self._clock.keep(snapshot)
        if self._rank == 0:
            print(f"checkpoint saved: {path}", flush=True)

    def finish(self) -> None:
        """Wait for a save still being written: the last checkpoint is on disk before the worker reports."""
        if self._writer.in_flight:
            blocked_from = time.time()
            self._writer.wait()
            self._clock.blocked(blocked_from, time.time())

    def _wandb_run_id(self) -> Optional[str]:
        """Written into the run directory by the W&B logger, so a resumed run continues the same W&B run."""
        path = self._run_dir / "wandb_run_id" if self._run_dir else None
        if path is not None and path.is_file():
            return safefs.read_bytes(str(path), root=str(self._run_dir)).decode("utf-8").strip() or None
        return None


def drop_metrics_after(run_dir: Optional[Path], step: int) -> None:
    """A resumed run redoes the steps after its checkpoint: drop their old metrics lines (rank 0 only).

    Without this, metrics.jsonl of a run that died at step 37 and resumed from 30 would hold
    steps 31-37 twice.
    """
    path = run_dir / "metrics.jsonl" if run_dir else None
    if path is None or not path.is_file():
        return
    kept = []
    for line in safefs.read_bytes(str(path), root=str(run_dir)).decode("utf-8").splitlines():
        try:
            if int(json.loads(line).get("step", 0)) > step:
                continue
        except (ValueError, AttributeError):
            pass  # not ours to judge: keep it
        kept.append(line + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    with safefs.open_file(str(tmp), "w", root=str(run_dir), encoding="utf-8") as f:  # nothing followed (docs/security.md)
        f.write("".join(kept))
    safefs.replace(str(tmp), str(path), root=str(run_dir))


def open_epoch(loader: DataLoader, mid_epoch: bool, rng: Optional[dict]) -> Iterator[Any]:
    """The epoch's batches (its sampler set to start where the saved run stood), with the RNG states exactly as
    the saved run had them there.

    Creating a DataLoader iterator draws from torch's RNG, so the saved states are restored at the
    point they were captured: before the iterator for an epoch boundary, after it mid-epoch.
    """
    if rng is not None and not mid_epoch:
        restore_rng(rng)
    batches = iter(loader)
    if rng is not None and mid_epoch:
        restore_rng(rng)
    return batches
