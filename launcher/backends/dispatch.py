"""Which backend runs a resolved config on this machine, and the one interface every backend has.

A backend is a module of launcher.backends with

    run(cfg: Config, plan: LaunchPlan, started: float) -> int   (the job's exit code on this machine)

and, optionally, ``check_before_start(plan)`` (what can fail before anything starts, checked before
the run directory exists). The plan says which one (LaunchPlan.mode): ``single`` runs here
(launcher.backends.local), ``simulated`` runs every node here as its own process
(launcher.backends.simulated), ``static`` and ``c10d`` run one node of a multi-machine job
(launcher.backends.node). SLURM submits a job whose tasks come back here (launcher.backends.slurm).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from launcher import interrupts
from launcher.agent.zygote import Zygote
from launcher.config.rendezvous import launch_mode, shared_run_id
from launcher.config.schema import Config, to_yaml
from launcher.config.secrets import redact
from launcher.plan import build_plan, detect_hardware, new_run_id
from launcher.rundir import create_run_dir, finish, summary_base
from launcher.warmstart import collector_paused


def launch(cfg: Config, dry_run: bool, started: float) -> int:
    """Plan a resolved config, create its run directory and hand it to its backend.

    Ctrl-C, SIGTERM and SIGHUP (launcher.interrupts): before the run directory is made, they end the
    launch at once with nothing on disk; from then on, with summary status "interrupted" (the backend
    writes that once it runs; before, this function does). Each backend calls launcher.interrupts.release()
    once its run directory is whole (config.yaml, plan.json).
    """
    interrupts.hold()
    mode = launch_mode(cfg)
    if not dry_run and cfg.launcher.start_method != "spawn" and mode != "simulated":
        Zygote.start("trainer" if cfg.script.path is None else "script")  # its imports overlap ours below
    with collector_paused():  # torch's import: see launcher.warmstart
        backend = backend_for(mode)
        run_id = cfg.run_id or shared_run_id(cfg) or new_run_id()
        run_dir = str(Path(cfg.output_dir).resolve() / run_id)
        port = backend.pick_port() if mode == "simulated" else 0
        plan = build_plan(cfg, detect_hardware(), run_id, run_dir, port)
    if dry_run:
        print("# resolved config\n" + to_yaml(cfg) + "# launch plan\n" + json.dumps(redact(plan.to_dict()), indent=2))
        return 0
    check = getattr(backend, "check_before_start", None)
    if check is not None:
        check(plan)
    with interrupts.deferred():  # made whole, then the signal: the backend releases it once it can record it
        run_dir = create_run_dir(cfg.output_dir, run_id)
    try:
        return backend.run(cfg, plan, started)
    except KeyboardInterrupt:  # before the backend could record it (it records its own and returns)
        finish(run_dir, summary_base(cfg, plan), None, "interrupted", started)
        raise


def backend_for(mode: str) -> ModuleType:
    """The backend module for a launch mode (launcher.config.rendezvous.launch_mode).

    Imported here, not at the top: they load torch, which should start loading only once the zygote
    is on its way (start-up, bench/startup.py).
    """
    if mode == "simulated":
        from launcher.backends import simulated

        return simulated
    if mode in ("static", "c10d"):
        from launcher.backends import node

        return node
    from launcher.backends import local

    return local


