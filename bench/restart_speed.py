"""Fast restarts: seconds from a worker's failure to the first step of the resumed attempt, ours vs torchrun.

The built-in trainer runs on 2 CPU workers with --max-restarts 1; rank 1 raises at step 200
(LAUNCHER_INJECT_FAULT), the job restarts and resumes from its newest checkpoint. Each line of the
job's output is timed as it arrives: failure = the injected fault's line, resumed = the trainer's
"resumed from" line, first step = the next step line. Rounds alternate ours and torchrun (the same
trainer under `torchrun -m launcher.trainers.train`, its checkpoints in a fresh directory).

    python bench/restart_speed.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional, Tuple

COMMON = ["trainer.steps=400", "trainer.log_every=1", "wandb.mode=disabled"]
TIMEOUT_S = 180.0  # a job that has not ended by then hung (killed: exit code -9)


def kill_tree(pid: int) -> None:
    """The launch's process group and every descendant: torchrun's workers lead sessions of their own, and one
    left alive holds the output pipe open (this bench then waited for ever)."""
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def timed_restart(cmd: List[str], cwd: str) -> Tuple[Optional[float], Optional[float], int]:
    """(failure -> resumed line, failure -> first resumed step) in seconds, None where not seen; the exit code."""
    env = dict(os.environ, LAUNCHER_INJECT_FAULT="rank=1,step=200", WANDB_MODE="disabled")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
                            start_new_session=True)
    fault = resumed = step = None
    # torchrun's restarted workers can hang on the dead attempt's store (pytorch#135712): bounded, then killed
    timer = threading.Timer(TIMEOUT_S, kill_tree, (proc.pid,))
    timer.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        now = time.time()
        if fault is None and "injected fault" in line:
            fault = now
        elif fault is not None and resumed is None and "resumed from" in line:
            resumed = now
        elif resumed is not None and step is None and re.search(r"step \d+/", line):
            step = now
    code = proc.wait()
    timer.cancel()
    return (resumed - fault if resumed and fault else None), (step - fault if step and fault else None), code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    ours: List[float] = []
    theirs: List[float] = []
    failed = {"ours": 0, "torchrun": 0}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            cmds = {
                "ours": [sys.executable, "-m", "launcher", "--gpus", "2", "--max-restarts", "1", f"output_dir={tmp}/runs", *COMMON],
                "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
                             "-m", "launcher.trainers.train", f"checkpoint.dir={tmp}/torchrun-{r}", *COMMON],
            }
            for name in (("ours", "torchrun") if r % 2 == 0 else ("torchrun", "ours")):
                _, to_step, code = timed_restart(cmds[name], tmp)
                if to_step is not None and code == 0:
                    (ours if name == "ours" else theirs).append(to_step)
                else:
                    failed[name] += 1
                said = f"{to_step:.2f} s" if to_step is not None else "never"
                print(f"round {r + 1} {name:<9} failure -> first resumed step {said}, exit code {code}", flush=True)
    if ours and theirs:
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"median failure -> first resumed step: ours {a:.2f} s, torchrun {b:.2f} s, ratio {a / b:.2f}")
    print(f"jobs that did not finish after the restart: ours {failed['ours']} of {args.rounds}, "
          f"torchrun {failed['torchrun']} of {args.rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
