"""Fault probe: each fault a user met, done to a real 2-worker job of the built-in trainer; survived or not, and
what was lost.

    python bench/fault_probe.py [--only NAME ...] [--json bench/fault_probe.json]

Faults (each in a fresh folder, the job's process group killed at the end whatever happened):
- worker-sigkill: a rank SIGKILLed mid-run, --max-restarts 1: the job should resume and complete.
- zygote-sigkill: the process that forks the workers SIGKILLed mid-run, --max-restarts 1: the same.
- launcher-sigkill: the launcher SIGKILLed (as an OOM killer does); a rank had started a `sleep` of its own:
  nothing of the job may be left running, and `resume` should complete the run.
- launcher-sigterm: SIGTERM to the launcher (a preemption): exit 143, then `resume` completes.
- rundir-deleted: the run directory removed mid-run: one line, exit 1, no launcher traceback.
- rundir-read-only: the run directory made read-only (a bind mount; root only): one line, exit 1; once
  writable, `resume` completes.
Survived = the outcome above; lost = the steps trained twice (recomputed since the last checkpoint) or what
could not be kept. Prints a table; writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import psutil

REPO = Path(__file__).resolve().parent.parent
STEPS = 3000
JOB = ["--gpus", "2", "model.hidden=64", "model.depth=2", "model.in_dim=32", "data.dataset_size=1024",
       "data.batch_size=16", f"trainer.steps={STEPS}", "trainer.log_every=100", "checkpoint.every_steps=100",
       "wandb.mode=disabled", "run_id=r"]
TIMEOUT_S = 240.0
CHILD_SCRIPT = REPO / "tests" / "scripts" / "children.py"


class Job:
    """One launch of ours in its own process group, in a fresh folder."""

    def __init__(self, where: Path, args: List[str], env: Optional[Dict[str, str]] = None) -> None:
        self.where, self.run_dir = where, where / "runs" / "r"
        self.proc = subprocess.Popen([sys.executable, "-m", "launcher", *args, f"output_dir={where / 'runs'}"],
                                     cwd=where, env={**os.environ, "WANDB_MODE": "disabled", **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.output = ""

    def wait_for(self, ready: Callable[[], bool], what: str, timeout: float = 150) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the job ended before {what}")
            time.sleep(0.1)
        raise RuntimeError(f"no {what} within {timeout:g}s")

    def checkpointed(self) -> bool:
        folder = self.run_dir / "checkpoints"
        return folder.is_dir() and any(p.name.startswith("step-") for p in folder.iterdir())

    def finish(self) -> int:
        try:
            self.output, _ = self.proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            self.output, _ = self.proc.communicate()
        return self.proc.returncode

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def descendants(self) -> List[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []


def summary(run_dir: Path) -> Dict[str, Any]:
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def one_line_end(output: str) -> bool:
    own = [line for line in output.splitlines() if line and not line.startswith("[rank")]
    return bool(own) and own[-1].startswith("error: ") and not any(line.startswith("Traceback") for line in own)


def resume(job: Job) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "launcher", "resume", str(job.run_dir)], cwd=job.where,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    return summary(job.run_dir) if done.returncode == 0 else {}


def recomputed(s: Dict[str, Any]) -> str:
    lost = (s.get("badput_s") or {}).get("recompute")
    return f"{s.get('resumed_from_step')} resumed; {lost:.1f}s recomputed" if lost is not None else "-"


def zygote(job: Job) -> psutil.Process:
    """The launcher's child that its workers fork from (forked at its start: launcher.prestart)."""
    return next(p for p in job.descendants() if p.ppid() == job.proc.pid and p.children()
                and any(part.endswith("bootstrap.py") for part in p.cmdline()))


def worker_sigkill(job: Job) -> Dict[str, Any]:
    job.wait_for(job.checkpointed, "checkpoint")
    worker = zygote(job).children()[0]
    worker.kill()
    code, s = job.finish(), summary(job.run_dir)
    return {"survived": code == 0 and s.get("steps") == STEPS, "exit": code, "lost": recomputed(s)}


