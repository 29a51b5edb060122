"""`python -m launcher status RUN`: any run's state, from its backend (a SLURM job: sacct; a Ray job: its driver's
record; a run here: its lock and summary), and once it ended, its outcome."""

from __future__ import annotations

from typing import List

from launcher.commands.runref import locate_backend, parse_run_args
from launcher.objectstore.runrecord import run_url


def main(argv: List[str]) -> int:
    args = parse_run_args("status", "Show a run's state (a SLURM or Ray job's, or a run on this machine's); "
                                    "for a finished one, its outcome (a failed rank and its error).", argv)
    if isinstance(args, int):
        return args
    run_dir, backend = locate_backend(args.run, args.output_dir)
    described = backend.describe(run_dir)
    print(described.line)
    print(f"run directory {run_url(args.run, args.output_dir) or run_dir}")  # a record read back: where it is kept
    return described.exit_code  # 0 while it runs; after it ended, what `--wait` would have returned
