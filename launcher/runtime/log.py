"""launcher.log(values): a script's own figures (loss, learning rate, ...) in the run's step records.

    import launcher
    launcher.log({"loss": loss.item(), "lr": scheduler.get_last_lr()[0]})           # rank 0's values
    launcher.log({"tokens": n}, per_rank=True)                                       # every rank's, as lists

Under the launcher, the values join the current step's record (launcher/worker/progress.py, which a worker's
bootstrap installs as a global optimizer step hook): metrics.jsonl, W&B, the board, and `final_loss` in
summary.json (the last `loss` logged). Rank 0's values by default; other ranks' calls return at once unless
per_rank=True, whose values appear as `<key>_per_rank` lists. Under torchrun or plain python there is no such
hook: the call checks its argument and returns (one lookup, once, then nothing). It never blocks: values are
kept in memory and written about once a second with the step records; a full disk stops the records, not the
training.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping, Optional

_watch: Optional[Any] = None
_looked = False


def log(values: Mapping[str, Any], per_rank: bool = False) -> None:
    """Add numbers (floats, ints, bools; tensors and NumPy scalars through .item()) to this step's record."""
    if not isinstance(values, Mapping):
        raise TypeError(f"launcher.log takes a dict of numbers, e.g. launcher.log({{'loss': loss.item()}}), "
                        f"not a {type(values).__name__}")
    watch = _watch if _looked else _find_watch()
    if watch is not None:
        watch.log(values, per_rank)


def _find_watch() -> Optional[Any]:
    """The worker's step watch among torch's global optimizer step hooks (none outside the launcher)."""
    global _watch, _looked
    optimizer = sys.modules.get("torch.optim.optimizer")
    hooks = getattr(optimizer, "_global_optimizer_post_hooks", None) if optimizer is not None else None
    if hooks is None:  # torch not imported yet (or too old): look again on the next call
        return None
    _looked = True
    _watch = next((hook for hook in hooks.values() if getattr(hook, "launcher_step_watch", False)), None)
    return _watch
