"""`python -m launcher logs RUN [--rank K | --all] [-f] [--grep PATTERN]`: print or follow the workers' logs of any run, one
rank's or every rank's interleaved.

A rank's log is logs/rank-<k>.log and, after restarts, logs/rank-<k>.attempt-<n>.log (printed in
attempt order). Without --rank, a failed run's is the rank its agent found failed first (summary.json's
root_cause), whose traceback is the cause; otherwise rank 0's. `--all` interleaves every rank's lines in
the order they arrived, each with one `[rank<k>]: ` prefix, a print apart from a progress bar and a bar
at its last state (launcher.agent.ranklog). `-f` follows until the run ends: its launcher's lock is
released, or for a SLURM or Ray job, its backend says it ended (launcher.backends.base.Backend.running).
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
from launcher.backends.base import RANK_LOG as ATTEMPT
from launcher.backends.registry import backend_of_run
from launcher.commands.runref import add_run_arguments, locate_run
from launcher.errors import ConfigError
from launcher.rundir import read_json
from launcher.runindex import run_row
from launcher.runtime.schema import SUMMARY
from launcher.usage import OneLineParser, reader_went_away

POLL_S = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m launcher logs", description="Print (or follow) the workers' logs of a run: "
                      "one rank's, or every rank's interleaved in time order.")
    add_run_arguments(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, metavar="K",
                       help="global rank whose log to print (default: a failed run's rank that failed first, else 0)")
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


def world_size(run_dir: Path) -> int:
    """How many ranks the run has: its summary or plan, its SLURM record, else the logs there are."""
    for name in ("summary.json", "plan.json"):
        path = run_dir / name
        if path.is_file():
            data = read_json(path)
            size = (SUMMARY.read(data) if name == "summary.json" else data).get("world_size")  # summary: as declared
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
    """rank-<k>.log, then its restarted attempts' logs in attempt order: where the run's backend keeps them."""
    return backend_of_run(run_dir).log_files(run_dir, rank)


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
    """Whether the run's backend says it may still write logs (a launcher holds it; a SLURM or Ray job not ended)."""
    return backend_of_run(run_dir).running(run_dir)


def no_log_yet(run_dir: Path, rank: int) -> str:
    have = sorted(n for n in _log_names(run_dir) if ATTEMPT.match(n))
    if have:
        return f"no log for rank {rank} in {run_dir / 'logs'}: logs there: {', '.join(have)}"
    return f"no log for rank {rank} in {run_dir / 'logs'}: {backend_of_run(run_dir).no_log_hint(run_dir)}"


def _log_names(run_dir: Path) -> List[str]:
    logs = run_dir / "logs"
    return sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []
