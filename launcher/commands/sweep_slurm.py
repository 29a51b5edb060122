"""A sweep on SLURM: its members as one job array (launcher.backends.slurm.array), and, with --wait,
following the array until every task has ended."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.backends.slurm.array import submit_array
from launcher.backends.slurm.records import FINAL_STATES, job_state
from launcher.commands.sweep_plan import write_sweep
from launcher.commands.sweep_queue import member_result, report
from launcher.config.schema import Config
from launcher.runtime.schema import Status

POLL_S = 2.0


def run_array(sweep: Dict[str, Any], sweep_dir: Path, members: List[Tuple[Dict[str, Any], Config]], parallel: int,
              wait: bool, timeout_s: Optional[float] = None) -> int:
    """Submit the members as one array; with wait, follow it: 0 when every member of the sweep completed."""
    cfgs = [cfg for _, cfg in members]
    ids = submit_array(cfgs, sweep_dir / "slurm", parallel, f"launcher-{sweep['sweep_id']}")
    array_id = ids[0].split("_")[0]
    for (member, _), job_id in zip(members, ids):
        member["status"] = Status.RUNNING  # in SLURM's hands: queued or running
        member["job_id"] = job_id
    sweep["slurm_job_id"] = array_id
    write_sweep(sweep_dir, sweep)
    quoted = shlex.quote(str(sweep_dir))
    print(f"submitted SLURM job array {array_id}: {len(ids)} members, {parallel} at a time; sweep folder {sweep_dir}\n"
          f"  follow: python -m launcher status {quoted}/MEMBER   |   python -m launcher logs {quoted}/MEMBER"
          f"   |   scancel {array_id}", flush=True)
    if not wait:
        return 0
    return follow(sweep, sweep_dir, [m for m, _ in members], timeout_s)


def follow(sweep: Dict[str, Any], sweep_dir: Path, members: List[Dict[str, Any]], timeout_s: Optional[float]) -> int:
    """Poll each member's array task until all have ended; record how each ended in sweep.json."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    seen: Dict[str, str] = {}
    waiting = list(members)
    while waiting:
        for member in list(waiting):
            state = job_state(member["job_id"])
            if state != seen.get(member["job_id"]):  # UNKNOWN: sacct has no record of the task yet
                shown = "queued" if state == "UNKNOWN" else state
                print(f"sweep: {member['run_dir']} (SLURM {member['job_id']}): {shown}", file=sys.stderr, flush=True)
                seen[member["job_id"]] = state
            if state in FINAL_STATES:
                ok = state == "COMPLETED" and member_result(sweep_dir, member).get("status") == Status.COMPLETED
                member["status"] = Status.COMPLETED if ok else Status.FAILED
                waiting.remove(member)
                write_sweep(sweep_dir, sweep)
        if deadline is not None and time.monotonic() > deadline:
            print(f"sweep: {len(waiting)} member(s) still in SLURM after {timeout_s:.0f}s; they go on", file=sys.stderr)
            return 1
        if waiting:
            time.sleep(POLL_S)
    return report(sweep, sweep_dir)
