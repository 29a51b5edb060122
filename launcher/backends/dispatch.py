"""Which backend runs a resolved config on this machine, and the one interface every backend has.

A backend is a module of launcher.backends with

    run(cfg: Config, plan: LaunchPlan, started: float) -> int   (the job's exit code on this machine)

and, optionally, ``check_before_start(plan)`` (what can fail before anything starts, checked before
the run directory exists) and ``meet(plan) -> session`` (the nodes of a multi-node job meet and agree on
their settings before any of them locks or writes the run directory; run then takes the session as a
fourth argument). The plan says which one (LaunchPlan.mode): ``single`` runs here
(launcher.backends.local), ``simulated`` runs every node here as its own process
(launcher.backends.simulated), ``static`` and ``c10d`` run one node of a multi-machine job
(launcher.backends.node). SLURM submits a job whose tasks come back here (launcher.backends.slurm).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

from launcher import interrupts
from launcher.agent.zygote import Zygote
from launcher.config.rendezvous import launch_mode, shared_run_id
from launcher.config.schema import Config, to_yaml
from launcher.config.secrets import redact
from launcher.plan import build_plan, detect_hardware, new_run_id
from launcher.rundir import create_run_dir, finish, summary_base
from launcher.runlock import check_not_a_finished_run, claim
from launcher.runtime import safefs
from launcher.trainers.checkpoint.files import TMP_PREFIX
from launcher.warmstart import collector_paused


def launch(cfg: Config, dry_run: bool, started: float,
           continuing: Optional[Callable[[Path], None]] = None) -> int:
    """Plan a resolved config, create and lock its run directory and hand it to its backend.

    continuing: given only where a launch continues an existing run (`resume`, a SLURM task); it is
    called with the run directory once this launcher holds it, before the backend writes anything.
    Any other launch into a directory that holds a run is refused (launcher.runlock).

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
    if os.path.lexists(plan.run_dir):  # links planted by anyone who can write output_dir: refused (docs/security.md)
        safefs.refuse_planted(plan.run_dir, clears=(TMP_PREFIX,), others=("wandb", "slurm"))  # their own links
    check = getattr(backend, "check_before_start", None)
    if check is not None:
        check(plan)
    meet = getattr(backend, "meet", None)  # the nodes of a multi-node job: they agree before any touches the run directory
    session = meet(plan) if meet is not None else None
    if continuing is None:
        check_not_a_finished_run(plan)
    with interrupts.deferred():  # made whole and ours, then the signal: the backend releases it once it can record it
        made = create_run_dir(cfg.output_dir, run_id)
        lock = claim(plan)
    try:
        if continuing is not None:
            continuing(made)
        return backend.run(cfg, plan, started) if session is None else backend.run(cfg, plan, started, session)
    except KeyboardInterrupt:  # before the backend could record it (it records its own and returns)
        finish(made, summary_base(cfg, plan), None, "interrupted", started)
        raise
    finally:
        lock.release()


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


