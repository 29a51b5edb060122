"""A sweep's members run here: a queue of child launchers, N at a time, each an ordinary run.

A member that fails does not stop the others. Ctrl-C (or SIGTERM/SIGHUP) is forwarded to the
running members' own launchers, which stop their workers cleanly; the sweep waits for them, and
sweep.json says which members are unfinished (`python -m launcher resume SWEEP` runs those).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, AbstractSet, Any, Dict, Iterator, List, Optional

from launcher.commands import table
from launcher.commands.children import last_line, launcher_command
from launcher.commands.sweep_cores import CoreSlots
from launcher.commands.sweep_plan import member_argv, write_sweep
from launcher.errors import ConfigError
from launcher.rundir import read_json
from launcher.runlock import claim_folder, live_holders
from launcher.runtime import formatting
from launcher.runtime.schema import Status
from launcher.usage import build_parser, split_argv

STOP_WAIT_S = 60.0  # a launcher stops its workers within 15 s of Ctrl-C (checkpoint.grace_s <= 12)


@contextlib.contextmanager
def hold_sweep(sweep_dir: Path) -> Iterator[None]:
    """This process runs the sweep: its lock (launcher.runlock, so `ls` sees the sweep running), dropped however it ends."""
    lock = claim_folder(sweep_dir, "sweep", sweep_dir.name)
    if lock is None:
        who = "; ".join(sorted({h.describe() for h in live_holders(sweep_dir)})) or "another process"
        raise ConfigError(f"sweep {sweep_dir} is being run by {who}: wait for it to end (or stop it), then resume it")
    try:
        yield
    finally:
        lock.release()


def member_result(sweep_dir: Path, member: Dict[str, Any]) -> Dict[str, Any]:
    """The member run's summary.json, or {} while it has none."""
    path = sweep_dir / member["run_dir"] / "summary.json"
    try:
        return dict(read_json(path)) if path.is_file() else {}
    except (OSError, ValueError):
        return {}


def archive_member(sweep_dir: Path, member: Dict[str, Any]) -> None:
    """Move a member's earlier attempt (run directory and console log) to previous/<name>-<n>, to run it afresh."""
    run_dir, log = sweep_dir / member["run_dir"], console_log(sweep_dir, member)
    if not run_dir.exists() and not log.exists():
        return
    previous = sweep_dir / "previous"
    previous.mkdir(exist_ok=True)
    n = 1 + sum(1 for p in previous.glob(f"{member['run_dir']}-*") if p.is_dir())
    target = previous / f"{member['run_dir']}-{n}"
    if run_dir.exists():
        run_dir.rename(target)
    if log.exists():
        log.rename(previous / f"{member['run_dir']}-{n}.log")


def console_log(sweep_dir: Path, member: Dict[str, Any]) -> Path:
    return sweep_dir / "logs" / f"{member['run_dir']}.log"


@dataclass
class Running:
    member: Dict[str, Any]
    proc: subprocess.Popen
    log: IO[str]
    started: float
    slot: Optional[int] = None  # its slice of the cores (launcher.commands.sweep_cores)


def run_members(sweep: Dict[str, Any], sweep_dir: Path, todo: List[int], parallel: int,
                continuing: AbstractSet[int] = frozenset()) -> int:
    """Run the members in todo, parallel at a time; 0 when every member of the sweep has completed.

    continuing: members that continue their stopped run from its checkpoint (`resume MEMBER`) rather than start."""
    split = split_argv(sweep["base_args"], build_parser())
    queue = [sweep["members"][i] for i in todo]
    running: List[Running] = []
    slots = CoreSlots(min(parallel, len(queue)))
    try:
        while queue or running:
            while queue and len(running) < parallel:
                member = queue.pop(0)
                args = (["resume", str(sweep_dir / member["run_dir"])] if member["index"] in continuing
                        else member_argv(split, member, sweep_dir))
                running.append(start_member(sweep_dir, member, args, slots))
                write_sweep(sweep_dir, sweep)
            for item in [r for r in running if r.proc.poll() is not None]:
                running.remove(item)
                slots.give_back(item.slot)
                finish_member(sweep_dir, item)
                write_sweep(sweep_dir, sweep)
            time.sleep(0.2)
    except KeyboardInterrupt as e:
        stop_members(running, int(getattr(e, "sigval", signal.SIGINT)))
        for item in running:
            finish_member(sweep_dir, item, interrupted=True)
        write_sweep(sweep_dir, sweep)
        left = [m["run_dir"] for m in sweep["members"] if m["status"] != Status.COMPLETED]
        print(f"sweep {sweep['sweep_id']}: stopped; {len(left)} member(s) unfinished; "
              f"`python -m launcher resume {sweep_dir}` runs them", file=sys.stderr, flush=True)
        raise
    return report(sweep, sweep_dir)


