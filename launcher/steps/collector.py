"""While a script's job runs: its workers' step records become metrics.jsonl rows and one W&B run.

One thread of the launcher on the node that runs rank 0 reads every rank's steps/rank-<k>.jsonl about once a
second (a run directory shared by the nodes) and appends a row per record of rank 0 (launcher.steps.rows). W&B
follows the built-in trainer's rules (launcher.trainers.metrics.wandb_logger: offline by default, one run per job
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
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from launcher.config.schema import Config
from launcher.runtime import safefs
from launcher.runtime.config import config_record
from launcher.steps.records import StepFiles
from launcher.steps.rows import JobRows
from launcher.trainers.metrics.wandb_logger import WandbLogger, wandb_enabled

log = logging.getLogger("launcher")
POLL_S = 1.0
JOIN_S = 5.0


class Collector:
    """start(), then drain() once the workers are done, then close(summary) once summary.json is written."""

    def __init__(self, cfg: Config, run_dir: str, world_size: int, owner: Callable[[], bool]) -> None:
        self.cfg, self.run_dir, self.owner = cfg, run_dir, owner
        self.files = StepFiles(run_dir)
        self.rows = JobRows(cfg.metrics.straggler_fraction, world_size)
        self.fd: Optional[int] = None
        self.wandb: Optional[WandbLogger] = None
        self.decided = not wandb_enabled(cfg.wandb)  # whether this job's W&B run is settled
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="launcher-steps", daemon=True)

    def start(self) -> "Collector":
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not self.halt.wait(POLL_S):
            self.poll()

    def poll(self, final: bool = False) -> None:
        with self.lock:
            if not self.owner():
                return
            for record in sorted(self.files.new_records(), key=lambda r: r["t"]):
                self.rows.add(record)
                if record["rank"] == 0 and not self.decided:
                    self._decide(record)
            for row in self.rows.take(final):
                self._write(row)
                if self.wandb is not None:
                    self.wandb.log(row)

    def drain(self) -> None:
        """The workers are done: the last records become rows."""
        self.halt.set()
        if self.thread.is_alive():
            self.thread.join(timeout=JOIN_S)
        try:
            self.poll(final=True)
        except Exception as e:  # noqa: BLE001  (the job's outcome matters more than its last rows)
            log.warning(f"the last step records were not read: {e}")

    def close(self, summary: Optional[Dict[str, Any]]) -> None:
        """summary.json is written: W&B gets it, and the run ends."""
        self.drain()
        with self.lock:
            if self.wandb is not None:
                if summary:
                    self.wandb.log_summary(summary)
                self.wandb.close()
                self.wandb = None
            if self.fd is not None and self.fd >= 0:
                os.close(self.fd)
            self.fd = -1

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
        """At rank 0's first record: the script's own W&B run, or one of the launcher's."""
        self.decided = True
        if record.get("wandb"):
            log.info(f"W&B: the script's own run {record['wandb'].get('id')} gets the launcher's figures "
                     "(under launcher/); no second run")
        else:
            self.wandb = WandbLogger(self.cfg.wandb, config_record(self.cfg), self.run_dir)
