"""The launch plan: a frozen description of what will run, built from the config by a pure function.

Nothing here probes hardware, opens sockets or writes files; the caller passes in what it
detected (``Hardware``) and the executor carries the plan out. ``--dry-run`` prints it.
"""

from __future__ import annotations

import dataclasses
import datetime
import secrets
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from launcher.config import Config
from launcher.errors import ConfigError

# The torch 2.13 elastic agent shares its rendezvous TCPStore with the workers; restarted
# workers then read the dead attempt's gloo addresses and hang (FACTS.md, pytorch#135712).
# A store per attempt avoids it.
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@dataclass(frozen=True)
class Hardware:
    """What the launching machine has, detected by the caller."""

    cuda_devices: int  # CUDA devices torch can see (0 on a CPU box)
    cpu_cores: int  # usable cores for worker threads
    fork_unsafe_reason: Optional[str] = None  # why forking workers from this process is unsafe, if it is


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    nodes: int
    workers_per_node: int
    world_size: int
    device_type: str  # cuda | cpu
    backend: str  # nccl | gloo
    rdzv_backend: str  # c10d | static
    rdzv_endpoint: str  # host:port; port 0 = pick a free one at launch time
    rdzv_id: str
    rdzv_timeout_s: int
    start_method: str  # fork | spawn
    start_method_reason: str
    max_restarts: int
    omp_threads: int
    command: Tuple[str, ...]  # what each worker runs, as a user would type it
    worker_env: Dict[str, str] = field(default_factory=dict)
    agent_env: Dict[str, str] = field(default_factory=dict)
    notices: Tuple[str, ...] = ()
    shutdown_timeout_s: int = 10  # after Ctrl-C/SIGTERM the agent waits this long for workers, then SIGKILLs
    mode: str = "single"  # single | simulated | static | c10d (launcher.multinode)
    node_rank: Optional[int] = None  # this node's rank where known before the rendezvous (static)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def new_run_id(now: Optional[datetime.datetime] = None) -> str:
    now = now or datetime.datetime.now()
    return f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def worker_command(cfg: Config) -> Tuple[str, ...]:
    if cfg.script.path is None:
        return ("<built-in trainer>", f"trainer.strategy={cfg.trainer.strategy}", f"model.name={cfg.model.name}")
    head = ("python", "-m", cfg.script.path) if cfg.script.module else ("python", cfg.script.path)
    return head + tuple(cfg.script.args)


def choose_start_method(cfg: Config, hw: Hardware) -> Tuple[str, str]:
    asked = cfg.launcher.start_method
    if asked == "spawn":
        return "spawn", "launcher.start_method=spawn asked for"
    if hw.fork_unsafe_reason:
        if asked == "fork":
            raise ConfigError(f"launcher.start_method=fork is unsafe here ({hw.fork_unsafe_reason}): use launcher.start_method=spawn")
        return "spawn", f"fresh interpreters: fork is unsafe here ({hw.fork_unsafe_reason})"
    return "fork", "workers forked from the warm agent (torch already imported)"


def build_plan(cfg: Config, hw: Hardware, run_id: str, run_dir: str, free_port: int = 0) -> LaunchPlan:
    """Turn a validated config and the detected hardware into a launch plan.

    free_port: a TCP port the caller found free, for the nodes of a simulated multi-node job to meet on.
    """
    from launcher.multinode import rendezvous_fields

    notices = []
    if hw.cuda_devices > 0:
        if cfg.gpus > hw.cuda_devices:
            raise ConfigError(
                f"--gpus {cfg.gpus} but CUDA shows {hw.cuda_devices} device(s): "
                f"use --gpus {hw.cuda_devices} or fewer (or set CUDA_VISIBLE_DEVICES)"
            )
        device_type, backend = "cuda", "nccl"
    else:
        device_type, backend = "cpu", "gloo"
        noun = "worker" if cfg.gpus == 1 else "workers"
        notices.append(f"no CUDA device: running {cfg.gpus} CPU {noun} with gloo")
    omp = cfg.launcher.omp_threads or max(1, hw.cpu_cores // cfg.gpus)
    start_method, why = choose_start_method(cfg, hw)
    return LaunchPlan(
        run_id=run_id,
        run_dir=run_dir,
        nodes=cfg.nodes,
        workers_per_node=cfg.gpus,
        world_size=cfg.nodes * cfg.gpus,  # with c10d, nodes may differ: summary.json has the real one
        device_type=device_type,
        backend=backend,
        **rendezvous_fields(cfg, run_id, free_port),
        rdzv_timeout_s=cfg.rdzv.timeout_s,
        start_method=start_method,
        start_method_reason=why,
        max_restarts=cfg.launcher.max_restarts,
        omp_threads=omp,
        command=worker_command(cfg),
        worker_env={"OMP_NUM_THREADS": str(omp), "LAUNCHER_RUN_DIR": run_dir, "LAUNCHER_BACKEND": backend},
        agent_env=dict(AGENT_ENV),
        notices=tuple(notices),
        # workers stop themselves checkpoint.grace_s after the signal; the agent's SIGKILL is the backstop
        shutdown_timeout_s=int(cfg.checkpoint.grace_s) + 2,
    )
