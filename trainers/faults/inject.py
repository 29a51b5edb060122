"""Fault injection for tests: LAUNCHER_INJECT_FAULT=rank=R,step=S[,attempt=A][,action=raise|hang|slow][;...],
and LAUNCHER_TEST_SAVE_DELAY_S=SECONDS[,step=S]: in restart attempt 0, a checkpoint save (of step S only, if
given) waits that long with its files written but not yet published, and says so, so a test can kill it mid-write.

At step S of restart attempt A (default 0 only, so a restarted job goes on), rank R raises
(action=raise, the default) or stops making progress forever (action=hang: it prints a line and
sleeps, so a test can kill it or a watchdog can catch it at a known point). With action=slow, rank R
sleeps SLOW_STEP_S in every step from S on (a slow rank that uses no CPU, still stopping at step
boundaries), so a job outlasts a signal that a test sends it at a time the machine's load cannot move.
An attempt counts the launcher's attempts (LAUNCHER_ATTEMPT: restarts and elastic membership changes) and SLURM's
requeues (a requeued job's agent starts again at 0).
An environment variable rather than a config key: it is not part of a job's recorded config. A Ray job's node
agents get it through the job's runtime_env (launcher.backends.ray.job.forwarded_env); a Ray job re-placed after a
lost node starts new agents, whose attempts count from 0 again.
"""

from __future__ import annotations

import os
import time
from typing import Optional, TypedDict

from launcher.runtime import env

ENV = env.INJECT_FAULT
SAVE_DELAY_ENV = env.TEST_SAVE_DELAY_S
ACTIONS = ("raise", "hang", "slow")
SLOW_STEP_S = 1.0


class InjectedFault(RuntimeError):
    """Raised on purpose by a test; never in a normal run."""


class Fault(TypedDict):
    rank: int
    step: int
    attempt: int
    action: str  # one of ACTIONS


def parse(text: str) -> Fault:
    fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    action = fields.get("action", "raise")
    if action not in ACTIONS:
        raise ValueError(f"{ENV}: action={action} is not one of {', '.join(ACTIONS)}")
    return {"rank": int(fields["rank"]), "step": int(fields["step"]), "attempt": int(fields.get("attempt", 0)), "action": action}


def maybe_fail(rank: int, step: int, attempt: int, spec: Optional[str] = None) -> None:
    spec = os.environ.get(ENV) if spec is None else spec
    if not spec:
        return
    attempt += int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    faults = [parse(part) for part in spec.split(";") if part.strip()]
    if any(f["action"] == "slow" and (f["rank"], f["attempt"]) == (rank, attempt) and step >= f["step"] for f in faults):
        time.sleep(SLOW_STEP_S)
    fault = next((f for f in faults if f["action"] != "slow" and (f["rank"], f["step"], f["attempt"]) == (rank, step, attempt)), None)
    if fault is None:
        return
    if fault["action"] == "hang":
        print(f"injected hang on rank {rank} at step {step} (attempt {attempt}), pid {os.getpid()}", flush=True)
        while True:
            time.sleep(3600)
    raise InjectedFault(f"injected fault on rank {rank} at step {step} (attempt {attempt})")


def maybe_delay_save(rank: int, step: int) -> None:
    spec = os.environ.get(SAVE_DELAY_ENV)
    if not spec:
        return
    seconds, *rest = spec.split(",")
    only = dict(item.split("=", 1) for item in rest if "=" in item).get("step")
    if (only is not None and int(only) != step) or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    print(f"save of step {step} delayed {seconds}s before publishing on rank {rank}, pid {os.getpid()}", flush=True)
    time.sleep(float(seconds))
