"""`python -m launcher logs RUN [--rank K]`: one rank's log of a SLURM run (rank 0 by default)."""

from __future__ import annotations

import sys
from typing import List

from launcher.errors import ConfigError
from launcher.backends.slurm.records import find_run, parse_run_args, rank_log


def main(argv: List[str]) -> int:
    args = parse_run_args("logs", "Print one rank's log of a SLURM run.", argv, lambda p: p.add_argument(
        "--rank", type=int, default=0, metavar="K", help="global rank whose log to print (default 0)"))
    if isinstance(args, int):
        return args
    run_dir, _job = find_run(args.run, args.output_dir)
    path = rank_log(run_dir, args.rank)
    if not path.is_file():
        logs = run_dir / "logs"
        have = sorted(q.name for q in logs.glob("rank-*.log")) if logs.is_dir() else []
        hint = f"logs there: {', '.join(have)}" if have else (
            f"the job has not started its workers yet (`python -m launcher status {run_dir}`); "
            f"SLURM's own output is in {run_dir}/slurm/")
        raise ConfigError(f"no log for rank {args.rank} in {logs}: {hint}")
    sys.stdout.write(path.read_text(encoding="utf-8", errors="replace"))
    return 0
