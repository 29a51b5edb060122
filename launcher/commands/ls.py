"""`python -m launcher ls [OUTPUT_DIR] [--status S] [--since 2h] [--json]`: every run, one line each: status, progress,
throughput, goodput, restarts, age and the command to run next.

The rows are launcher.runindex's; this module filters them and prints a table (or the rows as JSON).
A sweep, comparison or scaling sweep prints as its own line with its runs indented under it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.errors import ConfigError
from launcher.commands import table
from launcher.objectstore import runrecord
from launcher.objectstore.staging import name_left_behind
from launcher.runindex import STATUSES, list_runs
from launcher.runtime import formatting
from launcher.runtime.objects import is_url
from launcher.runtime.schema import Status
from launcher.usage import OneLineParser, reader_went_away

# sacct's final states for a job whose files say nothing (it never started its workers, or died with them)
SLURM_STATUS = {"COMPLETED": Status.COMPLETED, "CANCELLED": Status.INTERRUPTED, "FAILED": Status.FAILED,
                "TIMEOUT": Status.FAILED, "OUT_OF_MEMORY": Status.FAILED, "NODE_FAIL": Status.FAILED,
                "BOOT_FAIL": Status.FAILED, "DEADLINE": Status.FAILED, "RUNNING": Status.RUNNING,
                "PREEMPTED": Status.PREEMPTED, "REQUEUED": Status.PREEMPTED}
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
COLUMNS = ("run", "kind", "status", "step", "samples/s", "goodput", "restarts", "age", "command")
NUMERIC = ("samples/s", "goodput")  # right-aligned, as numbers are; `restarts` stays left: tests read it by column


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m launcher ls", description="List every run under an output directory: "
                      "status (live), progress, throughput, goodput, restarts, age, and what to run next.")
    p.add_argument("output_dir", nargs="?", default="launcher_runs", metavar="OUTPUT_DIR",
                   help="where the runs are (default launcher_runs); a sweep folder lists its runs")
    p.add_argument("--status", metavar="S", help=f"only runs with this status: {', '.join(STATUSES)} (comma-separated for several)")
    p.add_argument("--since", metavar="WHEN", help="only runs started since: 30m, 2h, 1d, or an ISO date/time (2026-11-23T10:00)")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list (the board reads the same; "
                   "`metrics`: the newest metrics.jsonl row's figures)")
    p.add_argument("--slurm", action="store_true", help="ask SLURM (one sacct call) about SLURM runs whose files "
                   "cannot tell: queued, or ended without a summary")
    return p


def main(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)  # usage errors: launcher.usage.with_error_contract turns SystemExit into the exit code
    root = Path(args.output_dir)
    remote = is_url(args.output_dir)  # output_dir=s3://...: the records read from the store
    if not remote:
        check_readable(root)
    wanted = parse_statuses(args.status) if args.status else None
    since = parse_since(args.since, time.time()) if args.since else None
    rows = runrecord.list_runs(args.output_dir, name_left_behind(args.output_dir)) if remote else list_runs(root)
    if args.slurm:
        ask_slurm(rows)
    rows = filter_rows(rows, wanted, since)
    try:
        if args.json:
            # one row a line: json's C encoder (indent= falls back to pure Python, 3x slower over 1,000 runs)
            body = ",\n".join(json.dumps(row, default=str) for row in rows)
            sys.stdout.write(f"[\n{body}\n]\n" if rows else "[]\n")
        else:
            print_table(rows)
        sys.stdout.flush()
    except BrokenPipeError:
        return reader_went_away()
    return 0


def check_readable(root: Path) -> None:
    """root is a folder this process may list: none there, or one it may not read (/proc/1/root), is one line."""
    try:
        os.scandir(root).close()
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"no directory {root}: pass the output directory that holds the runs "
                          f"(`python -m launcher ls DIR`; the default is launcher_runs)") from None
    except OSError as e:
        raise ConfigError(f"{root}: cannot read it ({e.strerror or e.__class__.__name__}): pass an output "
                          "directory you may read") from e


def ask_slurm(rows: List[Dict[str, Any]]) -> None:
    """Fill in status from sacct for SLURM rows the files leave unknown or dead; adds slurm_state to each."""
    from launcher.backends.slurm.records import job_states  # only with --slurm: ls itself never asks

    flat = [m for row in rows for m in [row, *(row.get("members") or [])]]
    asked = [r for r in flat if r.get("slurm_job_id") and r["status"] in (Status.UNKNOWN, Status.DEAD)]
    states = job_states([str(r["slurm_job_id"]) for r in asked]) if asked else {}
    for row in asked:
        state = states.get(str(row["slurm_job_id"]), "UNKNOWN")
        row["slurm_state"] = state
        row["status"] = SLURM_STATUS.get(state, Status.UNKNOWN)  # PENDING, REQUEUED, ...: it may run yet


def parse_statuses(text: str) -> List[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in chosen if s not in STATUSES]
    if bad or not chosen:
        raise ConfigError(f"--status {text}: choose from {', '.join(STATUSES)}")
    return chosen


def parse_since(text: str, now: float) -> float:
    """30m / 2h / 1d / 1w ago, or an ISO date or date-time (local time unless it names a zone)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if re.fullmatch(r"\s*-\s*\d.*", text):
        raise ConfigError(f"--since {text}: say how long ago without a sign, e.g. --since {text.strip()[1:].strip()} "
                          "(the runs started in that time)")
    if match:
        return now - float(match.group(1)) * UNITS[match.group(2)]
    try:
        return datetime.datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise ConfigError(f"--since {text}: expected a duration such as 30m, 2h, 1d, or an ISO date such as "
                          f"2026-11-23 or 2026-11-23T10:00") from None


