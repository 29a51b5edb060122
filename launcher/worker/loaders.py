"""The DataLoader a script's training loop iterates, seen from an optimizer step hook: its batch size and batches per
step, for samples/s. Stdlib only; executed into a worker's progress namespace before progress.py (WORKER_FILES there).

Samples: the DataLoader the training loop consumes is found in the hook's calling frames (their locals, and their
`self`'s attributes), and its live iterator as the object that holds its index sampler (gc.get_referrers, a scan of
the heap: a millisecond in a forked worker, whose zygote froze torch's objects out of the collector's reach, up to
50 ms in a fresh one; so at the first step, and then at most once a minute). The iterator's own count of batches
yielded, between two windows, gives batches per step, so gradient accumulation counts right; after its epoch the
measured ratio carries on. Without a DataLoader in reach (a hand-made loop, an
IterableDataset that batches itself), samples/s is unknown and the record says why.
"""

import gc
import sys
import time
import types
import weakref

TYPE_CHECKING = False  # typing's, without importing typing into a worker; type checkers read it as true
if TYPE_CHECKING:
    from typing import Any
if "torch_private" not in globals():  # imported by the launcher; a worker's bootstrap gives its own copy
    from launcher.runtime import torch_private

SEARCH_GIVE_UP = 5  # searches in a row that found nothing: stop looking
RESEARCH_S = 60.0  # once batches per step is known, look for a new iterator at most this often
CO_OPTIMIZED = 0x1  # inspect.CO_OPTIMIZED: a function's frame, whose f_locals is a snapshot


class Loader:
    """The training loop's DataLoader iterator: batches per optimizer step, and its batch size.

    Batches per step is read off the iterator's own count (torch_private.batches_yielded) between two looks at the same
    iterator, so gradient accumulation counts right (and a wrapper that fetches a batch ahead, as Hugging Face's
    Trainer does, does not); a window's samples are its steps x that x the batch size. Until the first such
    measurement every step looks (an attribute read); epochs shorter than a window replace the iterator between
    looks, and the last measured ratio carries on.
    """

    def __init__(self) -> None:
        self.ref: "weakref.ref[Any] | None" = None  # weakref to the iterator: holding it would keep its loader workers alive
        self.yielded = self.at_step = 0  # its count and our step count at the last look
        self.per_step: "float | None" = None  # batches per optimizer step
        self.batch_size: "int | None" = None
        self.misses = 0
        self.searched_at = float("-inf")
        self.measured = False  # per_step read off two looks at one iterator (until then, every step looks: cheap)

    def window(self, step: int, steps: int) -> dict:
        """Samples of a window of `steps` steps ending at `step`."""
        if step == 0:
            return {}
        if self.misses >= SEARCH_GIVE_UP:
            return {"samples": None, "samples_note": "no torch DataLoader iterator in the training loop's frames"}
        try:
            self.look(step)
        except Exception:  # noqa: BLE001  (a search must never fail a training step)
            self.ref = None
        if self.per_step is None:
            self.misses += 1
            return {"samples": None, "samples_note": "no torch DataLoader iterator in the training loop's frames"}
        self.misses = 0
        batches = steps * self.per_step
        if not self.batch_size:
            return {"batches": batches, "samples": None,
                    "samples_note": "the DataLoader has no batch_size (batch_size=None, or a batch_sampler without one)"}
        return {"batches": batches, "batch_size": self.batch_size, "samples": round(batches * self.batch_size)}

    def measure(self, step: int) -> bool:
        """Batches per step from the tracked iterator's count since the last look (no search); whether it is alive."""
        it = self.ref() if self.ref is not None else None
        if it is None:
            return False
        yielded = torch_private.batches_yielded(it)
        if yielded != self.yielded and step > self.at_step:
            self.per_step, self.measured = (yielded - self.yielded) / (step - self.at_step), True
            self.yielded, self.at_step = yielded, step
        return True

    def look(self, step: int) -> None:
        it = self.ref() if self.ref is not None else None
        if it is not None and torch_private.batches_yielded(it) != self.yielded and self.measure(step):
            return
        now = time.monotonic()
        if self.per_step is not None and now - self.searched_at < RESEARCH_S:
            return  # its epoch ended: the ratio carries on; a search (a scan of the heap) is for now and then
        self.searched_at = now
        found = self.search()
        if found is None or found is it:
            return
        sampler = torch_private.index_sampler(found)
        batching = torch_private.batches_automatically(found)
        self.batch_size = getattr(sampler, "batch_size", None) if batching else None
        self.ref = weakref.ref(found)
        yielded = torch_private.batches_yielded(found)
        if not self.measured and yielded and step:
            self.per_step = yielded / step  # provisional (a loader wrapper may fetch ahead): measure() refines
        self.yielded, self.at_step = yielded, step

    def search(self) -> "Any":
        """The iterator of a DataLoader the calling frames hold (a loop's iterator lives on its frame's evaluation stack,
        out of reach: it is found as the one object holding that DataLoader's index sampler, gc.get_referrers)."""
        iter_type, loader_type = torch_private.dataloader_types()
        if iter_type is None or loader_type is None:
            return None
        frame: "types.FrameType | None" = sys._getframe(1)
        while frame is not None:
            for value in frame_values(frame):
                if isinstance(value, iter_type):
                    return value
                if isinstance(value, loader_type):
                    sampler = torch_private.index_sampler(value)
                    for holder in gc.get_referrers(sampler):
                        if isinstance(holder, iter_type) and torch_private.index_sampler(holder) is sampler:
                            return holder
            frame = frame.f_back
        return None


def frame_values(frame: types.FrameType) -> list:
    """A frame's local values, and the attributes of its `self`. Before Python 3.13 a function frame's f_locals is a
    snapshot that the frame keeps: emptied again at once, so it holds no tensor of the script alive (a module's
    f_locals are its globals; 3.13's is a view that holds nothing and must not be emptied)."""
    values = frame.f_locals
    found = list(values.values())
    owner = values.get("self")
    if owner is not None and hasattr(owner, "__dict__") and not isinstance(owner, type):
        found += list(vars(owner).values())
    if type(values) is dict and frame.f_code.co_flags & CO_OPTIMIZED:  # a snapshot (Python 3.13's is a live view)
        values.clear()
    return found
