"""What a script's zero-code step metrics and a launcher.log call each step cost a 5 ms CPU training step, in one
process, and that 100,000 launcher.log calls all reach the run directory.

    python bench/script_metrics.py [--rounds R] [--seconds S] [--step-ms 5] [--calls 100000]

The worker's step watch (launcher/worker/progress.py: one global optimizer step post hook that beats for the
watchdog, times each step, and about once a second writes a record, reads memory and looks at the DataLoader)
is installed exactly as a worker installs it, over a real loop: an MLP on a DataLoader, sized so that one step
takes about --step-ms on one thread. Blocks of S seconds without and with the watch alternate (the order
rotates each round); with the watch, each step also logs 5 values as `launcher.log` does (StepWatch.log). Each
block's steps per second is taken. Printed: the watch's own time per step (the whole time inside the hook and the
log call over a block after its first step, flushes included, divided by those steps) as a share of the step,
which is the figure the target holds (<= 1% of a 5 ms step; the writes themselves run on the worker's writer
thread), the first step's (a one-time search for the DataLoader), the paired blocks' throughput ratio (noisy on a
shared box), and then --calls launcher.log calls made as fast as they come, counted back from the series file.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

WORKER = Path(__file__).resolve().parent.parent / "launcher" / "worker"
BATCH = 64


def progress_namespace() -> Dict[str, Any]:
    """loaders.py and progress.py as a worker runs them (launcher.worker.bootstrap executes them into a namespace)."""
    namespace: Dict[str, Any] = {"__name__": "launcher_worker_progress"}
    for name in ("loaders.py", "writer.py", "waits.py", "progress.py"):
        path = WORKER / name
        exec(compile(path.read_bytes(), str(path), "exec"), namespace)
    return namespace


def build(width: int) -> Callable[[float], int]:
    """A training loop over a DataLoader; run(seconds) -> steps done."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(TensorDataset(torch.randn(BATCH * 64, 256), torch.randint(0, 10, (BATCH * 64,))),
                        batch_size=BATCH, shuffle=True)

    def run(seconds: float, log: Optional[Callable[[Dict[str, Any]], None]] = None) -> int:
        steps, end = 0, time.perf_counter() + seconds
        while True:
            for x, y in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                if log is not None:  # what a script logs each step: a tensor and four numbers
                    log({"loss": loss, "lr": 1e-3, "step_in_epoch": steps % 64, "grad_scale": 1.0, "tokens": BATCH})
                steps += 1
                if time.perf_counter() >= end:
                    return steps

    return run


def calibrate(step_ms: float) -> int:
    """The hidden width whose step takes about step_ms on this machine now."""
    width = 256
    for _ in range(8):
        run = build(width)
        run(0.3)
        per_step = 1.0 / run(1.0)
        if abs(per_step * 1e3 - step_ms) / step_ms < 0.15:
            break
        width = max(16, int(width * (step_ms / (per_step * 1e3)) ** 0.5))
    return width


class Timed:
    """The watch with a stopwatch around it: its own time per step, flushes included."""

    def __init__(self, watch: Any) -> None:
        self.watch, self.inside, self.calls, self.first = watch, 0.0, 0, 0.0
        self.launcher_step_watch = True

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        t0 = time.perf_counter()
        self.watch(optimizer, args, kwargs)
        took = time.perf_counter() - t0
        if self.calls == 0:
            self.first = took  # the first step's: it finds the DataLoader (once per worker)
        else:
            self.inside += took
        self.calls += 1

    def log(self, values: Dict[str, Any]) -> None:
        t0 = time.perf_counter()
        self.watch.log(values, False)
        if self.calls > 1:
            self.inside += time.perf_counter() - t0


def block(run: Callable[[float], int], seconds: float, run_dir: Optional[str]) -> tuple:
    """(steps/s, seconds in the hook per step after the first or None, the first step's) of one block."""
    handle, timed = None, None
    if run_dir is not None:
        beat = os.path.join(run_dir, "heartbeats", "rank-0")
        os.makedirs(os.path.dirname(beat), exist_ok=True)
        open(beat, "w").close()
        where = {"run_dir": run_dir, "rank": 0, "attempt": 0, "launch": "1", "wandb": False}
        namespace = progress_namespace()
        timed = Timed(namespace["StepWatch"](where, beat, time.time(), namespace["Loader"]()))
        handle = register_optimizer_step_post_hook(timed)
    steps = run(seconds, timed.log if timed is not None else None)
    if handle is not None:
        handle.remove()
        timed.watch.close()
    return steps / seconds, (timed.inside / max(1, timed.calls - 1) if timed else None), (timed.first if timed else 0.0)


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--calls", type=int, default=100_000)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    gc.freeze()  # as the zygote does after importing torch: a worker's collector (and gc.get_referrers) skips those
    width = calibrate(args.step_ms)
    run = build(width)
    run(1.0)  # warm-up
    base: List[float] = []
    hooked: List[float] = []
    inside: List[float] = []
    firsts: List[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for with_hook in ((False, True) if r % 2 == 0 else (True, False)):
                rate, per_step, first = block(run, args.seconds, tmp if with_hook else None)
                (hooked if with_hook else base).append(rate)
                if per_step is not None:
                    inside.append(per_step)
                    firsts.append(first)
        records = sum(1 for _ in open(os.path.join(tmp, "steps", "rank-0.jsonl")))
    kept, took = many_calls(args.calls)
    step_s = 1.0 / statistics.median(base)
    hook_s = statistics.median(inside)
    paired = statistics.median(b / h for h, b in zip(hooked, base)) - 1
    print(f"step: {step_s * 1e3:.2f} ms (MLP width {width}, batch {BATCH}, AdamW, DataLoader, 1 thread; "
          f"median of {args.rounds} blocks of {args.seconds:g}s); torch {torch.__version__}")
    print(f"the step watch's own time: {hook_s * 1e6:.1f} us per step, flushes included = {hook_s / step_s:.3%} of a "
          f"step (target <= 1%); {records} records written; the first step, which finds the DataLoader once per "
          f"worker: {statistics.median(firsts) * 1e3:.1f} ms")
    print(f"paired blocks, step time with the watch / without - 1: {paired:+.2%} (median of {args.rounds}; noise on a "
          "shared box)")
    print(f"{args.calls} launcher.log calls, one per step, as fast as they come ({took:.1f}s): {kept} in the series "
          f"file{'' if kept == args.calls else ' - SOME WERE DROPPED'}")
    return 0 if kept == args.calls else 1


def many_calls(calls: int) -> tuple:
    """(lines in the series file, seconds) after `calls` steps each logging 5 values, with no training between."""
    optimizer = object.__new__(torch.optim.SGD)
    with tempfile.TemporaryDirectory() as tmp:
        where = {"run_dir": tmp, "rank": 0, "attempt": 0, "launch": "1", "wandb": False}
        namespace = progress_namespace()
        watch = namespace["StepWatch"](where, None, time.time(), namespace["Loader"]())
        t0 = time.perf_counter()
        for i in range(calls):
            watch(optimizer, (), {})
            watch.log({"loss": 1.0 / (i + 1), "a": i, "b": 2.0, "c": 3.0, "d": 4.0}, False)
        watch.close()
        took = time.perf_counter() - t0
        return sum(1 for _ in open(os.path.join(tmp, "series", "rank-0.jsonl"))), took


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