def filter_rows(rows: List[Dict[str, Any]], statuses: Optional[List[str]], since: Optional[float]) -> List[Dict[str, Any]]:
    """Keep rows that match; a sweep (or compare, scale) stays when any of its runs matches, with those runs only."""
    kept = []
    for row in rows:
        if since is not None and (row["started"] or 0) < since:
            continue
        if statuses is not None and "members" in row:
            members = [m for m in row["members"] if m["status"] in statuses]
            if row["status"] not in statuses and not members:
                continue
            row = {**row, "members": members if row["status"] not in statuses else row["members"]}
        elif statuses is not None and row["status"] not in statuses:
            continue
        kept.append(row)
    return kept


def print_table(rows: List[Dict[str, Any]]) -> None:
    if not rows:
        print("no runs")
        return
    lines: List[List[str]] = []
    under: Dict[int, List[str]] = {}
    for row in rows:
        lines.append(cells(row, row["run_id"]))
        under[len(lines) - 1] = failure_line(row, "  ")
        for member in row.get("members") or []:
            varied = " ".join(f"{k}={v}" for k, v in (member.get("overrides") or {}).items())
            lines.append(cells(member, f"  {member['run_id']}" + (f" [{varied}]" if varied else "")))
            under[len(lines) - 1] = failure_line(member, "    ")
    table.print_table(COLUMNS, lines, right=NUMERIC, under=under)
    counts: Dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    print(f"{len(rows)} run(s): " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))


def failure_line(row: Dict[str, Any], indent: str) -> List[str]:
    """Under a failed run, what failed first (its summary's error: the root-cause rank, not rank 0's knock-on);
    under a damaged one, why its files could not be read; under a preempted one, when and whether it is requeued."""
    if row["status"] == Status.DAMAGED:
        return [f"{indent}{row['error']}"]
    if row.get("spares"):  # hot spares, and each lost node's replacement
        said = "".join(f"; {r.get('left')} replaced by {r.get('by')}" for r in row.get("replaced") or [])
        return [f"{indent}{row['spares']} hot spare{'s' if row['spares'] > 1 else ''}{said}",
                *failure_line({**row, "spares": 0}, indent)]
    if row["status"] == Status.PREEMPTED and row.get("note"):
        return [f"{indent}{row['note']}"]
    return [f"{indent}error: {row['error']}"] if row["status"] == Status.FAILED and row.get("error") else []


def cells(row: Dict[str, Any], name: str) -> List[str]:
    step = "" if row["step"] is None else str(row["step"])
    if row["steps"] is not None:
        step = f"{step or 0}/{row['steps']}"
    return [
        name, row["kind"], row["status"], step,
        formatting.rate(row["throughput"]), formatting.share(row["goodput"]),
        str(row["restarts"] or 0), formatting.age(row["age_s"]), row["command"],
    ]

