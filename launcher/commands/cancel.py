"""`python -m launcher cancel RUN`: stop a run through its backend (a SLURM job: scancel; a Ray job: its driver;
a run here: its launcher, which records it interrupted); its run directory stays."""

from __future__ import annotations

from typing import List

from launcher.commands.runref import locate_backend, parse_run_args


def main(argv: List[str]) -> int:
    args = parse_run_args("cancel", "Cancel a run (a SLURM or Ray job, or a run on this machine); nothing is deleted.", argv)
    if isinstance(args, int):
        return args
    run_dir, backend = locate_backend(args.run, args.output_dir)
    print(backend.cancel(run_dir))
    return 0
