"""`python -m launcher logs RUN [--rank K | --all] [-f] [--grep PATTERN]`: print or follow the workers' logs of any run, one
rank's or every rank's interleaved.

A rank's log is logs/rank-<k>.log and, after restarts, logs/rank-<k>.attempt-<n>.log (printed in
attempt order). Without --rank, a failed run's is the rank its agent found failed first (summary.json's
root_cause), whose traceback is the cause; otherwise rank 0's. `--all` interleaves every rank's lines in
the order they arrived, each with one `[rank<k>]: ` prefix, a print apart from a progress bar and a bar
at its last state (launcher.agent.ranklog). `-f` follows until the run ends: its launcher's lock is
released (launcher.runlock), or for a SLURM job, sacct says it ended.
"""

from __future__ import annotations

import argparse
import heapq
import re
import sys
import time
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Pattern

from launcher.agent.ranklog import RankLog, Timed, rank_lines
from launcher.errors import ConfigError
from launcher.rundir import read_json
from launcher.runindex import is_run_dir, run_row
from launcher.runlock import live_holders
from launcher.usage import OneLineParser, reader_went_away

POLL_S = 0.5
ATTEMPT = re.compile(r"^rank-(\d+)(?:\.attempt-(\d+))?\.log$")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m launcher logs", description="Print (or follow) the workers' logs of a run: "
                      "one rank's, or every rank's interleaved in time order.")
    p.add_argument("run", metavar="RUN", help="run directory, run id under --output-dir, or SLURM job id")
    p.add_argument("--output-dir", default="launcher_runs", metavar="DIR", help="where run ids and job ids are looked up (default launcher_runs)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="K", help="global rank whose log to print (default: a failed run's rank that failed first, else 0)")
    which.add_argument("--all", action="store_true", help="every rank's lines, interleaved in time order, rank-prefixed")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing what the logs gain until the run ends")
    p.add_argument("--grep", metavar="PATTERN", help="only lines matching this regular expression")
    return p


def main(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)  # usage errors: launcher.usage.with_error_contract turns SystemExit into the exit code
    try:
        pattern = re.compile(args.grep) if args.grep else None
    except re.error as e:
        raise ConfigError(f"--grep {args.grep}: not a regular expression ({e}); quote it, or escape special characters with \\") from None
    run_dir = locate_run(args.run, args.output_dir)
    ranks = list(range(world_size(run_dir))) if args.all else [check_rank(run_dir, chosen_rank(run_dir, args.rank))]
    logs: Dict[Path, RankLog] = {}  # each file read so far: -f reads on from there
    try:
        show(interleaved(run_dir, ranks, args.all, logs, following=args.follow), pattern)
        if args.follow:
            follow(run_dir, ranks, args.all, pattern, logs)
    except BrokenPipeError:
        return reader_went_away()
    return 0


def chosen_rank(run_dir: Path, rank: Optional[int]) -> int:
    """--rank K, else the rank a failed run's agent found failed first (its log holds the root cause, rank 0's
    only a knock-on error), else rank 0."""
    if rank is not None:
        return rank
    row = run_row(run_dir, time.time())
    if row.get("failed_rank") is None:
        return 0
    print(f"logs: {row['error']}\nlogs: rank {row['failed_rank']}'s log follows, the root cause (--rank K for another "
          "rank, --all for every rank)", file=sys.stderr)
    return int(row["failed_rank"])


def show(lines: Iterable[Timed], pattern: Optional[Pattern[str]]) -> None:
    for _, _, line in lines:
        if pattern is None or pattern.search(line):
            sys.stdout.write(line)
    sys.stdout.flush()


def locate_run(run: str, output_dir: str) -> Path:
    """RUN is a run directory, a run id under output_dir, or a SLURM job id one of them recorded."""
    for candidate in (Path(run), Path(output_dir) / run):
        if candidate.is_dir() and is_run_dir(candidate):
            return candidate.resolve()
        if (candidate / "sweep.json").is_file() or (candidate / "runs").is_dir():
            raise ConfigError(f"{candidate} holds several runs (a sweep, compare or scale): pass one of them; "
                              f"`python -m launcher ls {candidate}` lists them")
    if run.isdigit():
        for job_file in sorted(Path(output_dir).glob("*/job.json")):
            if str(read_json(job_file).get("job_id")) == run:
                return job_file.parent.resolve()
    raise ConfigError(f"no run '{run}': pass a run directory, a run id under {output_dir}/ or a SLURM job id "
                      f"(`python -m launcher ls {output_dir}` lists them); --output-dir DIR if the runs are elsewhere")


def world_size(run_dir: Path) -> int:
    """How many ranks the run has: its summary or plan, its SLURM record, else the logs there are."""
    for name in ("summary.json", "plan.json"):
        path = run_dir / name
        if path.is_file():
            size = read_json(path).get("world_size")
            if isinstance(size, int) and size > 0:
                return size
    job = run_dir / "job.json"
    if job.is_file():
        record = read_json(job)
        if record.get("nodes") and record.get("gpus_per_node"):
            return int(record["nodes"]) * int(record["gpus_per_node"])
    found = [int(m.group(1)) for m in map(ATTEMPT.match, _log_names(run_dir)) if m]
    return max(found) + 1 if found else 1


def check_rank(run_dir: Path, rank: int) -> int:
    size = world_size(run_dir)
    if not 0 <= rank < size:
        raise ConfigError(f"--rank {rank} is out of range: run {run_dir.name} has ranks 0-{size - 1}")
    return rank


def rank_files(run_dir: Path, rank: int) -> List[Path]:
    """rank-<k>.log, then its restarted attempts' logs in attempt order."""
    found = []
    for name in _log_names(run_dir):
        match = ATTEMPT.match(name)
        if match and int(match.group(1)) == rank:
            found.append((int(match.group(2) or 0), run_dir / "logs" / name))
    return [path for _, path in sorted(found)]


def interleaved(run_dir: Path, ranks: List[int], as_console: bool, logs: Dict[Path, RankLog],
                following: bool = False) -> Iterator[Timed]:
    """Every line of these ranks' logs; with several ranks, merged by arrival time (rank order breaks ties).

    logs gets each file's reader; following: a last line still being written is left to follow()."""
    streams = []
    for rank in ranks:
        files = rank_files(run_dir, rank)
        if not files and len(ranks) == 1 and not following:
            raise ConfigError(no_log_yet(run_dir, rank))
        streams.append(rank_lines([_reader(logs, path, rank, as_console) for path in files], finished=not following))
    return heapq.merge(*streams, key=lambda item: (item[0], item[1]))


def follow(run_dir: Path, ranks: List[int], as_console: bool, pattern: Optional[Pattern[str]],
           logs: Dict[Path, RankLog]) -> None:
    """Print the lines the logs gain (new attempts' files too) until the run has ended; each poll's new
    lines from several ranks in the order they arrived."""
    while True:
        running = still_running(run_dir)
        fresh: List[Timed] = []
        for rank in ranks:
            readers = [_reader(logs, path, rank, as_console) for path in rank_files(run_dir, rank)]
            fresh += rank_lines(readers, finished=not running)
        fresh.sort(key=lambda item: (item[0], item[1]))  # stable: a rank's own lines keep their order
        show(fresh, pattern)
        if not running:
            return
        time.sleep(POLL_S)


def _reader(logs: Dict[Path, RankLog], path: Path, rank: int, as_console: bool) -> RankLog:
    if path not in logs:
        logs[path] = RankLog(path, rank, as_console)
    return logs[path]


def still_running(run_dir: Path) -> bool:
    """A launcher holds the run's lock; or it is a SLURM job that has not ended (queued, or between attempts)."""
    if live_holders(run_dir):
        return True
    if not (run_dir / "job.json").is_file():
        return False
    from launcher.backends.slurm.records import FINAL_STATES, job_state  # only SLURM runs ask the scheduler

    return job_state(str(read_json(run_dir / "job.json")["job_id"])) not in FINAL_STATES


def no_log_yet(run_dir: Path, rank: int) -> str:
    have = sorted(n for n in _log_names(run_dir) if ATTEMPT.match(n))
    if have:
        return f"no log for rank {rank} in {run_dir / 'logs'}: logs there: {', '.join(have)}"
    if (run_dir / "job.json").is_file():
        return (f"no log for rank {rank} in {run_dir / 'logs'}: the job has not started its workers yet "
                f"(`python -m launcher status {run_dir}`); SLURM's own output is in {run_dir}/slurm/")
    return f"no log for rank {rank} in {run_dir / 'logs'}: the run has not started its workers (see logs/launcher.log)"


def _log_names(run_dir: Path) -> List[str]:
    logs = run_dir / "logs"
    return sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []
