"""`python -m launcher cancel RUN`: cancel a SLURM run's job (scancel); its run directory stays."""

from __future__ import annotations

from typing import List

from launcher.backends.slurm.records import FINAL_STATES, cancel_job, find_run, job_state, parse_run_args


def main(argv: List[str]) -> int:
    args = parse_run_args("cancel", "Cancel a SLURM run's job; nothing is deleted.", argv)
    if isinstance(args, int):
        return args
    run_dir, job = find_run(args.run, args.output_dir)
    if job.get("cluster") == "ray":  # its driver stops the agents and removes the job's Ray objects
        from launcher.backends.ray import records

        print(records.cancel(run_dir))
        return 0
    state = job_state(job["job_id"])
    if state in FINAL_STATES:
        print(f"SLURM job {job['job_id']} already ended ({state}); nothing to cancel")
        return 0
    cancel_job(job["job_id"])
    print(f"cancelled SLURM job {job['job_id']} (was {state}); run directory {run_dir} kept "
          f"(`python -m launcher resume {run_dir}` continues from its latest checkpoint)")
    return 0
