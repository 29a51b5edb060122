"""Goodput under failures: the same job, the same seeded kills, four checkpoint settings.

    python bench/goodput.py [--steps N] [--mtbf S] [--seed K] [--workers W] [--quick]

Trains the default model for --steps steps with --workers CPU workers, first uninterrupted (the
reference checksum, and the throughput every variant is compared with), then once per variant
while this script SIGKILLs a worker at seeded random times (exponential gaps, mean --mtbf s
from the launch; the same times and ranks for every variant; a kill that falls in a restart
waits for the rank's next worker). Variants:

  sync-300s   the old default: synchronous saves every 300 s (so none in a short run)
  sync-50     synchronous saves every 50 steps
  async-50    saves every 50 steps, written in the background
  auto        checkpoint.every_steps=auto, with checkpoint.mtbf_s set to --mtbf

Prints, per variant: wall time, goodput and its largest losses (from summary.json), restarts, and
whether the final parameters equal the reference's. Ratios only; absolute seconds depend on
the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import psutil

REPO = Path(__file__).resolve().parent.parent

VARIANTS: Dict[str, List[str]] = {
    "sync-300s": ["checkpoint.every_seconds=300", "checkpoint.every_steps=0"],
    "sync-50": ["checkpoint.every_seconds=0", "checkpoint.every_steps=50"],
    "async-50": ["checkpoint.every_seconds=0", "checkpoint.every_steps=50", "checkpoint.async_save=true"],
    "auto": ["checkpoint.every_seconds=0", "checkpoint.every_steps=auto"],
}


def kill_schedule(seed: int, mtbf: float, horizon: float, workers: int) -> List[Tuple[float, int]]:
    """(seconds after launch, rank) pairs: exponential gaps with mean mtbf, up to horizon."""
    rng, at, kills = random.Random(seed), 0.0, []
    while True:
        at += rng.expovariate(1.0 / mtbf)
        if at >= horizon:
            return kills
        kills.append((at, rng.randrange(workers)))


def worker_of_rank(launcher: psutil.Process, run_dir: Path, rank: int, killed: Set[int]) -> Optional[int]:
    """The pid of rank's live worker in the newest attempt: from the line each rank prints when it starts
    ("rank 1/2 (node 0, local rank 1, pid 123) ...", logs/rank-1.log then rank-1.attempt-K.log), checked
    against the launcher's live descendants (warm-forked workers carry no RANK in /proc/PID/environ)."""
    logs = [run_dir / "logs" / f"rank-{rank}.log",
            *sorted(run_dir.glob(f"logs/rank-{rank}.attempt-*.log"), key=lambda p: int(p.name.split("-")[-1][:-4]))]
    pids = [int(found.group(1)) for log in logs if log.is_file()
            for found in re.finditer(rf"^rank {rank}/\d+ \(.*pid (\d+)\)", log.read_text(errors="replace"), re.M)]
    if not pids:
        return None
    alive = {p.pid for p in launcher.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE}
    return pids[-1] if pids[-1] in alive and pids[-1] not in killed else None  # a killed one may not be reaped yet


def run(args: argparse.Namespace, out: Path, name: str, extra: List[str], kills: List[Tuple[float, int]]) -> Dict:
    cmd = [sys.executable, "-m", "launcher", "--gpus", str(args.workers), f"trainer.steps={args.steps}",
           f"output_dir={out}", f"run_id={name}", "--max-restarts", str(len(kills) + 2), "wandb.mode=disabled",
           f"checkpoint.mtbf_s={args.mtbf}", "trainer.log_every=100", *extra]
    env = dict(os.environ)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    launcher, killed = psutil.Process(proc.pid), set()
    try:
        for at, rank in kills:
            while proc.poll() is None and time.monotonic() - started < at:
                time.sleep(0.05)
            victim = None
            while proc.poll() is None and victim is None:
                try:
                    victim = worker_of_rank(launcher, out / name, rank, killed)
                except psutil.NoSuchProcess:
                    victim = None
                time.sleep(0.05 if victim is None else 0)
            if victim is None:
                break
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
        _, err = proc.communicate(timeout=args.timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - started
    summary_path = out / name / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if proc.returncode != 0:
        print(f"  {name}: exit {proc.returncode}: {err.strip().splitlines()[-1] if err.strip() else ''}", flush=True)
    return {"wall": wall, "kills": len(killed), "rc": proc.returncode, **summary}


def describe(name: str, result: Dict, reference: Dict) -> str:
    losses = sorted(((s, c) for c, s in (result.get("badput_s") or {}).items() if s >= 0.05), reverse=True)[:3]
    lost = ", ".join(f"{c} {s:.1f}s" for s, c in losses)
    same = result.get("param_checksums") == reference.get("param_checksums")
    speed = (result.get("samples_per_s") or 0) / (reference.get("samples_per_s") or 1)
    goodput = result.get("goodput")
    return (f"{name:10s} wall {result['wall']:6.1f}s  goodput {goodput if goodput is None else f'{goodput:.0%}':>4}  "
            f"kills {result['kills']}  restarts {result.get('restarts')}  steady samples/s vs reference "
            f"{speed:.2f}  same parameters as uninterrupted: {'yes' if same else 'NO'}  lost: {lost}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--mtbf", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--quick", action="store_true", help="600 steps, mean 8 s between kills")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.mtbf = 600, 8.0
    with tempfile.TemporaryDirectory(prefix="bench-goodput-") as tmp:
        root = Path(tmp)
        reference = run(args, root, "reference", VARIANTS["sync-50"], [])
        assert reference["rc"] == 0, "the uninterrupted reference run failed"
        kills = kill_schedule(args.seed, args.mtbf, 0.9 * reference["wall"], args.workers)
        print(f"reference: {args.steps} steps in {reference['wall']:.1f}s, goodput {reference['goodput']:.0%}; "
              f"kills at {', '.join(f'{t:.0f}s (rank {r})' for t, r in kills) or 'none'}", flush=True)
        results = {name: run(args, root, name, extra, kills) for name, extra in VARIANTS.items()}
        for name, result in results.items():
            print(describe(name, result, reference), flush=True)
        best = max(results, key=lambda n: results[n].get("goodput") or 0)
        print(f"best: {best}, goodput {results[best].get('goodput') or 0:.0%} with {results[best]['kills']} kills "
              f"(target >= 90%)")
        return 0 if all(r.get("param_checksums") == reference.get("param_checksums") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
