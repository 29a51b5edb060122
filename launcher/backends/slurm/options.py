"""The `slurm:` config section: how a --cluster slurm job is submitted (launcher/backends/slurm/submit.py).

The SLURM engine's own keys (launcher.backends.slurm.backend declares them); nothing here imports submitit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from launcher.errors import ConfigError

GPU_CHOICES = ("auto", "always", "never")


@dataclass
class SlurmConfig:
    """One task per node, each running the node agent, which starts the --gpus workers."""

    partition: Optional[str] = None  # sbatch --partition; None = the cluster's default
    time_min: int = 60  # time limit in minutes; the job is warned (USR2) signal_delay_s before it and requeues
    signal_delay_s: int = 90  # how long before the time limit SLURM sends USR2 (checkpoint, then requeue)
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    constraint: Optional[str] = None  # sbatch --constraint, e.g. a100
    mem: Optional[str] = None  # memory per node, e.g. 64G; None = the partition's default
    cpus_per_task: int = 0  # CPUs for each node's agent and its workers; 0 = --gpus x launcher.omp_threads (at least --gpus)
    gpus: str = "auto"  # ask SLURM for --gpus GPUs per node: auto (if the partition has gres/gpu) | always | never
    job_name: Optional[str] = None  # sbatch --job-name; None = launcher-<run id>
    max_requeues: int = 3  # preemptions/time limits survived by requeueing (0: none; launcher.backends.slurm.task)
    extra: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option, e.g. {exclusive: true, reservation: r1}


def slurm_section(cfg: Any) -> SlurmConfig:
    """A loaded config's slurm: section (launcher.config.schema.config_class adds it: Config itself declares none)."""
    section: SlurmConfig = cfg.slurm
    return section


def check_slurm_config(cfg: Any) -> None:
    """Values of the slurm section the type system cannot check; each message names the key."""
    s = cfg.slurm
    if s.gpus not in GPU_CHOICES:
        raise ConfigError(f"slurm.gpus={s.gpus} is not one of: {', '.join(GPU_CHOICES)}")
    for key, value, low in (("time_min", s.time_min, 1), ("cpus_per_task", s.cpus_per_task, 0),
                            ("signal_delay_s", s.signal_delay_s, 1), ("max_requeues", s.max_requeues, 0)):
        if value < low:
            raise ConfigError(f"slurm.{key}={value} must be at least {low}")
