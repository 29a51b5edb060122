"""Launch a resolved config from this process: plan it, create and lock its run directory, hand it to its engine.

The engines that run here (launcher.backends.here: local, simulated, multinode) are looked up in
launcher.backends.registry by the plan's launch mode (or an engine that took the config passes itself),
and called through their typed hooks
(pick_port, check_before_start, meet, run). The plan records the engine's kind (plan.json `kind`), so
`ls`, `status` and `logs` read which engine made a run instead of guessing. SLURM and Ray submit a job
whose tasks come back here, each a multinode launch.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Tuple

from launcher import interrupts, prestart
from launcher.agent.zygote import Zygote
from launcher.backends import children, registry
from launcher.backends.base import KIND_BY_MODE, RunsHere
from launcher.config.elastic import is_elastic, min_nodes
from launcher.config.rendezvous import launch_mode, shared_run_id
from launcher.config.schema import Config, to_yaml
from launcher.config.secrets import redact
from launcher.errors import ConfigError
from launcher.objectstore import runrecord
from launcher.objectstore.staging import Staging, staging_top
from launcher.plan import FLIGHT_RECORDER_ENV, LaunchPlan, build_plan, detect_hardware, job_workers, new_run_id, no_gpu_here
from launcher.rundir import check_can_create, create_run_dir, finish, summary_base
from launcher.runlock import check_can_take, check_not_a_finished_run, claim
from launcher.runtime import safefs
from launcher.runtime.checkpoints import TMP_PREFIX
from launcher.runtime.objects import is_url, preflight
from launcher.runtime.schema import Status
from launcher.warmstart import collector_paused


@dataclass
class Handover:
    """A launch on its way through launcher.prestart's exec: what it had made, for the exec'd process to go on with
    (pickled into the file prestart hands over: this process's own classes, read by the same code)."""

    cfg: Config
    engine: str  # the backend's registry name
    kind: str  # its workers' kind: the zygote forked after the exec imports for it
    started: float
    staging: Staging
    plan: Optional[LaunchPlan]  # built and checked before the exec; None where only torch can count the GPUs


def launch(cfg: Config, started: float, continuing: Optional[Callable[[Path], None]] = None,
           backend: Optional[RunsHere] = None) -> int:
    """Plan a resolved config, create and lock its run directory and hand it to its backend (by default the engine
    of its launch mode; an engine that took the config itself passes itself).

    continuing: given only where a launch continues an existing run (`resume`, a SLURM task); it is
    called with the run directory once this launcher holds it, before the backend writes anything.
    Any other launch into a directory that holds a run is refused (launcher.runlock).

    A launch whose workers fork here from `python -m launcher` (or the `launcher` command) execs this process once,
    after what it can refuse without torch (on a machine without a GPU, the whole plan): launcher.prestart's one
    torch import for the launcher and the zygote; the exec'd process goes on with the Handover (go_on).

    Ctrl-C, SIGTERM and SIGHUP (launcher.interrupts): before the run directory is made, they end the
    launch at once with nothing on disk; from then on, with summary status "interrupted" (the backend
    writes that once it runs; before, this function does). Each backend calls launcher.interrupts.release()
    once its run directory is whole (config.yaml, plan.json).
    """
    interrupts.hold()
    runrecord.check_store(cfg)  # first: a wrong endpoint or bucket costs no zygote, no torch import
    check_checkpoint_store(cfg)
    refuse_planted_links(cfg)  # a named run's planted link costs no zygote, no torch import either
    backend = backend or backend_for(launch_mode(cfg))
    kind = workers_kind(cfg)
    staging = Staging(cfg.output_dir, make=True)  # output_dir=s3://...: a private local folder
    try:
        plan = None
        if kind is not None and continuing is None and prestart.can_exec():
            if no_gpu_here():  # the plan needs no torch here: refused, if it is, before torch loads
                cfg, plan = checked_plan(cfg, backend, staging.path)
                check_can_take(plan)  # a run id in use or taken: one line, before the first line and torch
            announce(cfg, plan)
            prestart.exec_launch(kind, pickle.dumps(Handover(cfg, backend.name, kind, started, staging, plan)))
            return _launch(cfg, backend, kind, started, continuing, staging, plan, announced=True)  # the exec failed
        return _launch(cfg, backend, kind, started, continuing, staging, plan)  # here: no exec
    finally:
        staging.remove()  # unless kept: a launch that ended early leaves nothing behind either


def go_on(handover: bytes) -> int:
    """In the process launch() exec'd (launcher.prestart): the launch goes on where it was."""
    interrupts.hold()
    state = pickle.loads(handover)  # noqa: S301  (written by launch() in this same process, before its exec)
    assert isinstance(state, Handover), type(state)
    backend = registry.get(state.engine)
    assert isinstance(backend, RunsHere), backend
    try:  # its first line came before the exec (announce): not again
        return _launch(state.cfg, backend, state.kind, state.started, None, state.staging, state.plan, announced=True)
    finally:
        state.staging.remove()


def workers_kind(cfg: Config) -> Optional[str]:
    """The kind of workers this launch forks from a zygote here ("trainer" or "script"); None for start method
    spawn and for a simulated job's coordinator (its nodes are processes of their own)."""
    return None if launch_mode(cfg) == "simulated" else children.workers_kind(cfg)


def _launch(cfg: Config, backend: RunsHere, kind: Optional[str], started: float,
            continuing: Optional[Callable[[Path], None]], staging: Staging, plan: Optional[LaunchPlan],
            announced: bool = False) -> int:
    top = staging.path
    if kind is not None:
        Zygote.start(kind)  # the one forked at the exec, or a fresh one whose imports overlap the plan's below
    else:
        prestart.drop()  # one forked at our start (a child launcher's) that this launch has no use for
    if plan is None:
        cfg, plan = checked_plan(cfg, backend, top)
    if not announced:
        if continuing is None:
            check_can_take(plan)
        announce(cfg, plan)
    with collector_paused():  # torch's import: see launcher.warmstart
        backend.runner_module()  # only now: bad input above is refused before the agent loads (and torch, unless prestart)
    session = backend.meet(plan)  # the nodes of a multi-node job: they agree before any touches the run directory
    if continuing is None:
        check_not_a_finished_run(plan)
    with interrupts.deferred():  # made whole and ours, then the signal: the backend releases it once it can record it
        made = create_run_dir(top, plan.run_id, cfg.launcher.allow_other_owner)
        lock = claim(plan)
    upload = runrecord.uploader(cfg, made, getattr(session, "is_head", True), started)
    try:
        if continuing is not None:
            continuing(made)
        if upload is not None:
            upload.start()
        return backend.run(cfg, plan, started, session)
    except KeyboardInterrupt:  # before the backend could record it (it records its own and returns)
        finish(made, summary_base(cfg, plan), None, Status.INTERRUPTED, started)
        raise
    finally:
        lock.release()
        if upload is not None and not upload.close():  # however the job ended: its record, summary included, goes up whole
            staging.keep()  # the upload said where its record is kept
        elif upload is None and not getattr(session, "files_at_head", True):
            staging.keep(f"this node's run directory is kept in {made}: not all of its files reached the head")


def announce(cfg: Config, plan: Optional[LaunchPlan]) -> None:
    """The launch's first line, once its input is checked and before torch loads (seconds on a busy machine): what
    starts. plan None: where only torch can count the GPUs, the job's shape as the config gives it."""
    if plan is not None:
        nodes, lowest, per_node = plan.nodes, plan.min_nodes or plan.nodes, plan.workers_per_node
        what = "CPU worker" if plan.device_type == "cpu" else "worker"
    else:
        nodes, lowest, per_node, what = cfg.nodes, min_nodes(cfg), cfg.gpus, "worker"
    # "1 to 4 nodes, 2 CPU workers each", not "4 nodes x 2", which reads as 8 workers running
    shape = (f"an elastic job of {lowest} to {nodes} nodes, {per_node} {what}{'s' if per_node > 1 else ''} each"
             if (plan.elastic if plan is not None else is_elastic(cfg)) else job_workers(nodes, per_node, what))
    backend = f" with {plan.backend}" if plan is not None else ""
    # a simulated job's coordinator imports none (its nodes do)
    loading = "" if "torch" in sys.modules or launch_mode(cfg) == "simulated" else "; importing torch"
    print(f"[launcher] starting {shape}{backend}{loading}", file=sys.stderr, flush=True)


def checked_plan(cfg: Config, backend: RunsHere, top: str) -> Tuple[Config, LaunchPlan]:
    """The plan, built once per launch, and what can be refused for it before anything starts (nothing written,
    nothing contacted: launch() asks it before its exec where the plan needs no torch)."""
    plan = plan_launch(cfg, backend, top)
    cfg = runrecord.with_store_checkpoints(cfg, plan.run_id)
    refuse_planted_links_in(plan.run_dir)  # again: run ids known only now, links planted since
    backend.check_before_start(plan)
    check_can_create(top, plan.run_id, cfg.launcher.allow_other_owner)
    return cfg, plan


def refuse_planted_links(cfg: Config) -> None:
    """A run named on the command line (run_id=) in a local output_dir: links planted in its directory are refused
    before the zygote starts and torch loads, so the one-line refusal costs a fraction of a second."""
    if cfg.run_id and not is_url(cfg.output_dir):
        refuse_planted_links_in(str(Path(cfg.output_dir).resolve() / cfg.run_id))


NCCL_PIPES = FLIGHT_RECORDER_ENV["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].replace("STACKS", "stacks")  # relative to a run dir


def refuse_planted_links_in(run_dir: str) -> None:
    if os.path.lexists(run_dir):  # links and FIFOs planted by anyone who can write output_dir: refused (docs/security.md)
        safefs.refuse_planted(run_dir, clears=(TMP_PREFIX,), others=("wandb", *registry.own_folders()),  # their own links
                              fifos=(NCCL_PIPES,))  # NCCL's debug pipes: torch's own FIFOs


def check_checkpoint_store(cfg: Config) -> None:
    """An object-store checkpoint.dir answers and takes a write, before any worker starts or anything is made:
    a wrong endpoint or bucket is one line now, not a failed save after the first interval of training."""
    url = cfg.checkpoint.dir
    if cfg.script.path is None and is_url(url):
        problem = preflight(url)
        if problem:
            raise ConfigError(f"checkpoint.dir={url}: {problem}")


def plan_launch(cfg: Config, backend: RunsHere, top: Optional[str] = None) -> LaunchPlan:
    """The plan, which records its engine's kind; its run directory is under top (output_dir, or a URL output_dir's
    local staging folder)."""
    with collector_paused():  # torch's import: see launcher.warmstart
        run_id = cfg.run_id or shared_run_id(cfg) or new_run_id()
        run_dir = str(Path(top or staging_top(cfg.output_dir, make=False)).resolve() / run_id)
        plan = build_plan(cfg, detect_hardware(), run_id, run_dir, backend.pick_port())
    return replace(plan, kind=backend.name)


def plan_text(cfg: Config, plan: LaunchPlan) -> str:
    return "# resolved config\n" + to_yaml(cfg) + "# launch plan\n" + json.dumps(redact(plan.to_dict()), indent=2) + "\n"


def dry_run_text(cfg: Config, backend: Optional[RunsHere] = None) -> str:
    """What `--dry-run` prints for a launch here: the resolved config and the launch plan; nothing starts."""
    return plan_text(cfg, plan_launch(cfg, backend or backend_for(launch_mode(cfg))))


def backend_for(mode: str) -> RunsHere:
    """The engine registered for a launch mode (launcher.config.rendezvous.launch_mode); its runner module
    (which loads torch) is imported only when it runs, once the zygote is on its way (bench/startup.py)."""
    backend = registry.get(KIND_BY_MODE[mode])
    assert isinstance(backend, RunsHere), backend
    return backend
