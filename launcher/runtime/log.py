"""launcher.log(values): a script's own figures (loss, learning rate, ...) in the run's step records.

    import launcher
    launcher.log({"loss": loss.item(), "lr": scheduler.get_last_lr()[0]})           # rank 0's values
    launcher.log({"tokens": n}, per_rank=True)                                       # every rank's, as lists
    launcher.log({"val_loss": v}, step=epoch)                                        # at a step of its own, as W&B's

Under the launcher, every call is kept, at the step it was logged (the optimizer steps so far, or step=N):
<run_dir>/series/rank-<k>.jsonl, one line a call (launcher/worker/progress.py, which a worker's bootstrap installs
as a global optimizer step hook), the job's W&B run at that step, and the board's charts; each window's last value
joins its metrics.jsonl row, and `final_loss` in summary.json is the last `loss` logged. Rank 0's values by
default; other ranks' calls return at once unless per_rank=True, whose values are kept per rank (metrics.jsonl's
`<key>_per_rank` lists, W&B's `<key>/rank<k>`). Under torchrun or plain python there is no such hook: the call
checks its argument and returns (one lookup, once, then nothing). It never blocks: values are kept in memory and
written about once a second, on a thread of their own; a full disk stops the records, not the training.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from launcher.runtime import torch_private

_watch: Optional[Any] = None
_looked = False


def log(values: Mapping[str, Any], per_rank: bool = False, step: Optional[int] = None) -> None:
    """Record numbers (floats, ints, bools; tensors and NumPy scalars through .item()) at this step, or at `step`."""
    if not isinstance(values, Mapping):
        raise TypeError(f"launcher.log takes a dict of numbers, e.g. launcher.log({{'loss': loss.item()}}), "
                        f"not a {type(values).__name__}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise TypeError(f"launcher.log's step is a whole number of steps from 0, e.g. step=100, not {step!r}")
    watch = _watch if _looked else _find_watch()
    if watch is not None:
        watch.log(values, per_rank, step)


def _find_watch() -> Optional[Any]:
    """The worker's step watch among torch's global optimizer step hooks (none outside the launcher)."""
    global _watch, _looked
    hooks = torch_private.global_optimizer_step_hooks()
    if hooks is None:  # torch not imported yet (or too old): look again on the next call
        return None
    _looked = True
    _watch = next((hook for hook in hooks.values() if getattr(hook, "launcher_step_watch", False)), None)
    return _watch
