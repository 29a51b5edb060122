"""What the training-loop switches cost and save on this machine: activation checkpointing (memory
kept for backward vs step time), bf16 autocast, and torch.compile (compile time vs steady steps).

Each variant runs the same GPT job (2 DDP workers) through the launcher; rounds alternate the
variants and figures are medians, reported as ratios to the fp32 eager baseline of the same round.
    python bench/features.py [--rounds N] [--steps N]
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
MODEL = ["model.name=gpt", "model.hidden=256", "model.depth=4", "model.heads=4", "model.seq_len=64",
         "data.batch_size=32", "data.dataset_size=4096", "wandb.mode=disabled"]
VARIANTS: Dict[str, List[str]] = {
    "fp32": [],
    "activation_checkpointing": ["trainer.activation_checkpointing=true"],
    "bf16": ["trainer.precision=bf16"],
    "compile": ["trainer.compile=true"],
}


def one_run(extra: List[str], steps: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "launcher", "--gpus", str(workers), f"output_dir={out}",
               f"trainer.steps={steps}", f"trainer.log_every={steps}", *MODEL, *extra]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))
        if proc.returncode != 0:
            raise RuntimeError(f"{extra} failed:\n{proc.stderr[-2000:]}")
        return json.loads(next(Path(out).glob("*/summary.json")).read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    samples: Dict[str, List[dict]] = {name: [] for name in VARIANTS}
    for r in range(args.rounds):
        names = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
        for name in names:
            samples[name].append(one_run(VARIANTS[name], args.steps, args.workers))

    def med(name: str, key: str) -> float:
        return statistics.median(s[key] if not isinstance(s[key], list) else s[key][0] for s in samples[name])

    base_step, base_act = med("fp32", "step_time_s_median"), med("fp32", "activation_bytes_per_rank")
    print(f"GPT {MODEL[1:4]}, {args.workers} DDP workers, batch 32/worker, {args.steps} steps, {args.rounds} rounds (medians)")
    print(f"{'variant':<26}{'step ms':>9}{'x fp32':>8}{'saved MiB':>11}{'x fp32':>8}{'peak RSS MiB':>14}")
    for name in VARIANTS:
        step, act = med(name, "step_time_s_median"), med(name, "activation_bytes_per_rank")
        print(f"{name:<26}{step * 1000:>9.1f}{step / base_step:>8.2f}{act / 2**20:>11.1f}{act / base_act:>8.2f}"
              f"{med(name, 'peak_memory_bytes_per_rank') / 2**20:>14.0f}")
    compile_s = med("compile", "compile_time_s")
    print(f"compile: {compile_s:.1f} s in the first step, then {med('compile', 'step_time_s_median') * 1000:.1f} ms/step "
          f"(eager {base_step * 1000:.1f} ms/step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
