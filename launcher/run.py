"""The `run` command: config -> plan -> run directory -> execute -> summary."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.config import Config, ScriptConfig, load_config, to_dict, to_yaml, validate
from launcher.errors import ConfigError, HangError, LauncherError, WorkerFailedError
from launcher.plan import Hardware, LaunchPlan, build_plan, new_run_id
from launcher.rundir import build_summary, create_run_dir, write_atomic, write_json


def resolve_config(args: argparse.Namespace, overrides: List[str], script: Optional[Tuple[str, bool, List[str]]]) -> Config:
    cfg = load_config(args.config, overrides)
    if script is not None:
        path, module, script_args = script
        cfg.script = ScriptConfig(path=path, module=module, args=list(script_args))
        validate(cfg)
    return cfg


def detect_hardware() -> Hardware:
    """Ask torch what this machine has, without initialising CUDA in this process."""
    import torch

    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    exported = os.environ.get("OMP_NUM_THREADS", "")
    return Hardware(cuda_devices=cuda, cpu_cores=cores, omp_threads_env=int(exported) if exported.isdigit() and int(exported) > 0 else None)


def start_zygote(cfg: Config) -> None:
    """Start this node's warm zygote now, so its imports overlap the launcher's own (launcher.zygote)."""
    from launcher.multinode import launch_mode
    from launcher.zygote import Zygote

    if cfg.launcher.start_method != "spawn" and launch_mode(cfg) != "simulated":
        Zygote.start("trainer" if cfg.script.path is None else "script")


def run(args: argparse.Namespace, overrides: List[str], script: Optional[Tuple[str, bool, List[str]]]) -> int:
    started = _process_start_time()
    cfg = resolve_config(args, overrides, script)
    if args.show_config:
        print(to_yaml(cfg), end="")
        return 0
    from launcher.slurm_job import adopt_allocation, should_submit

    cfg = adopt_allocation(cfg)  # inside a SLURM job step: its nodes, node rank and node 0
    if getattr(args, "wait", False) and not should_submit(cfg):
        raise ConfigError("--wait follows a submitted SLURM job: add --cluster slurm (a local run always waits)")
    if should_submit(cfg):
        from launcher.slurm_submit import submit

        return submit(cfg, dry_run=args.dry_run, wait=getattr(args, "wait", False))
    return launch(cfg, args.dry_run, started)


def launch(cfg: Config, dry_run: bool, started: float) -> int:
    """Run a resolved config on this machine (one node of a multi-node job, or all of a simulated one)."""
    from launcher.warmstart import collector_paused

    if not dry_run:
        start_zygote(cfg)
    with collector_paused():  # torch's import: see launcher.warmstart
        from launcher import simulate
        from launcher.multinode import launch_mode, shared_run_id
        from launcher.node import check_before_start, session_for

        run_id = cfg.run_id or shared_run_id(cfg) or new_run_id()
        run_dir = str(Path(cfg.output_dir).resolve() / run_id)
        mode = launch_mode(cfg)
        plan = build_plan(cfg, detect_hardware(), run_id, run_dir, simulate.pick_port() if mode == "simulated" else 0)
    if dry_run:
        print("# resolved config\n" + to_yaml(cfg) + "# launch plan\n" + json.dumps(plan.to_dict(), indent=2))
        return 0
    check_before_start(plan)
    create_run_dir(cfg.output_dir, run_id)
    if mode == "simulated":
        return simulate.run_simulated(cfg, plan, started)
    return execute(cfg, plan, started, node=session_for(plan))


def execute(cfg: Config, plan: LaunchPlan, started: float, node: Any = None) -> int:
    """Run this machine's part of the job. node: a launcher.node.NodeSession for one node of a multi-node job."""
    prepare_run_dir(cfg, plan, started)
    return run_and_summarize(cfg, plan, started, node)


def prepare_run_dir(cfg: Config, plan: LaunchPlan, started: float) -> logging.Logger:
    from launcher.logs import setup_launcher_logging

    run_dir = Path(plan.run_dir)
    log = setup_launcher_logging(run_dir / "logs" / "launcher.log")
    write_atomic(run_dir / "config.yaml", to_yaml(cfg, recorded=True))
    write_json(run_dir / "plan.json", plan.to_dict())
    for notice in plan.notices:
        log.info(notice)
    if plan.start_method == "spawn":
        log.info(plan.start_method_reason)
    log.info(f"run {plan.run_id}: {plan.world_size} workers ({plan.nodes} node x {plan.workers_per_node}), "
             f"{plan.backend}, start method {plan.start_method}; run directory {run_dir}")
    os.environ["LAUNCHER_START_TIME"] = repr(started)
    return log


