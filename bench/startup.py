"""Time from the command to rank 0's first optimizer step, and total wall time: our launcher vs
torchrun, on the built-in MLP trainer and on a plain torchrun-style script, at 2 and 4 workers.

Runs alternate between launchers round by round; figures are medians with ratios ours/torchrun.
    python bench/startup.py [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "scripts" / "ddp_mlp.py"
STEPS = 20


def _env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ, WANDB_MODE="disabled", BENCH_STEPS=str(STEPS))
    env.update(extra)
    return env


def _torchrun(workers: int) -> List[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(workers), "--max-restarts", "0"]


def command(launcher: str, workload: str, workers: int, out: str) -> List[str]:
    if launcher == "ours":
        head = [sys.executable, "-m", "launcher", "--gpus", str(workers), f"output_dir={out}", "wandb.mode=disabled"]
        return head + ([f"trainer.steps={STEPS}"] if workload == "builtin" else [str(SCRIPT)])
    if workload == "builtin":
        return _torchrun(workers) + ["-m", "launcher.trainers.train", f"trainer.steps={STEPS}", "wandb.mode=disabled"]
    return _torchrun(workers) + [str(SCRIPT)]


def seconds_to_first_step(launcher: str, workload: str, stdout: str, out: str, t0: float) -> float:
    """As the workload itself reported it: the script prints an absolute time; the built-in trainer
    reports seconds since LAUNCHER_START_TIME (t0 under torchrun, our process's creation under ours)."""
    if workload == "script":
        return float(re.search(r"FIRST_STEP_AT=([\d.]+)", stdout).group(1)) - t0  # type: ignore[union-attr]
    if launcher == "ours":
        return json.loads(next(Path(out).glob("*/summary.json")).read_text())["time_to_first_step_s"]
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])["time_to_first_step_s"]


def one_run(launcher: str, workload: str, workers: int) -> Tuple[float, float]:
    """(seconds to first step, total wall seconds) for one launch, clocked from just before exec."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.time()
        proc = subprocess.run(command(launcher, workload, workers, out), cwd=REPO, capture_output=True, text=True,
                              env=_env({"LAUNCHER_START_TIME": repr(t0)}), timeout=300)
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{launcher} {workload} x{workers} failed:\n{proc.stderr[-2000:]}")
        return seconds_to_first_step(launcher, workload, proc.stdout, out, t0), wall


CASES = ("builtin_2w", "builtin_4w", "script_2w", "script_4w")


def run(quick: bool = False, rounds: int = 0, cases: Tuple[str, ...] = CASES) -> Dict[str, dict]:
    rounds = rounds or (3 if quick else 6)
    results: Dict[str, dict] = {}
    for workload in ("builtin", "script"):
        for workers in (2, 4):
            if f"{workload}_{workers}w" not in cases:
                continue
            samples: Dict[str, Dict[str, List[float]]] = {who: {"first": [], "wall": []} for who in ("ours", "torchrun")}
            for r in range(rounds):
                order = ("ours", "torchrun") if r % 2 == 0 else ("torchrun", "ours")
                for launcher in order:
                    first, wall = one_run(launcher, workload, workers)
                    samples[launcher]["first"].append(first)
                    samples[launcher]["wall"].append(wall)
            med = {who: {k: statistics.median(v) for k, v in s.items()} for who, s in samples.items()}
            results[f"startup_{workload}_{workers}w"] = {
                "ours_first_step_s": med["ours"]["first"], "torchrun_first_step_s": med["torchrun"]["first"],
                "ratio_first_step": med["ours"]["first"] / med["torchrun"]["first"],
                "ours_wall_s": med["ours"]["wall"], "torchrun_wall_s": med["torchrun"]["wall"],
                "ratio_wall": med["ours"]["wall"] / med["torchrun"]["wall"], "rounds": rounds,
            }
    return results


def print_table(results: Dict[str, dict]) -> None:
    print(f"{'case':<24}{'ours 1st':>10}{'torchrun 1st':>14}{'ratio':>8}{'ours wall':>11}{'torchrun wall':>15}{'ratio':>8}")
    for name, r in results.items():
        print(f"{name:<24}{r['ours_first_step_s']:>9.2f}s{r['torchrun_first_step_s']:>13.2f}s{r['ratio_first_step']:>8.2f}"
              f"{r['ours_wall_s']:>10.2f}s{r['torchrun_wall_s']:>14.2f}s{r['ratio_wall']:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 6")
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--case", action="append", choices=CASES, help="only these cases (repeatable; default: all)")
    args = parser.parse_args()
    results = run(args.quick, args.rounds, tuple(args.case or CASES))
    print_table(results)
    out = REPO / "bench" / "startup.json"
    if args.case:  # a partial run updates its cases only
        results = {**json.loads(out.read_text()), **results} if out.exists() else results
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
