"""Who owns a run directory: one flock per node slot (<run_dir>/locks/node-K.lock), held for the job's life.

Several launchers share one run directory legitimately: the nodes of one multi-node job. So a
launcher locks only its own node slots (node rank K; every slot for a simulated job, whose nodes
are its children; the first free one for c10d, where ranks come on arrival) and writes its host,
pid and job key (mode, rendezvous endpoint, node count) into the lock file. A launcher whose slot
is held, or that meets a live holder of another job, is refused and told who holds it. A new
launch into a directory that already holds a finished or stopped run is refused too (only
`resume` and a SLURM requeue continue a run): plan.json older than every live holder's lock
file means no launcher of this job wrote it. flock ends with the process, so a lock file left by
a dead launcher is free again; the kernel (and NFS, which maps flock to its own locks) decide.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Set

from launcher.errors import ConfigError
from launcher.plan import LaunchPlan
from launcher.runtime import safefs

LOCK_DIR = "locks"
RECORD_WAIT_S = 3.0  # how long a reader waits for a held lock's record to be written (its holder just created it)


@dataclass(frozen=True)
class Holder:
    """A live launcher holding a slot, as its lock file says."""

    slot: int
    host: str
    pid: int
    job: str
    locked_at: float  # the lock file's mtime: the file system's clock, the same one plan.json's mtime uses

    def describe(self) -> str:
        return f"the launcher on host {self.host}, pid {self.pid}"


class RunLock:
    """The node slots this launcher holds in one run directory; release() (or this process's end) frees them."""

    def __init__(self, run_dir: Path, fds: Dict[int, int]) -> None:
        self.run_dir, self.fds = run_dir, fds

    def release(self) -> None:
        for fd in self.fds.values():
            os.close(fd)  # closing the only descriptor drops the flock
        self.fds = {}


def job_key(plan: LaunchPlan) -> str:
    """What the nodes of one job have alike, and another launch into the same directory does not."""
    return f"{plan.mode} {plan.rdzv_endpoint} nodes={plan.nodes}"


def check_not_a_finished_run(plan: LaunchPlan) -> None:
    """Refuse a new launch into a directory that holds an earlier run; reads only, so a refusal changes nothing."""
    run_dir = Path(plan.run_dir)
    plan_file = run_dir / "plan.json"
    if not plan_file.is_file():
        return
    written = plan_file.stat().st_mtime
    mine = job_key(plan)
    if any(h.job == mine and h.locked_at <= written for h in live_holders(run_dir)):
        return  # another node of this job, started before it wrote plan.json
    raise existing_run(run_dir, plan.run_id, plan.mode in ("static", "c10d"))


def check_can_take(plan: LaunchPlan) -> None:
    """Before anything starts (reads only): a new launch of a one-machine job into a run directory another launcher
    holds, or that holds an earlier run, is refused now, before torch loads; claim() and check_not_a_finished_run
    still decide for every job when it makes its run directory (the nodes of a multi-machine job meet first)."""
    if plan.mode not in ("single", "simulated"):
        return
    holders = live_holders(Path(plan.run_dir))
    if holders:
        raise _in_use(plan, holders)
    check_not_a_finished_run(plan)


def existing_run(run_dir: Path, run_id: str, multinode: bool = False) -> ConfigError:
    """The refusal of a new run whose run_id names an earlier run: only `resume` continues one."""
    return ConfigError(f"run_id={run_id} already names a run in {run_dir}: continue it with "
                       f"`python -m launcher resume {run_dir}`, or start a new run with another run_id=ID"
                       f"{' (or --rdzv-id ID)' if multinode else ''}")


def claim(plan: LaunchPlan) -> RunLock:
    """Lock this launcher's node slots in the run directory, or say who holds them (exit 2)."""
    run_dir = Path(plan.run_dir)
    safefs.make_dirs(str(run_dir / LOCK_DIR), root=str(run_dir))
    record = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job": job_key(plan), "run_id": plan.run_id})
    wanted = _slots(plan)
    fds: Dict[int, int] = {}
    try:
        for slot in wanted:
            fd = _try_lock(_lock_path(run_dir, slot))
            if fd is None and plan.mode == "c10d":
                continue  # another node of a c10d job: take the next slot
            if fd is None:
                raise _in_use(plan, [h for h in live_holders(run_dir) if h.slot == slot])
            _write_record(fd, record)
            fds[slot] = fd
            if plan.mode == "c10d":
                break
        if not fds:
            raise _in_use(plan, live_holders(run_dir))
        others = [h for h in live_holders(run_dir, skip=set(fds)) if h.job != job_key(plan)]
        if others:
            raise _in_use(plan, others)
    except BaseException:
        RunLock(run_dir, fds).release()
        raise
    return RunLock(run_dir, fds)


def claim_folder(folder: Path, job: str, name: str) -> Optional[RunLock]:
    """Slot 0 of a folder that one process runs as a whole (a sweep's runner), or None while another holds it.

    The same lock file and record as a run's, so live_holders (and `ls`) see the folder's runner."""
    safefs.make_dirs(str(folder / LOCK_DIR), root=str(folder))
    fd = _try_lock(_lock_path(folder, 0))
    if fd is None:
        return None
    _write_record(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "job": job, "run_id": name}))
    return RunLock(folder, {0: fd})


