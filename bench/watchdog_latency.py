"""How long after a rank hangs the launcher has explained it and exited, relative to watchdog.timeout_s,
and what the heartbeats cost a training step (steps/s with the watchdog on vs off).

A built-in trainer job with rank 1 hanging at step 5 (LAUNCHER_TEST_HANG_RANK); the hang moment is
when rank 1's log says so, the end is the launcher's exit.
    python bench/watchdog_latency.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent
QUICK = ["model.hidden=64", "model.depth=2", "model.in_dim=32", "data.dataset_size=1024", "data.batch_size=16",
         "wandb.mode=disabled"]


def hang_latency(timeout_s: float) -> float:
    """Seconds from the hang to the launcher's exit, for one job."""
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, LAUNCHER_TEST_HANG_RANK="1", LAUNCHER_TEST_HANG_STEP="5")
        cmd = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={out}", f"watchdog.timeout_s={timeout_s}",
               "trainer.steps=100000", *QUICK]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        hung_at = None
        while proc.poll() is None:
            if hung_at is None:
                logs = list(Path(out).glob("*/logs/rank-1.log"))
                if logs and "hanging at step" in logs[0].read_text(errors="replace"):
                    hung_at = time.monotonic()
            time.sleep(0.02)
        assert proc.returncode == 1 and hung_at is not None, "the job did not end as a caught hang"
        return time.monotonic() - hung_at


def samples_per_s(watchdog_s: float) -> float:
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ)
        cmd = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={out}", f"watchdog.timeout_s={watchdog_s}",
               "trainer.steps=400", *QUICK]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
        summary = json.loads(next(Path(out).glob("*/summary.json")).read_text())
        return float(summary["samples_per_s"])


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    for timeout_s in (3.0, 6.0):
        times = [hang_latency(timeout_s) for _ in range(args.rounds)]
        median = statistics.median(times)
        print(f"timeout {timeout_s:g}s: hang -> exit median {median:.2f}s (ratio to timeout {median / timeout_s:.2f}, "
              f"beyond it {median - timeout_s:.2f}s); runs {', '.join(f'{t:.2f}' for t in times)}")
    on, off = [], []
    for _ in range(args.rounds):  # interleaved, so load changes hit both alike
        on.append(samples_per_s(300))
        off.append(samples_per_s(0))
    print(f"samples/s with watchdog {statistics.median(on):.0f}, without {statistics.median(off):.0f} "
          f"(ratio on/off {statistics.median(on) / statistics.median(off):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
