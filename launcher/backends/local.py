"""A job on this machine alone: this node's agent runs every worker, then summary.json.

launcher.backends.node runs one node of a multi-machine job through the same run_and_summarize,
with a NodeSession that meets the other nodes first and decides which node writes the summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from launcher import interrupts
from launcher.agent.elastic import stop_restarts
from launcher.agent.launch import first_result, run_node
from launcher.agent.spec import AgentSpec
from launcher.agent.processes import result_file, running_worker_pids
from launcher.agent.rundir_guard import lost_run_dir
from launcher.backends.addresses import choose_interface
from launcher.backends import registry
from launcher.config.schema import Config
from launcher.errors import HangError, LauncherError, RunDirLostError, WorkerFailedError
from launcher.plan import LaunchPlan
from launcher.rundir import finish, one_line_summary, prepare_run_dir, summary_base
from launcher.runtime import env, formatting, safefs
from launcher.runtime.system import SystemSampler
from launcher.runtime.schema import Status
from launcher.steps.collector import Collector
from launcher.runtime.checkpoints import checkpoint_dir, list_checkpoints

log = logging.getLogger("launcher")
LOOPBACK_PROBE_PORT = 9  # any port: finding the interface towards an address sends nothing


class Preemption:
    """A scheduler's warning that it takes the job back (SLURM's USR2), as the engine that got it noted it
    (note_preemption): the workers checkpoint and stop on it, and the job then ends "preempted", not failed."""

    at: Optional[float] = None  # wall time of the first warning
    signum: int = 0


def note_preemption(signum: int) -> None:
    """From a signal handler: the first warning's time and signal (a repeat changes nothing)."""
    if Preemption.at is None:
        Preemption.at, Preemption.signum = time.time(), signum
    stop_restarts()  # the ranks stop on it: a failed attempt now is no reason to start them again


def run(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any] = None) -> int:
    """The backend interface (launcher.backends.dispatch). session: a NodeSession for one node of several."""
    prepare_run_dir(cfg, plan, started)
    os.environ[env.START_TIME] = repr(started)
    if session is None:
        # gloo (and NCCL) would listen on the address the host name resolves to, often a LAN address:
        # this machine's job needs none but loopback (docs/security.md)
        choose_interface("127.0.0.1", LOOPBACK_PROBE_PORT)
    return run_and_summarize(cfg, plan, started, session)


def run_and_summarize(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any] = None) -> int:
    """Run this machine's agent to the end and write summary.json (on a multi-node job: where session says)."""
    collector = start_collector(cfg, plan, started, session)
    sampler = SystemSampler(plan.run_dir, node_index(plan, session), running_worker_pids).start()
    try:
        code = run_to_summary(cfg, plan, started, session, finish_with(session, collector))
        if code == 0 and session is None:
            release_caller()
        return code
    finally:
        sampler.stop()
        if collector is not None:
            collector.close()  # its W&B run's end: after summary.json and the last line


def node_index(plan: LaunchPlan, session: Optional[Any]) -> int:
    """This node's number among the job's nodes, for its system records: its node rank where it is known before the
    rendezvous (one machine, simulated, static), else its process's (a c10d node learns its rank only later)."""
    if plan.node_rank is not None:
        return int(plan.node_rank)
    return 0 if session is None else os.getpid()


def run_to_summary(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any], finish_as: Callable) -> int:
    run_dir = Path(plan.run_dir)
    base = summary_base(cfg, plan)
    try:
        interrupts.release()  # the run directory is whole: a Ctrl-C held until now is recorded below
        try:
            spec = AgentSpec.of(cfg, registry.step_signals())
            results, restarts = (session.run if session is not None else run_node)(plan, spec)
        finally:
            interrupts.recording()  # the agent is done: a signal now waits for the summary (launcher.interrupts)
    except RunDirLostError:
        raise  # nothing can be written there: the error says what is left
    except LauncherError as e:
        if isinstance(e, WorkerFailedError) and Preemption.at is not None:  # the ranks stopped on the warning
            return preempted(run_dir, base, started, e.restarts, finish_as)
        if isinstance(e, WorkerFailedError) and e.root_cause:
            base["root_cause"] = e.root_cause  # what ls, logs and the board lead with
        summary = finish_as(run_dir, base, None, Status.HUNG if isinstance(e, HangError) else Status.FAILED, started,
                            error=str(e), restarts=e.restarts if isinstance(e, WorkerFailedError) else 0)
        if summary.get("status") == Status.HUNG and summary.get("error") not in (None, str(e)):
            raise HangError(summary["error"]) from None  # the head's verdict joins the other nodes' hangs
        if isinstance(e, WorkerFailedError) and summary.get("error") not in (None, str(e)):  # another node's rank
            raise WorkerFailedError(summary["error"], restarts=e.restarts, root_cause=summary.get("root_cause")) from None
        raise
    except BaseException as e:  # KeyboardInterrupt, or torch's SignalException (the agent's handlers)
        signum = getattr(e, "sigval", signal.SIGINT if isinstance(e, KeyboardInterrupt) else None)
        if signum is None:
            raise
        return stopped(cfg, plan, started, session, base, f"interrupted by {signal.Signals(signum).name}", signum,
                       finish_as)
    killed = sorted(r["rank"] for r in results.values() if isinstance(r, dict) and r.get("hung_at_exit"))
    if killed:  # launcher.agent.processes: finished their script, then hung in the interpreter's exit
        base["ranks_killed_at_exit"] = killed
    summary = finish_as(run_dir, base, first_result(results), Status.COMPLETED, started, restarts=restarts)
    log.info(after_the_last_step(interrupts.settled()) + one_line_summary(summary, run_dir))
    return 0


