"""`python -m launcher status RUN`: a SLURM run's job state and, once it ended, its outcome."""

from __future__ import annotations

from typing import List

from launcher.backends.slurm.records import EXIT_CODES, FINAL_STATES, find_run, job_state, outcome_line, parse_run_args


def main(argv: List[str]) -> int:
    args = parse_run_args("status", "Show a SLURM run's job state; for a finished job, its outcome "
                                    "(a failed rank and its error).", argv)
    if isinstance(args, int):
        return args
    run_dir, job = find_run(args.run, args.output_dir)
    if job.get("cluster") == "ray":  # its driver keeps the state in job.json: no Ray import needed
        from launcher.backends.ray import records

        state = records.job_state(run_dir)
        print(records.outcome_line(run_dir, job, state))
        print(f"run directory {run_dir}")
        return records.EXIT_CODES.get(state, 1) if state in records.FINAL_STATES else 0
    state = job_state(job["job_id"])
    print(outcome_line(run_dir, job, state))
    print(f"run directory {run_dir}")
    # Exit code: 0 while it runs; after it ended, what `--wait` would have returned.
    return EXIT_CODES.get(state, 1) if state in FINAL_STATES else 0
