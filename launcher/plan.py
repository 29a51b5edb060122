"""The launch plan: a frozen description of what will run, built from the config by a pure function.

Nothing here probes hardware, opens sockets or writes files; the caller passes in what it
detected (``Hardware``) and the executor carries the plan out. ``--dry-run`` prints it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import datetime
import os
import secrets
from dataclasses import dataclass, field
from typing import Any, Dict, Literal, Optional, Tuple

from launcher.config.compat import workers_per_node
from launcher.config.sections import Config
from launcher.errors import ConfigError
from launcher.config.features import check_device_features
from launcher.runtime import env as names
from launcher.config.rendezvous import launch_mode, rendezvous_fields
from launcher.config.elastic import is_elastic, min_nodes, spares

# CPU workers one machine may run: several per core is a fair test of a multi-GPU job's logic;
# thousands are a typo (--gpus 4000 for 4) that would fork until memory runs out.
StartMethod = Literal["fork", "spawn"]  # fork: from the warm zygote (launcher.agent.zygote); spawn: fresh interpreters
CPU_WORKERS_PER_CORE = 8
MIN_CPU_WORKER_LIMIT = 16


@dataclass(frozen=True)
class Hardware:
    """What the launching machine has, detected by the caller."""

    cuda_devices: int  # CUDA devices torch can see (0 on a CPU box)
    cpu_cores: int  # usable cores for worker threads
    omp_threads_env: Optional[int] = None  # OMP_NUM_THREADS as the user exported it (kept, as torchrun keeps it)
    exported: Tuple[str, ...] = ()  # which of FLIGHT_RECORDER_ENV and OMP_NUM_THREADS the user exported (kept as they are)


# NCCL's flight recorder, on for NCCL jobs while the watchdog is on (docs/torchrun.md):
# the last collectives of every rank, dumped into <run_dir>/stacks/ on NCCL's timeout or when the
# watchdog writes to a rank's debug pipe (launcher.agent.stacks). {variable: value, STACKS = that folder}
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "STACKS/nccl-trace-rank-",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "STACKS/nccl-pipe-rank-",
}


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
    start_method: StartMethod
    start_method_reason: str
    max_restarts: int
    omp_threads: int  # 0: OMP_NUM_THREADS left as it is (a script with one worker per node, as under torchrun)
    command: Tuple[str, ...]  # what each worker runs, as a user would type it
    worker_env: Dict[str, str] = field(default_factory=dict)
    agent_env: Dict[str, str] = field(default_factory=dict)  # the agent's alone; its workers never see them
    notices: Tuple[str, ...] = ()
    mode: str = "single"  # single | simulated | static | c10d (launcher.config.rendezvous)
    node_rank: Optional[int] = None  # this node's rank where known before the rendezvous (static)
    rdzv_secret_file: Optional[str] = None  # where the node agent reads the job's secret (never the secret itself)
    kind: str = ""  # the engine that launched it (launcher.backends.registry): ls, status and logs read it
    shutdown_timeout_s: int = 10  # after Ctrl-C/SIGTERM the agent waits this long for workers, then SIGKILLs
    min_nodes: Optional[int] = None  # elastic (--nodes MIN:MAX): the fewest nodes the job runs on; None = nodes
    rdzv_conf: Dict[str, Any] = field(default_factory=dict)  # torch's rendezvous options (rdzv.conf)
    spares: int = 0  # hot spare nodes beyond `nodes` (--spares): checked in, warm, running no ranks until one is lost
    evict_slow_after_s: float = 0.0  # a node named the straggler this long leaves for a waiting spare (0: never)

    @property
    def elastic(self) -> bool:
        """Nodes may leave and join while the job runs (launcher.config.elastic): --nodes MIN:MAX, or spares."""
        return (self.min_nodes is not None and self.min_nodes < self.nodes) or self.spares > 0

    @property
    def agents(self) -> int:
        """The node agents the job starts: its nodes and its hot spares (a simulated job runs them all here)."""
        return self.nodes + self.spares

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


def choose_start_method(cfg: Config) -> Tuple[StartMethod, str]:
    """fork from the zygote, a fresh single-threaded process (whatever state the launcher's own is in), or spawn."""
    if cfg.launcher.start_method == "spawn":
        return "spawn", "launcher.start_method=spawn asked for: workers start as fresh interpreters"
    return "fork", "workers forked from a warm zygote (a fresh interpreter that imported torch)"


def check_cpu_workers(cfg: Config, hw: Hardware, workers: int) -> None:
    """CPU workers share this machine's cores: past a few per core a job only thrashes (or exhausts memory)."""
    here = workers_here(cfg, workers)
    limit = max(MIN_CPU_WORKER_LIMIT, CPU_WORKERS_PER_CORE * hw.cpu_cores)
    if here > limit:
        raise ConfigError(
            f"{here} CPU workers on this machine (no CUDA device, {hw.cpu_cores} cores) is more than "
            f"{limit} ({CPU_WORKERS_PER_CORE} per core): use --gpus {min(workers, hw.cpu_cores)}, or run where the GPUs are")


def workers_here(cfg: Config, per_node: int) -> int:
    """The workers this machine runs: a simulated job's nodes all run here."""
    return per_node * (cfg.nodes if launch_mode(cfg) == "simulated" else 1)


def job_workers(nodes: int, per_node: int, what: str = "CPU worker", elastic: Optional[Tuple[int, int]] = None) -> str:
    """The job's worker count, and per node when there are several: '2 CPU workers (2 nodes x 1)'; an elastic job
    counts the nodes it starts with and states its range: '2 CPU workers (1 node x 2; elastic 1:4 nodes)' (each
    round then says what formed: launcher.config.elastic.round_line)."""
    total = nodes * per_node
    counted = f"{total} {what}{'' if total == 1 else 's'}"
    if elastic:
        return f"{counted} ({nodes} node{'' if nodes == 1 else 's'} x {per_node}; elastic {elastic[0]}:{elastic[1]} nodes)"
    return f"{counted} ({nodes} nodes x {per_node})" if nodes > 1 else counted


def starting_workers(plan: "LaunchPlan", what: str = "worker") -> str:
    """What a plan starts, as job_workers says it: an elastic job its MIN nodes, except where this machine simulates
    them all (launcher.backends.simulated starts every node of the range)."""
    if not plan.elastic:
        return job_workers(plan.nodes, plan.workers_per_node, what)
    least = plan.nodes if plan.mode == "simulated" else (plan.min_nodes or plan.nodes)
    return job_workers(least, plan.workers_per_node, what, elastic=(plan.min_nodes or plan.nodes, plan.nodes))


def thread_count(cfg: Config, hw: Hardware, workers: int) -> Tuple[int, Optional[str]]:
    """Threads per worker (0: OMP_NUM_THREADS left as it is) and, when the launcher chose them, a notice saying so.
    A script gets torchrun's: 1 with several workers per node, unless exported; the built-in trainer shares the cores."""
    if cfg.launcher.omp_threads:
        return cfg.launcher.omp_threads, None
    if hw.omp_threads_env:
        return hw.omp_threads_env, None
    if cfg.script.path is not None:
        if "OMP_NUM_THREADS" in hw.exported or workers == 1:
            return 0, None  # torchrun passes an exported value on as it is, and sets none for one worker per node
        return 1, ("OMP_NUM_THREADS=1 per worker, as torchrun sets it for several workers per node; "
                   "export OMP_NUM_THREADS or set launcher.omp_threads to choose")
    here = workers_here(cfg, workers)
    omp = max(1, hw.cpu_cores // here)
    return omp, (f"OMP_NUM_THREADS={omp} per worker ({hw.cpu_cores} cores / {here} workers on this machine); "
                 "export OMP_NUM_THREADS or set launcher.omp_threads to choose")


def worker_env(cfg: Config, run_dir: str, omp: int, hw: Hardware) -> Dict[str, str]:
    """What the launcher adds to the workers' environment (docs/torchrun.md)."""
    env: Dict[str, str] = {}
    if omp and omp != hw.omp_threads_env:
        env["OMP_NUM_THREADS"] = str(omp)
    if cfg.watchdog.timeout_s > 0 or cfg.script.path is None:
        env.update({names.RUN_DIR: run_dir, names.WATCHDOG_TIMEOUT_S: f"{cfg.watchdog.timeout_s:g}"})
    if cfg.watchdog.timeout_s > 0 and hw.cuda_devices > 0:
        stacks = os.path.join(run_dir, "stacks")
        env.update({k: v.replace("STACKS", stacks) for k, v in FLIGHT_RECORDER_ENV.items() if k not in hw.exported})
    return env


def build_plan(cfg: Config, hw: Hardware, run_id: str, run_dir: str, free_port: int = 0) -> LaunchPlan:
    """Turn a validated config and the detected hardware into a launch plan.

    free_port: a TCP port the caller found free, for the nodes of a simulated multi-node job to meet on.
    """
    notices = []
    workers = workers_per_node(cfg)
    if hw.cuda_devices > 0:
        if cfg.gpus > hw.cuda_devices:
            raise ConfigError(
                f"--gpus {cfg.gpus} but CUDA shows {hw.cuda_devices} device(s): "
                f"use --gpus {hw.cuda_devices} or fewer (or set CUDA_VISIBLE_DEVICES)"
            )
        device_type, backend = "cuda", "nccl"
    else:
        device_type, backend = "cpu", "gloo"
        check_cpu_workers(cfg, hw, workers)
        counted = cfg.nodes if launch_mode(cfg) == "simulated" else min_nodes(cfg)  # elastic: MIN, unless simulated
        elastic = (min_nodes(cfg), cfg.nodes) if is_elastic(cfg) else None
        notices.append(f"no CUDA device: running {job_workers(counted, workers, elastic=elastic)} with gloo")
    notices.extend(check_device_features(cfg, device_type))
    if is_elastic(cfg) and cfg.launcher.max_restarts == 0:
        notices.append(f"--nodes {cfg.min_nodes}:{cfg.nodes} with --max-restarts 0: a lost node ends the job (as with "
                       "torchrun, re-forming without it restarts the workers, and that counts): set --max-restarts K "
                       "to go on after K losses")
    if workers != cfg.gpus:
        devices = f"its {cfg.gpus} GPUs" if device_type == "cuda" else "the one CPU device (no GPU here)"
        notices.append(f"trainer.strategy={cfg.trainer.strategy} runs 1 process per node driving {devices}")
    omp, omp_notice = thread_count(cfg, hw, workers)
    if omp_notice and workers_here(cfg, workers) > 1:
        notices.append(omp_notice)
    start_method, why = choose_start_method(cfg)
    return LaunchPlan(
        run_id=run_id,
        run_dir=run_dir,
        nodes=cfg.nodes,
        workers_per_node=workers,
        world_size=cfg.nodes * workers,  # with c10d, nodes may differ (elastic: the most): summary.json has the real one
        device_type=device_type,
        backend=backend,
        **rendezvous_fields(cfg, run_id, free_port),
        rdzv_timeout_s=cfg.rdzv.timeout_s,
        start_method=start_method,
        start_method_reason=why,
        max_restarts=cfg.launcher.max_restarts,
        omp_threads=omp,
        command=worker_command(cfg),
        worker_env=worker_env(cfg, run_dir, omp, hw),
        notices=tuple(notices),
        # workers stop themselves checkpoint.grace_s after the signal; the agent's SIGKILL is the backstop
        shutdown_timeout_s=int(cfg.checkpoint.grace_s) + 2,
        min_nodes=min_nodes(cfg),
        rdzv_conf=dict(cfg.rdzv.conf),
        spares=spares(cfg),
        evict_slow_after_s=float(cfg.launcher.evict_slow_after_s),
    )


def no_gpu_here() -> bool:
    """True only where torch cannot see a GPU: a CUDA build needs the driver's libcuda.so.1 (not loadable here)
    and a ROCm build the /dev/kfd device (absent). Otherwise torch is asked."""
    if os.path.exists("/dev/kfd"):
        return False
    try:
        ctypes.CDLL("libcuda.so.1")  # loading it initialises nothing; torch loads the same library to count devices
    except OSError:
        return True
    return False


def detect_hardware() -> Hardware:
    """Ask torch what this machine has, without initialising CUDA in this process; where no GPU can be (no_gpu_here),
    without torch: a plan refused for this machine's sake (too many CPU workers, fp16) costs no torch import."""
    cuda = 0
    if not no_gpu_here():
        import torch  # here, not at the top: the plan's other functions are pure and load nothing

        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    exported = os.environ.get("OMP_NUM_THREADS", "")
    return Hardware(cuda_devices=cuda, cpu_cores=cores, omp_threads_env=int(exported) if exported.isdigit() and int(exported) > 0 else None,
                    exported=tuple(k for k in (*FLIGHT_RECORDER_ENV, "OMP_NUM_THREADS") if k in os.environ))
