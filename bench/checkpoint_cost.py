"""What checkpointing every 50 steps costs the real job's throughput: sync against async saves.

    python bench/checkpoint_cost.py [--rounds 5] [--steps 600] [--workers 2]

The built-in trainer (default model, DDP on CPU workers under the launcher, W&B off) runs --steps
steps three ways per round, in rotating order: no step checkpoints, synchronous saves every 50 steps,
async saves every 50 steps. Throughput is the whole loop's, first step to last with the time it waited
for saves (summary.json's goodput_s + badput_s.checkpoint; start-up and shutdown left out), so it holds
both what a save blocks and what a background write slows the steps. A round's three runs go back to
back; cost = 1 - samples/s / samples/s without step checkpoints in the same round, median over rounds.
bench/checkpoint_async.py measures the same in one process with one thread (shorter steps, so a larger
share); this is the figure a user of the launcher sees.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
VARIANTS: Dict[str, List[str]] = {
    "none": ["checkpoint.every_steps=0"],
    "sync-50": ["checkpoint.every_steps=50"],
    "async-50": ["checkpoint.every_steps=50", "checkpoint.async_save=true"],
}


def run(out: Path, name: str, steps: int, workers: int) -> Dict:
    where = out / name
    cmd = [sys.executable, "-m", "launcher", "--gpus", str(workers), f"output_dir={where}", f"trainer.steps={steps}",
           "checkpoint.every_seconds=0", "wandb.mode=disabled", *VARIANTS[name]]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(cmd, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=600)
    summary_path, = where.glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    subprocess.run(["rm", "-rf", str(where)], check=True)
    return summary


def loop_speed(summary: Dict) -> float:
    """Samples per second of the whole loop, first step to last, saves' blocking included: the steps'
    kept time plus the time they waited for saves (a completed run without failures keeps every step)."""
    loop_s = summary["goodput_s"] + summary["badput_s"]["checkpoint"]
    return summary["steps"] * summary["global_batch_size"] / loop_s


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    speed: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    step_speed: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    blocked: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-cost-") as tmp:
        names = list(VARIANTS)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                summary = run(Path(tmp), name, args.steps, args.workers)
                speed[name].append(loop_speed(summary))
                step_speed[name].append(summary["samples_per_s"])
                blocked[name].append(summary["badput_s"]["checkpoint"])
                print(f"round {r + 1} {name}: loop {speed[name][-1]:.0f} samples/s (median step "
                      f"{summary['step_time_s_median'] * 1000:.1f} ms), loop blocked by saves {blocked[name][-1]:.2f}s",
                      flush=True)
    for name in ("sync-50", "async-50"):
        # each round's variants ran back to back: compare within a round, then take the median over rounds
        costs = sorted(1 - s / b for s, b in zip(speed[name], speed["none"]))
        step_costs = [1 - s / b for s, b in zip(step_speed[name], step_speed["none"])]
        print(f"{name}: throughput cost {statistics.median(costs):.1%} (rounds {costs[0]:.1%} to {costs[-1]:.1%}; "
              f"median step slower by {statistics.median(step_costs):.1%}), loop blocked "
              f"{statistics.median(blocked[name]):.2f}s per run against {statistics.median(blocked['none']):.2f}s "
              f"without step checkpoints")
    return 0


if __name__ == "__main__":
    sys.exit(main())
