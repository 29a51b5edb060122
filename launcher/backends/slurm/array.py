"""Several runs as ONE SLURM job array (`sweep --cluster slurm`): one array task per run.

Each task runs the callable a single SLURM run runs (launcher.backends.slurm.task.SlurmNodeAgent)
with that run's config, in that run's directory, which gets its own job.json naming the task
(ARRAYID_INDEX): `status`, `logs` and `cancel` work on one member as on any SLURM run. The array's
concurrency limit is submitit's array_parallelism (sbatch --array=0-N%P). Like a single run, the
tasks get a fresh rendezvous secret through the environment sbatch passes on, never in a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List

from launcher.backends.slurm.submit import (build_executor, executor_parameters, gpus_to_request, job_secret,
                                            require_sbatch, sbatch_errors, write_job_record)
from launcher.config.rdzv_secret import read_rdzv_secret
from launcher.config.schema import Config, to_yaml
from launcher.errors import ConfigError
from launcher.rundir import create_run_dir, write_atomic


def check_one_shape(cfgs: List[Config], gpus: int) -> Dict[str, Any]:
    """One array asks SLURM for one shape: every run single-node, with the same resources."""
    multi = [c.run_id for c in cfgs if c.nodes > 1]
    if multi:
        raise ConfigError(f"a SLURM job array runs single-node members, and {multi[0]} asks for {cfgs[0].nodes} nodes: "
                          "drop --nodes (or sweep multi-node jobs here with --cluster local)")
    shapes = [{k: v for k, v in executor_parameters(c, gpus).items() if k != "job_name"} for c in cfgs]
    for cfg, shape in zip(cfgs, shapes):
        differs = sorted(k for k in set(shape) | set(shapes[0]) if shape.get(k) != shapes[0].get(k))
        if differs:
            raise ConfigError(f"one SLURM job array asks for one shape, but {cfg.run_id} differs from {cfgs[0].run_id} "
                              f"in {', '.join(differs)}: sweep --gpus and slurm.* keys in separate sweeps")
    return shapes[0]


def submit_array(cfgs: List[Config], folder: Path, parallel: int, job_name: str) -> List[str]:
    """Submit the runs (each cfg with its output_dir and run_id set) as one array; their job ids, in order."""
    require_sbatch()
    gpus = gpus_to_request(cfgs[0])
    check_one_shape(cfgs, gpus)
    has_secret = read_rdzv_secret(cfgs[0].rdzv.secret_file, os.environ, warn=True) is not None  # an unreadable file: named now
    executor = build_executor(cfgs[0], folder, gpus)
    executor.update_parameters(array_parallelism=parallel, job_name=job_name)
    for cfg in cfgs:
        run_dir = create_run_dir(cfg.output_dir, str(cfg.run_id), cfg.launcher.allow_other_owner)
        write_atomic(run_dir / "config.yaml", to_yaml(cfg, recorded=True))
    # Imported only when submitting: the task loads torch's elastic agent (launcher.backends.slurm.submit).
    from launcher.backends.slurm.task import SlurmNodeAgent, TaskSpec

    with job_secret(has_secret), sbatch_errors():
        with executor.batch():
            jobs = [executor.submit(SlurmNodeAgent(TaskSpec.of(cfg))) for cfg in cfgs]
    ids = [str(job.job_id) for job in jobs]
    for cfg, job_id in zip(cfgs, ids):
        write_job_record(Path(cfg.output_dir) / str(cfg.run_id), job_id, cfg, folder)
    return ids
