"""Checkpoints written in the background: the loop waits only for a host-memory copy of the state.

The copy (stage) is taken at a step boundary with the RNG states and data position of that step;
a daemon thread then writes it through trainers.checkpoint.store.write on a process group of its own, so
its collectives never interleave with the loop's. At most one write is in flight: the next save, and
the end of training, wait for it. The manifest is published by that write, after every rank's files
are on disk, so a kill mid-write leaves the previous checkpoint the newest valid one.

Why not torch.distributed.checkpoint.async_save (torch 2.13): bench/async_checkpoint.py runs both on the same
state (2 gloo ranks on CPU, DDP MLP + AdamW, both publishing through write()'s manifest steps) and
bench/async_checkpoint.json (2026-11-25) has async_save blocking the loop x1.85 (10M parameters) and x1.59
(50M) as long as this, its whole save x1.27 and x1.15, for x0.84-0.85 of the peak extra memory (it frees its
copy after each write; stage() keeps one for the next save so it copies into memory already mapped).
Every checkpoint of both loads bitwise-equal. async_save's own way to reuse its copy
(cache_staged_state_dict) pins memory, which torch refuses without an accelerator. And it would not save
code here: our publication (rank file, manifest last, keep-N) would run in a done callback, whose errors a
Future drops, and clearing a stale .tmp-step would take a barrier on the loop's thread, since DCP's writer
makes the folder on every rank. Revisit when async_save leaves "experimental" or those figures turn.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist


def stage(state: Any, into: Any = None) -> Any:
    """A copy in host memory that the loop may change freely once this returns (blocking on a GPU's copy).

    into: the previous copy, whose write has completed: its tensors are reused where shapes match, so a
    save copies into memory already mapped instead of allocating (and faulting in) the state's size again.
    """
    if isinstance(state, torch.Tensor):
        if isinstance(into, torch.Tensor) and into.shape == state.shape and into.dtype == state.dtype \
                and type(into) is type(state):
            return into.copy_(state.detach())
        return state.detach().clone() if state.device.type == "cpu" else state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        old = into if isinstance(into, dict) else {}
        return type(state)((key, stage(value, old.get(key))) for key, value in state.items())
    if isinstance(state, (list, tuple)):
        olds = into if isinstance(into, (list, tuple)) and len(into) == len(state) else [None] * len(state)
        return type(state)(stage(value, previous) for value, previous in zip(state, olds))
    return copy.deepcopy(state)


def staged_bytes(state: Any) -> int:
    """Host memory a staged copy holds (the bound on what an async save adds)."""
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return local.numel() * local.element_size()
    if isinstance(state, dict):
        return sum(staged_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(staged_bytes(v) for v in state)
    return 0


def writer_group() -> Optional[Any]:
    """A gloo group for the background writes (collective: every rank calls it at the same point)."""
    if dist.is_initialized():
        return dist.new_group(backend="gloo")
    return None


class BackgroundWriter:
    """One write at a time in a daemon thread; its error is raised where the loop next waits for it."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def start(self, write: Callable[[], None]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), name="checkpoint-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Block until the write in flight (if any) is done; re-raise its error here, in the loop."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as e:  # DCP's CheckpointException is a BaseException
            self._error = e
