"""SLURM as a launcher.backends.base.Backend: submit through submitit, then status, logs and cancel through
sacct and scancel (launcher.backends.slurm.records). submitit loads only when a job is planned or submitted."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional, Type

from launcher.backends.base import Backend, Description, read_record
from launcher.backends.slurm.options import SlurmConfig, check_slurm_config

if TYPE_CHECKING:
    from launcher.backends.allocation import ClusterEnvironment
    from launcher.config.sections import Config


class SlurmBackend(Backend):
    name, label, submits = "slurm", "SLURM job", True
    cluster, cluster_help = "slurm", "submit a SLURM job through submitit (config: cluster, slurm.*)"
    options, folders = SlurmConfig, ("slurm",)  # slurm/: submitit's own files of the job

    def check_options(self, cfg: "Config") -> None:
        check_slurm_config(cfg)

    def allocation(self) -> Optional[Type["ClusterEnvironment"]]:
        from launcher.backends.slurm.environment import SlurmEnvironment  # a job step of SLURM's: its nodes, rank, node 0

        return SlurmEnvironment

    def takes(self, cfg: "Config") -> bool:
        from launcher.backends.slurm.environment import should_submit

        return should_submit(cfg)  # inside an allocation a run is one node of its job: not a new submission

    def dry_run(self, cfg: "Config") -> str:
        from launcher.backends.slurm.submit import dry_run_text

        return dry_run_text(cfg)

    def launch(self, cfg: "Config", started: float, wait: bool) -> int:
        from launcher import interrupts
        from launcher.backends.slurm.submit import submit

        interrupts.release()  # submitting and --wait talk to SLURM for as long as it takes: Ctrl-C works there
        return submit(cfg, wait=wait)

    def describe(self, run_dir: Path) -> Description:
        from launcher.backends.slurm.records import FINAL_STATES, exit_code, job_state, outcome_line

        job = read_record(Path(run_dir) / "job.json")
        state = job_state(str(job["job_id"]))
        final = state in FINAL_STATES
        return Description(state, final, exit_code(Path(run_dir), state) if final else 0,
                           outcome_line(Path(run_dir), job, state))

    def running(self, run_dir: Path) -> bool:
        from launcher.runlock import live_holders

        return bool(live_holders(Path(run_dir))) or not self.describe(run_dir).final  # queued, or between attempts

    def cancel(self, run_dir: Path) -> str:
        from launcher.backends.slurm.records import cancel_job

        job_id = str(read_record(Path(run_dir) / "job.json")["job_id"])
        described = self.describe(run_dir)
        if described.final:
            return f"SLURM job {job_id} already ended ({described.state}); nothing to cancel"
        cancel_job(job_id)
        return (f"cancelled SLURM job {job_id} (was {described.state}); run directory {run_dir} kept "
                f"(`python -m launcher resume {run_dir}` continues from its latest checkpoint)")

    def no_log_hint(self, run_dir: Path) -> str:
        return (f"the job has not started its workers yet (`python -m launcher status {run_dir}`); "
                f"SLURM's own output is in {run_dir}/slurm/")


BACKEND = SlurmBackend()