def preempted(run_dir: Path, base: Dict[str, Any], started: float, restarts: int, finish_as: Callable) -> int:
    """summary.json of a job its scheduler took back: "preempted", when, and by which signal; whether it is requeued
    is the scheduler's to say (launcher.backends.slurm.task adds it). The exit code is the signal's, as a stop's."""
    name = signal.Signals(Preemption.signum).name
    finish_as(run_dir, {**base, "preempted_at": Preemption.at, "stopped_by": name,
                        "exit_code": 128 + Preemption.signum}, None, Status.PREEMPTED, started, restarts=restarts)
    log.info(f"preempted ({name} at {formatting.clock(Preemption.at)}): the workers checkpointed and stopped; "
             f"run directory {run_dir}")
    return 128 + Preemption.signum


def after_the_last_step(signum: Optional[int]) -> str:
    """'interrupted by SIGTERM after the last step; ' for a stop signal that came once the job had completed."""
    return f"interrupted by {signal.Signals(signum).name} after the last step; " if signum else ""


def stopped(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any], base: Dict[str, Any],
            how: str, signum: int, finish_as: Callable) -> int:
    """summary.json of a job stopped by a signal: "completed" where rank 0 had finished the last step, else "interrupted"."""
    run_dir = Path(plan.run_dir)
    rank0 = finished_rank0(cfg, plan, started, session)
    if rank0 is not None:  # nothing left to train: "interrupted" would send a resume that refuses, forever
        summary = finish_as(run_dir, base, rank0, Status.COMPLETED, started)
        interrupts.settled()  # this one is named below; a later one changes nothing
        log.info(f"{how} after the last step; {one_line_summary(summary, run_dir)}")
        return 0
    finish_as(run_dir, {**base, "exit_code": 128 + int(signum)}, None, Status.INTERRUPTED, started)
    log.info(f"{how}; run directory {run_dir}{resume_hint(cfg, run_dir)}")
    return 128 + int(signum)


def finished_rank0(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any]) -> Optional[Dict[str, Any]]:
    """Rank 0's result, where this node ran rank 0 and it trained to trainer.steps in this launch."""
    if session is not None and 0 not in session.logs.placement.get("ranks", []):
        return None
    path = result_file(plan.run_dir, 0)
    try:
        if path.lstat().st_mtime < started:
            return None  # an earlier launch's
        result = json.loads(safefs.read_bytes(str(path), root=plan.run_dir))  # never through a planted link
    except (OSError, ValueError):
        return None
    done = isinstance(result, dict) and result.get("steps") == cfg.trainer.steps
    return result if done else None


def start_collector(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any]) -> Optional[Collector]:
    """A script's step records into metrics.jsonl and W&B while it runs (launcher.steps), on the node with rank 0."""
    if cfg.script.path is None or not cfg.metrics.scripts:
        return None
    if session is None:
        def owner() -> bool:
            return True
    else:
        def owner() -> bool:
            return 0 in session.logs.placement.get("ranks", [])
    return Collector(cfg, plan.run_dir, plan.world_size, owner, plan.workers_per_node).start()


def finish_with(session: Optional[Any], collector: Optional[Collector]) -> Callable[..., Dict[str, Any]]:
    """finish (or the session's), with the collector's last rows before it (its W&B run gets the summary later)."""
    finish_as = session.finish if session is not None else finish

    def finishing(run_dir: Path, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        lost = lost_run_dir(Path(run_dir))
        if lost:  # a rank failed on it before the guard's next look (launcher.agent.rundir_guard)
            raise RunDirLostError(lost)
        if collector is not None:
            collector.drain()
        summary = finish_as(run_dir, *args, **kwargs)
        if collector is not None:
            collector.finished(summary)
        return summary

    return finishing


def release_caller() -> None:
    """The job completed (summary.json written, its last line printed): a launcher.launch() waiting for it
    (env.RELEASE names the file it watches) returns now, while this launcher ends the job's W&B run and exits."""
    path = os.environ.get(env.RELEASE)
    if not path:
        return
    try:  # in the caller's own 0700 folder; never through a link planted there
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except OSError as e:
        log.debug(f"launcher.launch's caller not told of the end early ({e}); it sees this launcher exit")


def resume_hint(cfg: Config, run_dir: Path) -> str:
    """'; continue with: python -m launcher resume DIR' when the built-in trainer left a checkpoint."""
    if cfg.script.path is not None:
        return ""
    ckpt_dir = checkpoint_dir(cfg, str(run_dir))
    try:
        found = bool(ckpt_dir and list_checkpoints(ckpt_dir))
    except Exception:  # an object store that stopped answering (checkpoint.dir=s3://...): the run's error says so
        found = False
    return f"; continue with: python -m launcher resume {run_dir}" if found else ""