def run_and_summarize(cfg: Config, plan: LaunchPlan, started: float, node: Any = None) -> int:
    """Execute the plan on this machine and write summary.json (on a multi-node job: where node says)."""
    from launcher.local import first_result, run_node

    run_dir = Path(plan.run_dir)
    log = logging.getLogger("launcher")
    finish = node.finish if node is not None else _finish
    base: Dict[str, Any] = {
        "run_id": plan.run_id, "world_size": plan.world_size, "nodes": plan.nodes,
        "gpus_per_node": plan.workers_per_node, "backend": plan.backend, "device_type": plan.device_type,
        "strategy": cfg.trainer.strategy if cfg.script.path is None else None,
        "model": cfg.model.name if cfg.script.path is None else None,
        "script": cfg.script.path, "restarts": 0,
    }
    try:
        results, restarts = (node.run if node is not None else run_node)(plan, to_dict(cfg))
    except LauncherError as e:
        finish(run_dir, base, None, "hung" if isinstance(e, HangError) else "failed", started, error=str(e),
               restarts=e.restarts if isinstance(e, WorkerFailedError) else 0)
        raise
    except KeyboardInterrupt as e:
        signum = getattr(e, "sigval", signal.SIGINT)
        finish(run_dir, base, None, "interrupted", started)
        log.info(f"interrupted by {signal.Signals(signum).name}; run directory {run_dir}{resume_hint(cfg, run_dir)}")
        return 128 + int(signum)
    except BaseException as e:
        signum = getattr(e, "sigval", None)
        if signum is None:
            raise
        finish(run_dir, base, None, "interrupted", started)
        log.info(f"stopped by signal {signum}; run directory {run_dir}{resume_hint(cfg, run_dir)}")
        return 128 + int(signum)
    killed = sorted(r["rank"] for r in results.values() if isinstance(r, dict) and r.get("hung_at_exit"))
    if killed:  # launcher.processes: finished their script, then hung in the interpreter's exit
        base["ranks_killed_at_exit"] = killed
    summary = finish(run_dir, base, first_result(results), "completed", started, restarts=restarts)
    log.info(one_line_summary(summary, run_dir))
    return 0


def resume_hint(cfg: Config, run_dir: Path) -> str:
    """'; continue with: python -m launcher resume DIR' when the built-in trainer left a checkpoint."""
    if cfg.script.path is not None:
        return ""
    from trainers.checkpoint import checkpoint_dir, list_checkpoints

    ckpt_dir = checkpoint_dir(cfg, str(run_dir))
    return f"; continue with: python -m launcher resume {run_dir}" if ckpt_dir and list_checkpoints(ckpt_dir) else ""


def _finish(run_dir: Path, base: Dict[str, Any], rank0: Optional[Dict[str, Any]], status: str, started: float,
            error: Optional[str] = None, restarts: int = 0) -> Dict[str, Any]:
    summary = build_summary({**base, "status": status, "wall_s": time.time() - started, "restarts": restarts}, rank0)
    if error:
        summary["error"] = error
    write_json(run_dir / "summary.json", summary)
    return summary


def one_line_summary(summary: Dict[str, Any], run_dir: Path) -> str:
    parts = [f"{summary['status']} in {summary['wall_s']:.1f}s"]
    if summary.get("samples_per_s"):
        parts.append(f"{summary['steps']} steps, loss {summary['final_loss']:.4f}, {summary['samples_per_s']:.0f} samples/s")
    if summary.get("time_to_first_step_s"):
        parts.append(f"first step after {summary['time_to_first_step_s']:.1f}s")
    return "; ".join(parts) + f"; run directory {run_dir}"


def _process_start_time() -> float:
    """When the user's command started (this process's creation), so startup time is counted honestly.

    A process that a shell exec'd into keeps the shell's creation time (`(pip install ... && python
    -m launcher)` counted the install), so a creation time far before our first line is not used.
    """
    from launcher.cli import IMPORTED_AT

    try:
        import psutil

        created = psutil.Process().create_time()
    except Exception:
        return IMPORTED_AT
    return created if IMPORTED_AT - created < MAX_INTERPRETER_START_S else IMPORTED_AT


MAX_INTERPRETER_START_S = 5.0  # Python's own start before launcher.cli is imported takes well under this