def live_holders(run_dir: Path, skip: Optional[Set[int]] = None) -> List[Holder]:
    """The launchers that hold a slot now. A lock file nobody holds (its launcher died or ended) is skipped."""
    folder = run_dir / LOCK_DIR
    found: List[Holder] = []
    for path in sorted(folder.glob("node-*.lock")) if folder.is_dir() else []:
        slot = int(path.stem.split("-", 1)[1])
        if skip and slot in skip:
            continue
        holder = _holder_if_held(path, slot)
        if holder is not None:
            found.append(holder)
    return found


def _slots(plan: LaunchPlan) -> List[int]:
    if plan.mode == "simulated":
        return list(range(plan.agents))  # its nodes (and spares) are its own children: it speaks for all of them
    if plan.mode == "static":
        return [plan.node_rank or 0]
    if plan.mode == "c10d":
        return list(range(plan.nodes))  # the first free one
    return [0]


def _lock_path(run_dir: Path, slot: int) -> Path:
    return run_dir / LOCK_DIR / f"node-{slot}.lock"


def _try_lock(path: Path) -> Optional[int]:
    fd = safefs.open_fd(str(path), os.O_RDWR | os.O_CREAT, 0o644, root=str(path.parent.parent))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


RECORD_BYTES = 1024  # every record is padded to this: rewriting one never leaves it empty or half old, half new


def _write_record(fd: int, record: str) -> None:
    """One write of a fixed-size record: no truncate-then-write window in which another launcher reads an empty
    lock file (a requeued SLURM job's nodes claim their slots at the same moment, and node 0 took node 1's
    emptied record for a foreign job's: "in use by the launcher on host ?, pid 0")."""
    data = record.encode()[:RECORD_BYTES - 1]
    os.pwrite(fd, data + b" " * (RECORD_BYTES - 1 - len(data)) + b"\n", 0)
    os.ftruncate(fd, RECORD_BYTES)  # a record of an older, longer format: cut its tail
    os.fsync(fd)


def _holder_if_held(path: Path, slot: int) -> Optional[Holder]:
    """Probe without taking it for long: a free lock is released at once, a held one is read."""
    try:
        fd = safefs.open_fd(str(path), os.O_RDONLY, root=str(path.parent.parent))
    except OSError:  # gone, or a link planted there (safefs.PlantedLinkError): no holder
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None  # nobody holds it
        except BlockingIOError:
            pass
        data = _read_record(fd)
        return Holder(slot, str(data.get("host", "?")), int(data.get("pid", 0)), str(data.get("job", "")),
                      os.fstat(fd).st_mtime)
    finally:
        os.close(fd)


def _read_record(fd: int) -> Dict[str, Any]:
    """A held lock's record. Empty only between its holder's O_CREAT and its first write: wait for that
    (bounded) rather than take the holder for another job's launcher."""
    deadline = time.monotonic() + RECORD_WAIT_S
    while True:
        try:
            data = json.loads(os.pread(fd, 2 * RECORD_BYTES, 0).decode() or "{}")
        except ValueError:
            data = {}
        if (isinstance(data, dict) and data.get("job")) or time.monotonic() > deadline:
            return data if isinstance(data, dict) else {}
        time.sleep(0.05)


def _in_use(plan: LaunchPlan, holders: List[Holder]) -> ConfigError:
    who = "; ".join(sorted({h.describe() for h in holders})) or "another launcher"
    return ConfigError(f"run directory {plan.run_dir} is in use by {who}: wait for that run to end "
                       f"(or stop it), or start this one with another run_id=ID")
