"""What the worker bootstrap's optimizer-step hook (plain scripts' progress for the hang watchdog) costs a
training step of the default model, in one process.

    python bench/progress_hook.py [--rounds R] [--steps S]

Blocks of S steps of the built-in trainer's default model (MLP 256-512x4-10, batch 32, AdamW) alternate
without and with the hook (the order rotates each round); each block's median step time is taken, and
the hook's share is printed two ways: paired blocks (noisy on a shared box) and the hook's own time per
call (timed alone, a million calls) over the median step.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, List

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from launcher.config.schema import ModelConfig  # noqa: E402
from launcher.trainers.models import build_model  # noqa: E402

BATCH = 32


def load_bootstrap() -> Any:
    """launcher/worker/bootstrap.py is a program (it drops sys.path[0] on load): load it as a module, sys.path kept."""
    saved = list(sys.path)
    spec = importlib.util.spec_from_file_location("bootstrap", os.path.join(REPO, "launcher", "worker", "bootstrap.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    sys.path[:] = saved
    return module


def step_times(step: Callable[[], None], steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cfg = ModelConfig()
    model = build_model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, cfg.in_dim), torch.randint(0, cfg.classes, (BATCH,))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    bootstrap = load_bootstrap()
    with tempfile.TemporaryDirectory() as tmp:
        beat = os.path.join(tmp, "rank-0")
        open(beat, "w").close()
        step_times(step, args.steps)  # warm-up
        base: List[float] = []
        hooked: List[float] = []
        for r in range(args.rounds):
            for with_hook in ((False, True) if r % 2 == 0 else (True, False)):
                handle = bootstrap.watch_optimizer_steps(beat) if with_hook else None
                (hooked if with_hook else base).append(step_times(step, args.steps))
                if handle is not None:
                    handle.remove()
        handle = bootstrap.watch_optimizer_steps(beat)
        from torch.optim.optimizer import _global_optimizer_post_hooks  # the hook itself, to time it alone

        hook = _global_optimizer_post_hooks[handle.id]
        calls = 1_000_000
        t0 = time.perf_counter()
        for _ in range(calls):
            hook(optimizer, (), {})
        per_call = (time.perf_counter() - t0) / calls
        handle.remove()
    step_s = statistics.median(base)
    paired = statistics.median(h / b for h, b in zip(hooked, base)) - 1
    print(f"default model step (median of {args.rounds} blocks of {args.steps}): {step_s * 1e3:.3f} ms; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"hook alone: {per_call * 1e9:.0f} ns per step = {per_call / step_s:.4%} of a step (target < 0.5%)")
    print(f"paired blocks, with hook / without - 1: {paired:+.2%} (median of {args.rounds}; noise on a shared box)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
