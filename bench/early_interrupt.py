"""Early Ctrl-C stress: SIGINT at a random moment of a run's first 1.5 s, many times, outcomes counted.

    python bench/early_interrupt.py [--launches 40] [--max-delay 1.5] [--shape trainer|script|both]
                                    [--group] [--seed 0] [--json bench/early_interrupt.json]

A launch is clean when it exits 130, prints "interrupted" in one line with no traceback, and leaves
no process of its group alive; anything else is a bug, printed with the delay and the output tail.
--group signals the whole process group (what a terminal's Ctrl-C does) instead of the launcher alone.
Each launch runs in its own session, bounded by --timeout, and is killed by group.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import QUICK, descendants, group_processes, launcher_env, wait_gone  # noqa: E402  (after the sys.path line, on purpose)

SHAPES: Dict[str, List[str]] = {
    "trainer": ["--gpus", "2", "trainer.steps=300", *QUICK],
    "script": ["--gpus", "2", str(REPO / "tests" / "scripts" / "stress_ddp_tutorial.py")],
}


@dataclass
class Outcome:
    shape: str
    delay_s: float
    code: int
    verdict: str  # clean | bug: <why>
    tail: str


def launch_once(shape: str, delay: float, group: bool, timeout: float) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="early-int-") as tmp:
        argv = [sys.executable, "-m", "launcher", f"output_dir={tmp}/runs", *SHAPES[shape]]
        if shape == "script":
            argv.append(f"{tmp}/out")
        proc = subprocess.Popen(argv, cwd=tmp, env=launcher_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        time.sleep(delay)
        started = descendants(proc.pid)  # workers lead their own process groups, outside the launcher's
        try:
            if group:
                os.killpg(proc.pid, signal.SIGINT)
            else:
                proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return Outcome(shape, delay, -1, "bug: hung", out[-600:])
        left = wait_gone(group_processes(proc.pid) + started, timeout=2)  # PR_SET_PDEATHSIG kills are asynchronous
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        return Outcome(shape, delay, proc.returncode, judge(proc.returncode, out, len(left)), out[-600:])


def judge(code: int, out: str, left: int) -> str:
    if code != 130:
        return f"bug: exit {code}"
    if "Traceback" in out:
        return "bug: traceback"
    if "interrupted" not in out:
        return "bug: no 'interrupted' line"
    if left:
        return f"bug: {left} process(es) left"
    return "clean"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=40)
    p.add_argument("--max-delay", type=float, default=1.5)
    p.add_argument("--shape", choices=("trainer", "script", "both"), default="both")
    p.add_argument("--group", action="store_true", help="signal the process group, as a terminal's Ctrl-C does")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="")
    args = p.parse_args()
    rng = random.Random(args.seed)
    shapes = ["trainer", "script"] if args.shape == "both" else [args.shape]
    outcomes = []
    for i in range(args.launches):
        delay = args.max_delay * i / max(1, args.launches - 1)  # spread over the window, then shuffled per shape
        delay = min(args.max_delay, max(0.0, delay + rng.uniform(-0.02, 0.02)))
        o = launch_once(shapes[i % len(shapes)], delay, args.group, args.timeout)
        outcomes.append(o)
        print(f"{i:3d} {o.shape:7s} delay {o.delay_s:.2f}s exit {o.code:4d} {o.verdict}", flush=True)
        if o.verdict != "clean":
            print("    | " + o.tail.replace("\n", "\n    | "), flush=True)
    bugs = [o for o in outcomes if o.verdict != "clean"]
    print(f"{len(outcomes)} launches, {len(outcomes) - len(bugs)} clean, {len(bugs)} bugs")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=2) + "\n")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
