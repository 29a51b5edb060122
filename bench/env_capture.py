"""Does recording the environment (launcher.provenance.capture) slow a run's start? Time to first step
with the record on and off (LAUNCHER_ENV_CAPTURE=0), alternating round by round, and the record's own
cost measured in-process (wall and CPU).

    python bench/env_capture.py [--rounds 4] [--gpus 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.provenance.capture import collect  # noqa: E402


def first_step_s(out: Path, run_id: str, gpus: int, capture: bool) -> Dict[str, float]:
    env = dict(os.environ, WANDB_MODE="disabled", LAUNCHER_ENV_CAPTURE="1" if capture else "0")
    cmd = [sys.executable, "-m", "launcher", "--gpus", str(gpus), "--config", str(REPO / "configs" / "quick.yaml"),
           f"output_dir={out}", f"run_id={run_id}", "wandb.mode=disabled"]
    subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=REPO)
    summary = json.loads((out / run_id / "summary.json").read_text())
    found = {"first_step_s": summary["time_to_first_step_s"], "wall_s": summary["wall_s"]}
    record = sorted((out / run_id / "env").glob("*.json")) if capture else []
    if capture:
        assert record, f"no env record in {out / run_id}"
        found["capture_s"] = json.loads(record[0].read_text())["capture_s"]
    return found


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--gpus", type=int, default=1)
    args = p.parse_args(argv)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    t0, c0 = time.perf_counter(), usage.ru_utime + usage.ru_stime
    collect(None, False, ["python", "-m", "launcher"], dict(os.environ))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"the record alone, in-process: {time.perf_counter() - t0:.2f} s wall, "
          f"{usage.ru_utime + usage.ru_stime - c0:.2f} s CPU")
    on: List[Dict[str, float]] = []
    off: List[Dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="env-capture-") as tmp:
        for i in range(args.rounds):
            order = [(True, on), (False, off)] if i % 2 == 0 else [(False, off), (True, on)]
            for capture, into in order:
                into.append(first_step_s(Path(tmp), f"r{i}-{int(capture)}", args.gpus, capture))
    med_on = statistics.median(r["first_step_s"] for r in on)
    med_off = statistics.median(r["first_step_s"] for r in off)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.rounds} rounds, {args.gpus} worker(s)")
    print(f"time to first step, record on:  median {med_on:.2f} s  {[round(r['first_step_s'], 2) for r in on]}")
    print(f"time to first step, record off: median {med_off:.2f} s  {[round(r['first_step_s'], 2) for r in off]}")
    print(f"ratio on/off {med_on / med_off:.3f}; the record took {statistics.median(r['capture_s'] for r in on):.2f} s "
          f"(median, in its background thread at nice 19)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
