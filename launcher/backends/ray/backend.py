"""Ray as a launcher.backends.base.Backend: place the job on a Ray cluster (launcher.backends.ray.submit); its
driver keeps job.json's state, so status and cancel need no Ray import (launcher.backends.ray.records)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from launcher.backends.base import Backend, Description, read_record
from launcher.backends.ray.options import RayConfig, check_ray_config

if TYPE_CHECKING:
    from launcher.config.sections import Config


class RayBackend(Backend):
    name, label, submits = "ray", "Ray job", True
    cluster, cluster_help = "ray", "place the job on a Ray cluster (ray.address or $RAY_ADDRESS; config: ray.*)"
    options = RayConfig

    def check_options(self, cfg: "Config") -> None:
        check_ray_config(cfg)

    def takes(self, cfg: "Config") -> bool:
        return cfg.cluster == self.cluster

    def dry_run(self, cfg: "Config") -> str:
        from launcher.backends.ray.submit import dry_run_text, prepare

        address, run_dir = prepare(cfg)
        return dry_run_text(cfg, address, run_dir)

    def launch(self, cfg: "Config", started: float, wait: bool) -> int:
        from launcher import interrupts
        from launcher.backends.ray.submit import submit  # ray itself stays an optional extra: imported there

        interrupts.release()
        return submit(cfg, wait=wait)

    def describe(self, run_dir: Path) -> Description:
        from launcher.backends.ray import records

        state = records.job_state(Path(run_dir))
        final = state in records.FINAL_STATES
        line = records.outcome_line(Path(run_dir), read_record(Path(run_dir) / "job.json"), state)
        return Description(state, final, records.EXIT_CODES.get(state, 1) if final else 0, line)

    def cancel(self, run_dir: Path) -> str:
        from launcher.backends.ray import records

        return records.cancel(Path(run_dir))  # its driver stops the agents and removes the job's Ray objects

    def no_log_hint(self, run_dir: Path) -> str:
        return (f"the job has not started its workers yet (`python -m launcher status {run_dir}`); "
                f"its driver's output is in {run_dir}/logs/ray-driver.out")


BACKEND = RayBackend()
