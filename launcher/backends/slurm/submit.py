"""`--cluster slurm`: submit the job through submitit, one SLURM task per node.

The only module that submits. Each task runs launcher.backends.slurm.task.SlurmNodeAgent, which starts
this node's elastic agent and its --gpus workers; so tasks per node (1) and GPUs per node
(--gpus) agree by construction.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from launcher.backends.base import KIND_FIELD
from launcher.config.rdzv_secret import read_rdzv_secret
from launcher.config.schema import Config, to_yaml
from launcher.errors import ConfigError, LaunchError
from launcher.plan import new_run_id
from launcher.rundir import create_run_dir, write_atomic, write_json
from launcher.runlock import existing_run
from launcher.backends.slurm.options import slurm_section
from launcher.backends.slurm.records import JOB_FILE, wait_for_job
from launcher.backends.slurm.submitit_private import sbatch_script
from launcher.runtime import env
from launcher.runtime.formatting import first_line

def partition_has_gpus(partition: Optional[str]) -> bool:
    """Whether the partition's nodes offer gres/gpu (sinfo); False where sinfo cannot say."""
    args = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "gpu" in out


def require_sbatch() -> None:
    if shutil.which("sbatch") is None:
        raise ConfigError("--cluster slurm needs SLURM's commands, and sbatch is not on PATH: run it on a SLURM "
                          "login node (or add SLURM's bin directory to PATH), or run here with --cluster local")


def write_job_record(run_dir: Path, job_id: str, cfg: Config, folder: Path) -> Dict[str, Any]:
    """job.json: what `status`, `logs` and `cancel` (launcher.backends.slurm.records) find the job by."""
    record = {"job_id": job_id, "cluster": "slurm", KIND_FIELD: "slurm", "submitted_at": datetime.datetime.now().astimezone().isoformat(),
              "run_dir": str(run_dir), "nodes": cfg.nodes, "gpus_per_node": cfg.gpus, "slurm_folder": str(folder)}
    write_json(run_dir / JOB_FILE, record)
    return record


def executor_parameters(cfg: Config, gpus_per_node: int) -> Dict[str, Any]:
    """submitit SlurmExecutor parameters: one task per node, CPUs for the node's workers."""
    s = slurm_section(cfg)
    cpus = s.cpus_per_task or max(cfg.gpus, cfg.gpus * cfg.launcher.omp_threads)
    params: Dict[str, Any] = {
        "job_name": s.job_name or f"launcher-{cfg.run_id}",
        "nodes": cfg.nodes,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus,
        "time": s.time_min,
        "signal_delay_s": s.signal_delay_s,
        "stderr_to_stdout": True,
    }
    optional = {"partition": s.partition, "account": s.account, "qos": s.qos, "constraint": s.constraint,
                "mem": s.mem, "gpus_per_node": gpus_per_node or None}
    params.update({k: v for k, v in optional.items() if v is not None})
    if s.extra:
        params["additional_parameters"] = dict(s.extra)
    return params


def build_executor(cfg: Config, folder: Path, gpus_per_node: int) -> Any:
    import submitit

    executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=slurm_section(cfg).max_requeues, python=sys.executable)
    try:
        executor.update_parameters(**executor_parameters(cfg, gpus_per_node))
    except ValueError as e:  # submitit names the unknown parameter
        raise LaunchError(f"slurm settings rejected by submitit: {first_line(e)}: fix slurm.extra") from e
    return executor


def gpus_to_request(cfg: Config) -> int:
    s = slurm_section(cfg)
    if s.gpus == "never" or (s.gpus == "auto" and not partition_has_gpus(s.partition)):
        return 0  # a CPU cluster: --gpus workers without GPUs
    return cfg.gpus


def srun_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.startswith("srun ")), "")


def prepare(cfg: Config) -> Tuple[Path, Any, int]:
    """cfg made ready to submit (absolute output_dir, a run id): its run directory, executor and GPUs per node."""
    require_sbatch()  # also for --dry-run: its script could never be submitted from here
    cfg.output_dir = str(Path(cfg.output_dir).resolve())  # the job may start in another directory
    cfg.run_id = cfg.run_id or new_run_id()
    run_dir = Path(cfg.output_dir) / cfg.run_id
    gpus = gpus_to_request(cfg)
    return run_dir, build_executor(cfg, run_dir / "slurm", gpus), gpus


