"""While a script's job runs: its workers' step records become metrics.jsonl rows and one W&B run.

One thread of the launcher on the node that runs rank 0 reads every rank's steps/rank-<k>.jsonl about once a
second (a run directory shared by the nodes) and appends a row per record of rank 0 (launcher.steps.rows). W&B
follows the built-in trainer's rules (launcher.runtime.wandb_logger: offline by default, one run per job
whose id is kept in wandb_run_id, wandb.mode), with one more: when the script started a W&B run of its own,
rank 0's worker puts the launcher's figures into that run (launcher/worker/progress.py) and no second run is made.
The decision waits for rank 0's first record, written at its first optimizer step, by which time a script has
called wandb.init. summary.json's figures come from the records themselves (launcher.rundir.finish), whatever
this thread managed to do.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from launcher.agent.ranklog import RankLog
from launcher.config.schema import Config
from launcher.runtime import safefs
from launcher.runtime.config import config_record
from launcher.runtime.schema import Status
from launcher.steps.records import StepFiles
from launcher.steps.rows import JobRows
from launcher.runtime.wandb_logger import SETTINGS, WandbLogger, import_wandb, job_labels, wandb_enabled

log = logging.getLogger("launcher")
POLL_S = 1.0
DECIDE_POLL_S = 0.2  # until the W&B run is settled: it starts at rank 0's first step, not up to a second later
JOIN_S = 5.0


class Collector:
    """start(), then drain() once the workers are done, finished(summary) once summary.json is written, then close()."""

    def __init__(self, cfg: Config, run_dir: str, world_size: int, owner: Callable[[], bool], per_node: int = 0) -> None:
        self.cfg, self.run_dir, self.owner = cfg, run_dir, owner
        self.named: Optional[int] = None  # the straggler rank the console was told of
        self.attempt = 0  # the newest attempt rows were made of
        self.files = StepFiles(run_dir)
        self.series = StepFiles(run_dir, series=True)
        self.calls: List[Dict[str, Any]] = []  # launcher.log calls read before the job's W&B run is decided
        self.rows = JobRows(cfg.metrics.straggler_fraction, world_size, per_node)
        self.fd: Optional[int] = None
        self.wandb: Optional[WandbLogger] = None
        self.decided = not wandb_enabled(cfg.wandb)  # whether this job's W&B run is settled
        self.making = False  # the launcher's W&B run is decided on and not made yet
        self.pending: List[Tuple[str, Any]] = []  # what goes to W&B while it is made
        self.summary: Optional[Dict[str, Any]] = None  # summary.json, once written (finished())
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="launcher-steps", daemon=True)

    def start(self) -> "Collector":
        self.thread.start()
        return self

    def _loop(self) -> None:
        imported = self.decided
        while not self.halt.wait(DECIDE_POLL_S if not self.decided else POLL_S):
            if not imported:  # wandb's import (seconds under load) while the workers start, not after a short job's end
                imported = True
                import_wandb()
            self.poll()
            self._make_wandb()

    def poll(self, final: bool = False) -> None:
        with self.lock:
            if not self.owner():
                return
            for record in sorted(self.files.new_records(), key=lambda r: r["t"]):
                self.rows.add(record)
                if record["rank"] == 0 and not self.decided:
                    self._decide(record)
            for row in self.rows.take(final):
                self._say_straggler(row, final)
                if row.get("attempt", 0) > self.attempt:
                    self._to_wandb("event", ("restart", f"attempt {row['attempt']} started at step {row['step']}"))
                self.attempt = max(self.attempt, int(row.get("attempt", 0)))
                self._write(row)
                self._to_wandb("log", self.rows.launcher_figures(row))
            self.calls += self.series.new_records()  # every launcher.log call, at the step it was made
            if self.decided:
                for call in self.calls:
                    self._to_wandb("log", self.rows.series_row(call))
                self.calls = []

    def drain(self) -> None:
        """The workers are done: the last records become rows (W&B, perhaps still starting, gets them in close())."""
        self.halt.set()
        try:
            self.poll(final=True)
        except Exception as e:  # noqa: BLE001  (the job's outcome matters more than its last rows)
            log.warning(f"the last step records were not read: {e}")

    def finished(self, summary: Dict[str, Any]) -> None:
        """summary.json is written: close() gives it to W&B."""
        self.summary = summary

    def close(self) -> None:
        """The job's end (its summary.json and last line out first, so that nobody waits for W&B): W&B gets the
        rows not yet sent and the summary, and the run ends."""
        self.drain()
        if self.thread.is_alive():  # it may be making the W&B run (wandb.init, bounded by its own timeout)
            self.thread.join(timeout=float(SETTINGS["init_timeout"]) + JOIN_S)
        if not self.thread.is_alive():
            self._make_wandb()  # decided at the very end
        with self.lock:
            if self.wandb is not None:
                summary = self.summary
                if summary:
                    status = summary.get("status")
                    if status in (Status.HUNG, Status.PREEMPTED, Status.INTERRUPTED, Status.FAILED):
                        self.wandb.event(str(status), str(summary.get("error") or status))
                    self.wandb.log_summary(summary)
                self.wandb.close(console_text(Path(self.run_dir)))
                self.wandb = None
            self.making, self.pending = False, []
            if self.fd is not None and self.fd >= 0:
                os.close(self.fd)
            self.fd = -1

    def _to_wandb(self, kind: str, what: Any) -> None:
        """A row ("log") or an event ((kind, text)) for the job's W&B run: sent, or kept while the run is made."""
        if self.wandb is not None:
            if kind == "log":
                self.wandb.log(what)
            else:
                self.wandb.event(*what)
        elif self.making:
            self.pending.append((kind, what))

    def _make_wandb(self) -> None:
        """Start the launcher's W&B run once decided on, outside the lock: wandb.init takes a second or more (its
        service, the run's folder), and the rows, metrics.jsonl and the job's end go on meanwhile."""
        with self.lock:
            if not self.making or self.wandb is not None:
                return
        logger = WandbLogger(self.cfg.wandb, config_record(self.cfg), self.run_dir, job_labels(self.cfg, self.run_dir))
        with self.lock:
            self.wandb, self.making = logger, False
            pending, self.pending = self.pending, []
            for kind, what in pending:
                self._to_wandb(kind, what)

    def _say_straggler(self, row: Dict[str, Any], final: bool) -> None:
        """The console hears of a straggler when one is named, and when it no longer is (not from the rows read at the
        end: the ranks' last windows end as each rank's script does)."""
        if "compute_s_per_rank" not in row:  # no verdict in this row either way
            return
        rank = row.get("straggler_rank")
        if rank is not None and rank != self.named:
            log.warning(f"straggler at step {row['step']}: {row['straggler']}; the other ranks wait for it")
            self._to_wandb("event", ("straggler", f"at step {row['step']}: {row['straggler']}"))
        elif rank is None and self.named is not None and not final:
            log.info(f"straggler gone at step {row['step']}: rank {self.named} keeps up again")
        if rank is not None or not final:
            self.named = rank

    def _write(self, row: Dict[str, Any]) -> None:
        if self.fd == -1:
            return
        try:
            if self.fd is None:
                self.fd = safefs.open_fd(str(Path(self.run_dir) / "metrics.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                         root=str(self.run_dir))
            os.write(self.fd, (json.dumps(row) + "\n").encode())
        except OSError as e:
            self.fd = -1
            why = "its disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else e.strerror or str(e)
            log.warning(f"metrics.jsonl stops here ({why}); the job goes on")

    def _decide(self, record: Dict[str, Any]) -> None:
        """At rank 0's first record: the script's own W&B run, or one of the launcher's (made by _make_wandb)."""
        self.decided = True
        if record.get("wandb"):
            log.info(f"W&B: the script's own run {record['wandb'].get('id')} gets the launcher's figures "
                     "(under launcher/); no second run")
        else:
            self.making = True


CONSOLE_BYTES = 8 << 20  # the console a W&B run gets: its newest this many bytes


def console_text(run_dir: Path) -> str:
    """The job's console as it came: the launcher's lines (logs/launcher.log) and every rank's, [rank<k>]: prefixed,
    in the order they arrived (their logs' .times records), the newest CONSOLE_BYTES of it."""
    lines: List[tuple] = []
    shown = False  # whether the launcher's last message was one the console showed (its next lines go with it)
    try:
        for text in safefs.read_bytes(str(run_dir / "logs" / "launcher.log"), root=str(run_dir)).decode(
                "utf-8", "replace").splitlines():
            parts = text.split(" ", 4)  # "2026-12-02 00:39:12,968 launcher INFO ...": logging's asctime, local time
            try:
                at = time.mktime(time.strptime(text[:19], "%Y-%m-%d %H:%M:%S")) + int(text[20:23]) / 1000
            except ValueError:  # a message's own next line
                if shown and lines:
                    lines.append((lines[-1][0], text))
                continue
            shown = len(parts) == 5 and parts[2] == "launcher" and parts[3] != "DEBUG"  # what the console showed
            if shown:
                lines.append((at, f"[launcher] {parts[4]}"))
    except OSError:
        pass
    for path in sorted((run_dir / "logs").glob("rank-*.log")):
        rank = path.name.split(".")[0].split("-")[1]
        if rank.isdigit() and not path.is_symlink():
            lines += [(at, text) for at, text in RankLog(path, int(rank)).read(finished=True)]
    text = "\n".join(line for _, line in sorted(lines, key=lambda item: item[0])) + "\n"
    return text[-CONSOLE_BYTES:]