def report(sweep: Dict[str, Any], sweep_dir: Path) -> int:
    """The members' table and one line; the sweep's exit code: 0 when every member completed."""
    print_table(sweep, sweep_dir)
    failed = [m for m in sweep["members"] if m["status"] != Status.COMPLETED]
    print(f"sweep {sweep['sweep_id']}: {len(sweep['members']) - len(failed)}/{len(sweep['members'])} members completed"
          + (f"; re-run the others with `python -m launcher resume {sweep_dir}`" if failed else ""),
          file=sys.stderr, flush=True)
    return 1 if failed else 0


def start_member(sweep_dir: Path, member: Dict[str, Any], args: List[str], slots: CoreSlots) -> Running:
    """The member's own launcher, in its own session: only the sweep signals it (once), not the terminal too."""
    path = console_log(sweep_dir, member)
    path.parent.mkdir(exist_ok=True)
    log = open(path, "a", encoding="utf-8")  # a continued member's log goes on after its first attempt's
    slot = slots.take()
    try:
        proc = subprocess.Popen(launcher_command(args), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=slots.pin(slot))
    except BaseException:
        slots.give_back(slot)
        log.close()
        raise
    member["status"] = Status.RUNNING
    print(f"sweep: {member['run_dir']} started (pid {proc.pid})", file=sys.stderr, flush=True)
    return Running(member, proc, log, time.time(), slot)


def finish_member(sweep_dir: Path, item: Running, interrupted: bool = False) -> None:
    item.log.close()
    member, code = item.member, item.proc.returncode
    result = member_result(sweep_dir, member)
    if code == 0 and result.get("status") == Status.COMPLETED:
        member["status"] = Status.COMPLETED
    else:  # stopped by Ctrl-C: unfinished (pending) for resume to run again
        member["status"] = Status.PENDING if interrupted else Status.FAILED
    took = time.time() - item.started
    detail = result_text(result) if member["status"] == Status.COMPLETED else (
        result.get("error") or last_line(console_log(sweep_dir, member)) or f"exit code {code}")
    state = Status.INTERRUPTED if interrupted and member["status"] == Status.PENDING else member["status"]
    print(f"sweep: {member['run_dir']} {state} in {formatting.seconds(took)}: {detail}", file=sys.stderr, flush=True)


def stop_members(running: List[Running], signum: int) -> None:
    """Forward the stop signal to each member's launcher and wait; a launcher that overruns loses its group."""
    for item in running:
        with contextlib.suppress(ProcessLookupError):
            item.proc.send_signal(signum)
    deadline = time.monotonic() + STOP_WAIT_S
    for item in running:
        while item.proc.poll() is None and time.monotonic() < deadline:
            try:
                item.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
            except KeyboardInterrupt:  # a second Ctrl-C: the launchers have theirs already; keep waiting
                continue
        if item.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(item.proc.pid, signal.SIGKILL)  # its own session: this group is the member's, all of it
            item.proc.wait()


def result_text(summary: Dict[str, Any]) -> str:
    parts = []
    if summary.get("final_loss") is not None:
        parts.append(f"loss {formatting.loss(summary['final_loss'])}")
    if summary.get("samples_per_s"):
        parts.append(f"{formatting.rate(summary['samples_per_s'])} samples/s")
    return ", ".join(parts) or "done"


def print_table(sweep: Dict[str, Any], sweep_dir: Path) -> None:
    """One row per member: its swept values, status, final loss and throughput (from its summary.json)."""
    header = ["member", *sweep["keys"], "status", "final_loss", "samples/s"]
    rows = []
    for member in sweep["members"]:
        result = member_result(sweep_dir, member)
        rows.append([f"m{member['index']:03d}", *(str(member["overrides"].get(k, "")) for k in sweep["keys"]),
                     member["status"], formatting.loss(result.get("final_loss")),
                     formatting.rate(result.get("samples_per_s") or None)])
    table.print_table(header, rows, right=("final_loss", "samples/s"))
