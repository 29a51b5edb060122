"""A launch()/submit() job as submitit shapes one: status, logs, wait, result, cancel.

Everything it knows comes from the backend interface (launcher.backends.base: describe, log_files, cancel) of
the engine that recorded the run, as the status, logs and cancel commands know it, plus the launcher process
this job started (its exit says a start failed before any record existed). Return values and tracebacks come
from the ranks' signed files (launcher.api.payload); summary.json names the rank that failed first.
"""

from __future__ import annotations

import codecs
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from launcher.api.payload import load_result, read_outcome
from launcher.backends import registry
from launcher.backends.base import Backend, Description
from launcher.errors import LaunchFailed
from launcher.runtime import safefs
from launcher.runtime.schema import Status

LAUNCHER_OUTPUT = "launcher.out"  # the child launcher's console, in the job's staging folder
RELEASED = "released"  # made there by a local job's launcher once the job completed (launcher.runtime.env.RELEASE)
POLL_S = 0.5
RELEASE_POLL_S = 0.02  # while a local job's launcher may say it completed: launch() returns within this of it
STOP_WAIT_S = 60.0
REFUSED = 2  # the launcher's exit code for bad input: refused before anything was made


class Job:
    """One job of launcher.submit: its run directory is `run_dir`, its id `job_id` (the run id)."""

    def __init__(self, run_dir: Path, kind: str, key: bytes, world_size: int, staging: Path,
                 process: Optional[subprocess.Popen], release: Optional[Path] = None) -> None:
        self.run_dir = Path(run_dir)
        self.job_id = self.run_dir.name
        self.kind = kind  # the engine expected to record the run (the record's own kind wins once it exists)
        self.world_size = world_size
        self._key = key
        self._staging = staging
        self._process = process  # the launcher this job started: runs a local job, submits a SLURM or Ray one
        self._release = release  # the file that launcher makes once the job completed, before its W&B run's end
        self._echoed = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two reads
        self._outcome: Optional[Union[List[Any], LaunchFailed]] = None  # result()'s, once the job ended

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, {self.status()}, run_dir={str(self.run_dir)!r})"

    # ------------------------------------------------------------ the state, from the engine

    def status(self) -> str:
        """The engine's word for the job now (RUNNING, COMPLETED, FAILED, CANCELLED, ...); PENDING before it has a
        record, FAILED where its launcher ended without making one (the reason: result())."""
        described = self._describe()
        if described is not None:
            return described.state
        return "PENDING" if self._starting() else "FAILED"

    def done(self) -> bool:
        described = self._describe()
        ended = described.final if described is not None else not self._starting()
        return ended and (self._process is None or self._process.poll() is not None)

    def wait(self, timeout: Optional[float] = None, echo: bool = False, completed: bool = False) -> str:
        """Block until the job ended; its final state. echo: copy the launcher's console to sys.stdout meanwhile.
        completed: return as soon as a local job's launcher says the job completed (summary.json written, its last
        line printed), while it ends the job's W&B run and exits.
        TimeoutError after timeout seconds (the job goes on)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        look = 0.0  # when to ask the engine again (a run's record is a dozen files: not at every pause)
        while not (completed and self._released()):
            if not self._starting() or time.monotonic() >= look:
                if self.done():
                    break
                look = time.monotonic() + POLL_S
            if echo:
                self._echo()
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} is still {self.status()} after {timeout} s; it goes on "
                                   f"(job.cancel() stops it)")
            self._pause()
        if echo:
            self._echo()
        return "COMPLETED" if completed and self._released() else self.status()

    def result(self) -> List[Any]:
        """The ranks' return values in rank order, once the job ended; LaunchFailed if it did not complete."""
        if self._outcome is None:
            state = self.wait(completed=True)
            released = self._released()  # (summary.json read once)
            described = None if released else self._describe()
            try:
                if not released and (described is None or described.exit_code != 0):
                    self._outcome = self._failure(state)
                else:
                    size = self.world_size_recorded()
                    self._outcome = [load_result(self._key, self.job_id, str(self.run_dir), r) for r in range(size)]
            except LaunchFailed as e:  # a rank's file missing or not signed by this job
                self._outcome = e
            shutil.rmtree(self._staging, ignore_errors=True)  # it ended: its call file (and key file) is not needed
        if isinstance(self._outcome, LaunchFailed):
            raise self._outcome
        return self._outcome

    def logs(self, rank: int = 0) -> str:
        """Rank's log so far (its restarted attempts' after), as `python -m launcher logs` reads it; "" before it has one."""
        if not self._recorded():
            return ""
        parts = [safefs.read_bytes(str(path), root=str(self.run_dir)) for path in self._backend().log_files(self.run_dir, rank)]
        return b"".join(parts).decode("utf-8", errors="replace")

    def cancel(self) -> str:
        """Stop the job through its engine (its run directory stays); a job that already ended is left alone."""
        if not self._recorded() and self._starting():
            if self.kind in ("local", "simulated", "multinode"):  # the launcher here: it stops, recording what it began
                assert self._process is not None
                self._process.send_signal(signal.SIGTERM)
                self._process.wait(STOP_WAIT_S)
                return f"cancelled {self.job_id} as it started; run directory {self.run_dir}"
            assert self._process is not None
            self._process.wait(STOP_WAIT_S)  # a submission: let it finish, then cancel what it submitted
        if not self._recorded():
            return f"job {self.job_id} never started; nothing to cancel"
        line = self._backend().cancel(self.run_dir)
        if self._process is not None:
            self._process.wait(STOP_WAIT_S)
        return line

    # ------------------------------------------------------------ what the run directory holds

    def world_size_recorded(self) -> int:
        recorded = self._summary().get("world_size")
        return recorded if isinstance(recorded, int) and recorded > 0 else self.world_size

    def _recorded(self) -> bool:
        """Whether the run has a record that this job's launcher made (one refused with exit 2, bad input, made none:
        a record there is another run's, which this job never reads or cancels)."""
        if self._process is not None and self._process.poll() == REFUSED:
            return False
        return (self.run_dir / "job.json").is_file() or (self.run_dir / "plan.json").is_file()

    def _starting(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _released(self) -> bool:
        """Whether this job's launcher said it completed (the file it makes in this job's own 0700 folder), with
        summary.json saying so too."""
        if self._release is None or not os.path.lexists(self._release):
            return False
        return self._summary().get("status") == Status.COMPLETED

    def _backend(self) -> Backend:
        return registry.backend_of_run(self.run_dir) if self._recorded() else registry.get(self.kind)

    def _describe(self) -> Optional[Description]:
        return self._backend().describe(self.run_dir) if self._recorded() else None

    def _summary(self) -> Dict[str, Any]:
        if not self._recorded():
            return {}
        try:
            data = json.loads(safefs.read_bytes(str(self.run_dir / "summary.json"), root=str(self.run_dir)))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _error(self, rank: int) -> Optional[str]:
        """Rank's signed traceback, where it raised."""
        data = read_outcome(self._key, self.job_id, str(self.run_dir), rank, "error")
        record = json.loads(data) if data is not None else None
        return str(record.get("traceback")) if isinstance(record, dict) else None

    def _failure(self, state: str) -> LaunchFailed:
        """One exception for a job that did not complete: the rank that failed first and its traceback."""
        summary = self._summary()
        cause = summary.get("root_cause")
        rank = cause.get("rank") if isinstance(cause, dict) and isinstance(cause.get("rank"), int) else None
        ranks = range(self.world_size_recorded()) if self._recorded() else range(0)
        errors = {r: tb for r in ranks if (tb := self._error(r)) is not None}
        if rank is None and errors:
            rank = min(errors)
        traceback = errors.get(rank, "") if rank is not None else ""
        said = str(summary.get("error") or "") or ("" if self._recorded() else self._output_tail())
        if rank is not None:
            what = traceback.strip().splitlines()[-1] if traceback.strip() else said
            message = f"rank {rank} failed: {what}"
        else:
            message = f"job {self.job_id} ended {state}" + (f": {said}" if said else "")
        message += f" (run directory {self.run_dir}; job.logs(rank) shows a rank's log)"
        if traceback:
            message += f"\n\nrank {rank}'s traceback:\n{traceback.rstrip()}"
        return LaunchFailed(message, rank=rank, traceback=traceback, state=state, run_dir=str(self.run_dir))

    def _pause(self) -> None:
        """POLL_S, or less: a local job ends with its launcher, and the wait ends with it, not up to POLL_S after."""
        if self._starting() and self._release is not None:
            time.sleep(RELEASE_POLL_S)  # its file, or the launcher's exit, is seen within this
        elif self._starting():
            assert self._process is not None
            try:
                self._process.wait(POLL_S)
            except subprocess.TimeoutExpired:
                pass
        else:
            time.sleep(POLL_S)

    def _output_tail(self) -> str:
        """The launcher's last line, for a job that failed before writing a summary (a refused submission)."""
        try:
            lines = (self._staging / LAUNCHER_OUTPUT).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _echo(self) -> None:
        try:
            with open(self._staging / LAUNCHER_OUTPUT, "rb") as f:
                f.seek(self._echoed)
                new = f.read()
        except OSError:
            return
        self._echoed += len(new)
        sys.stdout.write(self._decoder.decode(new))
        sys.stdout.flush()