def dry_run_text(cfg: Config) -> str:
    """The sbatch script and srun line submitit would submit, and the resolved config; nothing is submitted."""
    run_dir, executor, gpus = prepare(cfg)
    text = sbatch_script(executor)  # submitit's own renderer: --dry-run shows the real thing
    return (f"# sbatch script ({cfg.nodes} node(s) x 1 task; each task runs the node agent with {cfg.gpus} "
            f"worker(s){'' if gpus else ', no GPUs requested'})\n{text}\n# srun command\n{srun_line(text)}\n"
            f"# each task calls launcher.backends.slurm.task.SlurmNodeAgent, pickled in {run_dir / 'slurm'}\n"
            f"# resolved config\n{to_yaml(cfg)}")


def submit(cfg: Config, dry_run: bool = False, wait: bool = False) -> int:
    """Submit cfg as a SLURM job; print how to follow it; with wait, follow it to the end."""
    if dry_run:
        print(dry_run_text(cfg), end="")
        return 0
    run_dir, executor, _ = prepare(cfg)
    if (run_dir / "config.yaml").is_file():  # a requeue reuses it; a new submission never does
        raise existing_run(run_dir, run_dir.name)  # prepare() gave cfg its run_id: run_dir's name
    has_secret = read_rdzv_secret(cfg.rdzv.secret_file, os.environ, warn=True) is not None  # an unreadable file: named now
    create_run_dir(cfg.output_dir, run_dir.name, cfg.launcher.allow_other_owner)
    write_atomic(run_dir / "config.yaml", to_yaml(cfg, recorded=True))
    with job_secret(has_secret):
        job = _submit(executor, cfg)
    record = write_job_record(run_dir, job.job_id, cfg, run_dir / "slurm")
    quoted = shlex.quote(str(run_dir))
    print(f"submitted SLURM job {job.job_id}: {cfg.nodes} node(s) x {cfg.gpus} worker(s); run directory {run_dir}\n"
          f"  follow: python -m launcher status {quoted}   |   python -m launcher logs {quoted} [--rank K]"
          f"   |   python -m launcher cancel {quoted}", flush=True)
    return wait_for_job(run_dir, record) if wait else 0


@contextlib.contextmanager
def job_secret(has_secret: bool) -> Iterator[None]:
    """A fresh rendezvous secret for the job's tasks, in the environment sbatch passes on (its default,
    --export=ALL), while it submits: never in the sbatch script, the pickled task or the run directory.
    A requeue runs in the same environment, so every attempt signs with the same secret."""
    if has_secret:  # the user's own (--rdzv-secret-file, or LAUNCHER_RDZV_SECRET exported): the tasks read it
        yield
        return
    os.environ[env.RDZV_SECRET] = secrets.token_hex(32)
    try:
        yield
    finally:
        os.environ.pop(env.RDZV_SECRET, None)


def _submit(executor: Any, cfg: Config) -> Any:
    # Imported only when a job is really submitted: the task loads torch's elastic agent (2.3 s,
    # -X importtime), which --dry-run and the status/logs/cancel commands never need.
    from launcher.backends.slurm.task import SlurmNodeAgent, TaskSpec

    with sbatch_errors():
        return executor.submit(SlurmNodeAgent(TaskSpec.of(cfg)))


@contextlib.contextmanager
def sbatch_errors() -> Iterator[None]:
    """sbatch's refusal (or no sbatch at all) as one line naming what to check."""
    import submitit

    try:
        yield
    except (submitit.core.utils.FailedJobError, subprocess.CalledProcessError, OSError) as e:
        detail = str(getattr(e, "stderr", "") or e).strip().splitlines()
        raise LaunchError(f"sbatch refused the job: {detail[-1] if detail else e.__class__.__name__}: "
                          "check slurm.partition/account/qos and `sinfo`") from e