def zygote_sigkill(job: Job) -> Dict[str, Any]:
    job.wait_for(job.checkpointed, "checkpoint")
    zygote(job).kill()
    code, s = job.finish(), summary(job.run_dir)
    return {"survived": code == 0 and s.get("steps") == STEPS, "exit": code, "lost": recomputed(s)}


def launcher_sigkill(job: Job) -> Dict[str, Any]:
    out = job.where / "out"
    job.wait_for(lambda: all((out / f"pids-{r}").is_file() for r in range(2)), "the ranks' own processes")
    pids = [int(p) for r in range(2) for p in (out / f"pids-{r}").read_text().split()]
    os.kill(job.proc.pid, signal.SIGKILL)
    code = job.finish()
    deadline = time.monotonic() + 15
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    for pid in left:  # the job's processes, by id
        os.kill(pid, signal.SIGKILL)
    return {"survived": not left, "exit": code, "lost": f"{len(left)} of {len(pids)} processes outlived it"}


def launcher_sigterm(job: Job) -> Dict[str, Any]:
    job.wait_for(job.checkpointed, "checkpoint")
    os.kill(job.proc.pid, signal.SIGTERM)
    code = job.finish()
    s = resume(job)
    return {"survived": code == 143 and s.get("steps") == STEPS, "exit": code, "lost": recomputed(s)}


def rundir_deleted(job: Job) -> Dict[str, Any]:
    job.wait_for(job.checkpointed, "checkpoint")
    shutil.rmtree(job.run_dir)
    code = job.finish()
    return {"survived": code == 1 and one_line_end(job.output), "exit": code, "lost": "the run (deleted)"}


def rundir_read_only(job: Job) -> Dict[str, Any]:
    job.wait_for(job.checkpointed, "checkpoint")
    path = str(job.run_dir)
    if subprocess.run(["mount", "--bind", path, path], capture_output=True).returncode != 0:
        job.kill()
        job.finish()
        return {"survived": None, "exit": None, "lost": "not run: a bind mount needs root"}
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True, capture_output=True)
        code = job.finish()
    finally:
        subprocess.run(["umount", path], capture_output=True)
    s = resume(job)
    return {"survived": code == 1 and one_line_end(job.output) and s.get("steps") == STEPS, "exit": code,
            "lost": recomputed(s)}


FAULTS = {
    "worker-sigkill": (worker_sigkill, ["--max-restarts", "1", *JOB], None),
    "zygote-sigkill": (zygote_sigkill, ["--max-restarts", "1", *JOB], None),
    "launcher-sigkill": (launcher_sigkill, ["--gpus", "2", "run_id=r", "wandb.mode=disabled", str(CHILD_SCRIPT)], "out"),
    "launcher-sigterm": (launcher_sigterm, JOB, None),
    "rundir-deleted": (rundir_deleted, JOB, None),
    "rundir-read-only": (rundir_read_only, JOB, None),
}


def probe(name: str) -> Dict[str, Any]:
    fault, args, out = FAULTS[name]
    with tempfile.TemporaryDirectory(prefix="fault-") as tmp:
        where = Path(tmp)
        if out:
            (where / out).mkdir()
            args = [*args, str(where / out)]
        job = Job(where, args)
        started = time.monotonic()
        try:
            result = fault(job)
        except (RuntimeError, StopIteration) as e:
            result = {"survived": False, "exit": job.proc.poll(), "lost": f"probe failed: {e}"}
        finally:
            job.kill()
            job.proc.wait()
        return {"fault": name, "seconds": round(time.monotonic() - started, 1), **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FAULTS), default=list(FAULTS))
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "fault_probe.json")
    args = parser.parse_args()
    results = []
    for name in args.only:
        results.append(probe(name))
        print(f"{name}: {results[-1]}", file=sys.stderr, flush=True)
    print(f"\n{'fault':<18} {'survived':<9} {'exit':<5} lost")
    for r in results:
        verdict = {True: "yes", False: "NO", None: "skipped"}[r["survived"]]
        print(f"{r['fault']:<18} {verdict:<9} {str(r['exit']):<5} {r['lost']}")
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["survived"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
