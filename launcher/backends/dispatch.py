"""Launch a resolved config from this process: plan it, create and lock its run directory, hand it to its engine.

The engines that run here (launcher.backends.here: local, simulated, multinode) are looked up in
launcher.backends.registry by the plan's launch mode, and called through their typed hooks
(pick_port, check_before_start, meet, run). The plan records the engine's kind (plan.json `kind`), so
`ls`, `status` and `logs` read which engine made a run instead of guessing. SLURM and Ray submit a job
whose tasks come back here, each a multinode launch.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Tuple

from launcher import interrupts, prestart
from launcher.agent.zygote import Zygote
from launcher.backends import registry
from launcher.backends.base import KIND_BY_MODE, RunsHere
from launcher.config.rendezvous import launch_mode, shared_run_id
from launcher.config.schema import Config, to_yaml
from launcher.config.secrets import redact
from launcher.errors import ConfigError
from launcher.objectstore import runrecord
from launcher.plan import LaunchPlan, build_plan, detect_hardware, new_run_id, no_gpu_here
from launcher.rundir import check_can_create, create_run_dir, finish, summary_base
from launcher.runlock import check_not_a_finished_run, claim
from launcher.runtime import safefs
from launcher.trainers.checkpoint.files import TMP_PREFIX
from launcher.trainers.checkpoint.objects import is_url, preflight
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
    if not dry_run:
        runrecord.check_store(cfg)  # first: a wrong endpoint or bucket costs no zygote, no torch import
        check_checkpoint_store(cfg)
        refuse_planted_links(cfg)  # a named run's planted link costs no zygote, no torch import either
    mode = launch_mode(cfg)
    if not dry_run and cfg.launcher.start_method != "spawn" and mode != "simulated":
        Zygote.start("trainer" if cfg.script.path is None else "script")  # its imports overlap ours below
    else:
        prestart.drop()  # one forked at our start (launcher.prestart) that this launch has no use for
    staging = runrecord.Staging(cfg.output_dir, make=not dry_run)  # output_dir=s3://...: a private local folder
    try:
        return _launch(cfg, mode, dry_run, started, continuing, staging)
    finally:
        staging.remove()  # unless kept: a launch that ended early leaves nothing behind either


def _launch(cfg: Config, mode: str, dry_run: bool, started: float, continuing: Optional[Callable[[Path], None]],
            staging: runrecord.Staging) -> int:
    top = staging.path
    backend, plan = plan_launch(cfg, mode, top)
    cfg = runrecord.with_store_checkpoints(cfg, plan.run_id)
    if dry_run:
        print(plan_text(cfg, plan), end="")
        return 0
    refuse_planted_links_in(plan.run_dir)  # again: run ids known only now, links planted since
    backend.check_before_start(plan)
    check_can_create(top or cfg.output_dir)
    with collector_paused():  # torch's import: see launcher.warmstart
        backend.runner_module()  # only now: bad input above is refused before the agent loads (and torch, unless prestart)
    session = backend.meet(plan)  # the nodes of a multi-node job: they agree before any touches the run directory
    if continuing is None:
        check_not_a_finished_run(plan)
    with interrupts.deferred():  # made whole and ours, then the signal: the backend releases it once it can record it
        made = create_run_dir(top, plan.run_id)
        lock = claim(plan)
    upload = runrecord.uploader(cfg, made, getattr(session, "is_head", True))
    try:
        if continuing is not None:
            continuing(made)
        if upload is not None:
            upload.start()
        return backend.run(cfg, plan, started, session)
    except KeyboardInterrupt:  # before the backend could record it (it records its own and returns)
        finish(made, summary_base(cfg, plan), None, "interrupted", started)
        raise
    finally:
        lock.release()
        if upload is not None and not upload.close():  # however the job ended: its record, summary included, goes up whole
            staging.keep()  # the upload said where its record is kept
        elif upload is None and not getattr(session, "files_at_head", True):
            staging.keep(f"this node's run directory is kept in {made}: not all of its files reached the head")


def refuse_before_torch(cfg: Config) -> None:
    """launch()'s refusals that need neither torch nor the network, for launcher.cli.zygote_kind to ask before
    launcher.prestart's exec (which loads torch first): a launch refused here is not exec'd, and launch() refuses it
    in this process, as before, in its own order and words, without torch (an unwritable output_dir, too many
    CPU workers, an empty rendezvous secret file: 0.3 CPU-s instead of ~3). Writes nothing, contacts nothing."""
    refuse_planted_links(cfg)
    if not no_gpu_here():
        return  # the plan asks torch how many GPUs there are: launch() checks it after the exec
    top = runrecord.staging_top(cfg.output_dir, make=False) if is_url(cfg.output_dir) else None
    backend, plan = plan_launch(cfg, launch_mode(cfg), top)
    backend.check_before_start(plan)
    if top is None:
        check_can_create(cfg.output_dir)


def refuse_planted_links(cfg: Config) -> None:
    """A run named on the command line (run_id=) in a local output_dir: links planted in its directory are refused
    before the zygote starts and torch loads, so the one-line refusal costs a fraction of a second."""
    if cfg.run_id and not is_url(cfg.output_dir):
        refuse_planted_links_in(str(Path(cfg.output_dir).resolve() / cfg.run_id))


def refuse_planted_links_in(run_dir: str) -> None:
    if os.path.lexists(run_dir):  # links planted by anyone who can write output_dir: refused (docs/security.md)
        safefs.refuse_planted(run_dir, clears=(TMP_PREFIX,), others=("wandb", "slurm"))  # their own links


def check_checkpoint_store(cfg: Config) -> None:
    """An object-store checkpoint.dir answers and takes a write, before any worker starts or anything is made:
    a wrong endpoint or bucket is one line now, not a failed save after the first interval of training."""
    url = cfg.checkpoint.dir
    if cfg.script.path is None and is_url(url):
        problem = preflight(url)
        if problem:
            raise ConfigError(f"checkpoint.dir={url}: {problem}")


def plan_launch(cfg: Config, mode: str, top: Optional[str] = None) -> Tuple[RunsHere, LaunchPlan]:
    """The engine for the launch mode and the plan, which records that engine's kind; its run directory is
    under top (output_dir, or a URL output_dir's local staging folder)."""
    with collector_paused():  # torch's import: see launcher.warmstart
        backend = backend_for(mode)
        run_id = cfg.run_id or shared_run_id(cfg) or new_run_id()
        run_dir = str(Path(top or runrecord.staging_top(cfg.output_dir, make=False)).resolve() / run_id)
        plan = build_plan(cfg, detect_hardware(), run_id, run_dir, backend.pick_port())
    return backend, replace(plan, kind=backend.name)


def plan_text(cfg: Config, plan: LaunchPlan) -> str:
    return "# resolved config\n" + to_yaml(cfg) + "# launch plan\n" + json.dumps(redact(plan.to_dict()), indent=2) + "\n"


def dry_run_text(cfg: Config) -> str:
    """What `--dry-run` prints for a launch here: the resolved config and the launch plan; nothing starts."""
    mode = launch_mode(cfg)
    return plan_text(cfg, plan_launch(cfg, mode)[1])


def backend_for(mode: str) -> RunsHere:
    """The engine registered for a launch mode (launcher.config.rendezvous.launch_mode); its runner module
    (which loads torch) is imported only when it runs, once the zygote is on its way (bench/startup.py)."""
    backend = registry.get(KIND_BY_MODE[mode])
    assert isinstance(backend, RunsHere), backend
    return backend
