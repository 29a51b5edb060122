"""A job on this machine alone: this node's agent runs every worker, then summary.json.

launcher.backends.node runs one node of a multi-machine job through the same run_and_summarize,
with a NodeSession that meets the other nodes first and decides which node writes the summary.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from launcher import interrupts
from launcher.agent.launch import first_result, run_node
from launcher.agent.processes import result_file
from launcher.agent.rundir_guard import lost_run_dir
from launcher.backends.addresses import choose_interface
from launcher.config.schema import Config, to_dict
from launcher.errors import HangError, LauncherError, RunDirLostError, WorkerFailedError
from launcher.plan import LaunchPlan
from launcher.rundir import finish, one_line_summary, prepare_run_dir, summary_base
from launcher.runtime import env, safefs
from launcher.steps.collector import Collector
from launcher.trainers.checkpoint.files import checkpoint_dir, list_checkpoints

log = logging.getLogger("launcher")
LOOPBACK_PROBE_PORT = 9  # any port: finding the interface towards an address sends nothing


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
    try:
        return run_to_summary(cfg, plan, started, session, finish_with(session, collector))
    finally:
        if collector is not None:
            collector.close(None)  # (closed already where a summary was written)


def run_to_summary(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any], finish_as: Callable) -> int:
    run_dir = Path(plan.run_dir)
    base = summary_base(cfg, plan)
    try:
        interrupts.release()  # the run directory is whole: a Ctrl-C held until now is recorded below
        try:
            results, restarts = (session.run if session is not None else run_node)(plan, to_dict(cfg))
        finally:
            interrupts.recording()  # the agent is done: a signal now waits for the summary (launcher.interrupts)
    except RunDirLostError:
        raise  # nothing can be written there: the error says what is left
    except LauncherError as e:
        if isinstance(e, WorkerFailedError) and e.root_cause:
            base["root_cause"] = e.root_cause  # what ls, logs and the board lead with
        summary = finish_as(run_dir, base, None, "hung" if isinstance(e, HangError) else "failed", started,
                            error=str(e), restarts=e.restarts if isinstance(e, WorkerFailedError) else 0)
        if summary.get("status") == "hung" and summary.get("error") not in (None, str(e)):
            raise HangError(summary["error"]) from None  # the head's verdict joins the other nodes' hangs
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
    summary = finish_as(run_dir, base, first_result(results), "completed", started, restarts=restarts)
    log.info(after_the_last_step(interrupts.settled()) + one_line_summary(summary, run_dir))
    return 0


def after_the_last_step(signum: Optional[int]) -> str:
    """'interrupted by SIGTERM after the last step; ' for a stop signal that came once the job had completed."""
    return f"interrupted by {signal.Signals(signum).name} after the last step; " if signum else ""


def stopped(cfg: Config, plan: LaunchPlan, started: float, session: Optional[Any], base: Dict[str, Any],
            how: str, signum: int, finish_as: Callable) -> int:
    """summary.json of a job stopped by a signal: "completed" where rank 0 had finished the last step, else "interrupted"."""
    run_dir = Path(plan.run_dir)
    rank0 = finished_rank0(cfg, plan, started, session)
    if rank0 is not None:  # nothing left to train: "interrupted" would send a resume that refuses, forever
        summary = finish_as(run_dir, base, rank0, "completed", started)
        interrupts.settled()  # this one is named below; a later one changes nothing
        log.info(f"{how} after the last step; {one_line_summary(summary, run_dir)}")
        return 0
    finish_as(run_dir, base, None, "interrupted", started)
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
    return Collector(cfg, plan.run_dir, plan.world_size, owner).start()


def finish_with(session: Optional[Any], collector: Optional[Collector]) -> Callable[..., Dict[str, Any]]:
    """finish (or the session's), with the collector's last rows before and its W&B summary after."""
    finish_as = session.finish if session is not None else finish

    def finishing(run_dir: Path, *args: Any, **kwargs: Any) -> Dict[str, Any]:
        lost = lost_run_dir(Path(run_dir))
        if lost:  # a rank failed on it before the guard's next look (launcher.agent.rundir_guard)
            raise RunDirLostError(lost)
        if collector is not None:
            collector.drain()
        summary = finish_as(run_dir, *args, **kwargs)
        if collector is not None:
            collector.close(summary)
        return summary

    return finishing


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
