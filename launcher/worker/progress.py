"""A rank's progress from inside its worker: the watchdog's heartbeat file and stack dump, and a user script's
steps as its optimizer steps show them (per-rank step records, every launcher.log call). Stdlib only.

A worker never imports this file: launcher.worker.bootstrap executes it into a namespace of its own, so a
script's process holds no module of this project (the launcher imports it as launcher.worker.progress, for the
paths and the format below). launcher.runtime.beats reads the heartbeat files <run_dir>/heartbeats/rank-<k> and
stack dumps <run_dir>/stacks/rank-<k>.txt. One StepWatch per script worker is the global optimizer step post hook
(torch.optim.optimizer.register_optimizer_step_post_hook) that beats for the watchdog and records steps.

Per step it reads a clock, counts and keeps the interval (about a microsecond; bench/script_metrics.py). About
once a second (FLUSH_S; also at the first step and at the end) it appends one record to
<run_dir>/steps/rank-<k>.jsonl (its fields: launcher.runtime.schema.STEP, which also says how to measure the ones
with a `sample`), and rank 0 rewrites its attempt's goodput record (schema.GOODPUT). Every launcher.log call is
kept: its values, with the step they were logged at, become one line each of <run_dir>/series/rank-<k>.jsonl
(schema.SERIES) in the same window's write. The writes run on a thread of their own (launcher/worker/writer.py):
a step only counts, reads a clock and, once a window, hands the window over.

A step is a step of the first optimizer that steps (a GAN's two optimizers count once per iteration); when that
optimizer is gone or stops while another steps, the other takes over.
Samples come from the DataLoader the loop iterates (launcher/worker/loaders.py, executed into the same namespace
first: WORKER_FILES). Every file is opened through launcher/runtime/safefs.py (the bootstrap hands the worker a
copy as `safefs`, and one of launcher/runtime/schema.py as `schema`): nothing in the run directory is followed
through a symlink.
"""

import errno
import json
import os
import signal
import socket
import sys
import time
import weakref

TYPE_CHECKING = False  # typing's, without importing typing into a worker; type checkers read it as true
if TYPE_CHECKING:
    from typing import Any

    from launcher.worker.loaders import Loader  # a worker's is executed into this namespace

if "safefs" not in globals():  # imported by the launcher; a worker's bootstrap gives its own copies (no project module)
    from launcher.runtime import safefs, schema
if "Writer" not in globals():
    from launcher.worker.writer import Writer  # a worker's is executed into this namespace
if "Waits" not in globals():
    from launcher.worker.waits import Waits

# executed in this order into a worker's namespace (bootstrap spells it too)
WORKER_FILES = ("loaders.py", "writer.py", "waits.py", "progress.py")
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1  # launcher.runtime.beats
FLUSH_S = 1.0  # a record at most about this often
BEAT_INTERVAL_S = 0.5  # launcher.runtime.beats.BEAT_INTERVAL_S


def register_heartbeat(where: "dict | None") -> "str | None":
    """Announce this rank to the node's watchdog (launcher.agent.watchdog) and arm the stack dump."""
    if not where:
        return None
    run_dir, rank = where["run_dir"], where["rank"]
    path = os.path.join(run_dir, "heartbeats", f"rank-{rank}")
    record = {"rank": rank, "local_rank": where["local_rank"], "pid": os.getpid(), "host": socket.gethostname(),
              "thread": __import__("threading").get_ident()}
    tmp = f"{path}.{os.getpid()}.tmp"
    with safefs.open_file(tmp, "w", root=run_dir) as f:  # nothing in the run directory followed (docs/security.md)
        f.write(json.dumps(record) + "\n")
    os.utime(tmp, (0, 0), follow_symlinks=False)  # registered, never beat: not judged until the first heartbeat()
    safefs.replace(tmp, path, root=run_dir)
    stacks = os.path.join(run_dir, "stacks", f"rank-{rank}.txt")
    import faulthandler  # only here: a script run without the watchdog gets nothing it did not import

    global _stack_file
    # kept open: faulthandler writes to its fd. Appending: the agent empties the file before each dump,
    # and a plain fd would write the next dump at its old offset, after a run of NUL bytes.
    _stack_file = safefs.open_file(stacks, "a", root=run_dir)
    _stack_file.truncate(0)
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    return path


_stack_file = None


def watch_steps(where: "dict | None", beat: "str | None", loader: "Loader") -> "StepWatch | None":
    """Steps without code changes: every optimizer step of any torch.optim optimizer beats (as heartbeat() does)
    and, with `where`, is recorded: one global optimizer step post hook. A forked worker has torch from the zygote;
    a spawned one imports torch.optim here, as the zygote would. The hook's handle is watch.handle."""
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook
    except ImportError:  # no torch, or one too old for the hook: only heartbeat() is progress
        return None
    watch = StepWatch(where, beat, time.time(), loader)
    watch.handle = register_optimizer_step_post_hook(watch)
    return watch


def steps_file(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, schema.STEPS_DIR, f"rank-{rank}.jsonl")


def series_file(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, schema.SERIES_DIR, f"rank-{rank}.jsonl")


def goodput_file(run_dir: str, launch: str, attempt: int) -> str:
    return os.path.join(run_dir, schema.GOODPUT_DIR, f"{launch}-attempt-{attempt}.json")


class StepWatch:
    """Called by torch after every optimizer step of the process (see the module docstring)."""

    launcher_step_watch = True  # how launcher.runtime.log finds it among torch's global hooks

    def __init__(self, where: "dict | None", beat: "str | None", started_at: float, loader: "Loader") -> None:
        self.beat, self.beat_at = beat, 0.0
        self.where: dict = where or {}  # {}: nothing is recorded (fd -1)
        self.rank = int(where["rank"]) if where else -1
        self.started_at = started_at  # wall time the script's code started (the "launch" phase ends there)
        self.step = self.flushed_step = 0
        self.primary: "weakref.ref[object] | None" = None  # weakref to the optimizer whose steps count
        self.primary_stepped = self.other_stepped = False
        self.last_at: "float | None" = None  # perf_counter of the last step
        self.first_at: "float | None" = None  # wall time of the first step
        self.window_start = time.time()  # wall time: the last step of the previous window (or our start)
        self.next_flush = 0.0
        self.intervals: "list[float]" = []
        self.logged: "dict[str, Any]" = {}  # the window's last value of each key (its metrics.jsonl row's)
        self.per_rank: "dict[str, Any]" = {}
        self.series: "list[tuple]" = []  # every call of the window: (step, own step?, per_rank?, time, values)
        self.writer = Writer()
        self.waits = Waits() if where else None  # computing or waiting for the others, per window
        self.warned: "set[object]" = set()
        self.fd = None if where else -1
        self.goodput_fd = None if where and self.rank == 0 and where.get("launch") else -1
        self.series_fd = None if where else -1
        self.loader = loader  # a loaders.Loader: the DataLoader's batches per step
        self.wandb = bool(where and where.get("wandb") and self.rank == 0)
        self.handle: "Any" = None  # torch's handle of the hook (watch_steps sets it)

    def __call__(self, optimizer: object, args: object, kwargs: object) -> None:
        primary = self.primary() if self.primary is not None else None
        if primary is not optimizer:
            if primary is not None:
                self.other_stepped = True
                return
            self.primary = weakref.ref(optimizer)
        self.primary_stepped = True
        now = time.perf_counter()
        if self.last_at is None:
            self.first_at = time.time()
        else:
            self.intervals.append(now - self.last_at)
        self.last_at = now
        self.step += 1
        if self.waits is not None:
            self.waits.step()
        if now >= self.next_flush:
            self.flush(now)
        elif not self.loader.measured and self.loader.ref is not None:
            self.loader.measure(self.step)
        if self.beat and now - self.beat_at >= BEAT_INTERVAL_S:
            self.beat_at = now
            try:
                os.utime(self.beat, follow_symlinks=False)
            except OSError:
                pass  # the run directory went away: nothing to watch any more

    # ---- launcher.log

    def log(self, values: dict, per_rank: bool, step: "int | None" = None) -> None:
        """launcher.log: values at this step (the optimizer steps so far, or `step`), rank 0's or, with per_rank,
        every rank's: each call kept in the series, the window's last in its record."""
        if self.fd == -1 or (self.rank != 0 and not per_rank):
            return
        into, kept = self.per_rank if per_rank else self.logged, {}
        for key, value in values.items():
            if isinstance(value, (int, float)) or hasattr(value, "item"):
                value = value.detach() if hasattr(value, "detach") else value  # no autograd graph held till the write
                into[str(key)] = kept[str(key)] = value
            elif key not in self.warned:
                self.warned.add(key)
                print(f"launcher.log: {key!r} skipped: only numbers are recorded (it is a {type(value).__name__})",
                      file=sys.stderr)
        if kept:
            self.series.append((self.step if step is None else step, step is not None, per_rank, time.time(), kept))

    # ---- records

    def flush(self, now: float, final: bool = False) -> None:
        """Write this window's record (and rank 0's goodput record); start the next window."""
        self.next_flush = now + FLUSH_S
        if self.fd == -1:
            return
        wall = time.time()
        end = wall - (now - self.last_at) if self.last_at is not None else wall  # the window's last step (not the end of
        record = self.record(wall, end, final)                                 # a script that evaluates after training)
        self.flushed_step, self.window_start = self.step, end
        series, self.series = self.series, []
        goodput = self.goodput_record(end) if self.goodput_fd != -1 and self.first_at is not None else None
        self.writer.submit(lambda: self.write_window(record, series, goodput))
        if not self.primary_stepped and self.other_stepped:
            self.primary = None  # its optimizer stopped while another steps: that one counts from now on
        self.primary_stepped = self.other_stepped = False

    def record(self, wall: float, end: float, final: bool) -> dict:
        where = self.where
        record: "dict[str, Any]" = {"v": schema.STEP_FORMAT, "rank": self.rank, "attempt": int(where.get("attempt", 0)),
                                    "launch": where.get("launch"), "t": wall, "step": self.step,
                                    "steps": self.step - self.flushed_step, "window_s": max(0.0, end - self.window_start)}
        window, self.intervals = self.intervals, []
        if window:
            ordered = sorted(window)
            record.update(step_time_s=sum(window) / len(window), step_time_s_median=ordered[len(ordered) // 2],
                          step_time_s_max=ordered[-1])
        if self.flushed_step == 0 and self.first_at is not None:
            record["first_step_at"] = self.first_at
        if self.waits is not None:
            record.update(self.waits.take(record.get("step_time_s")))
        record.update(measured())
        record.update(self.loader.window(self.step, record["steps"]))
        if self.logged:  # tensors become numbers on the writer's thread (write_window)
            record["logged"], self.logged = self.logged, {}
        if self.per_rank:
            record["per_rank"], self.per_rank = self.per_rank, {}
        if final:
            record["final"] = True
        return record

    def write_window(self, record: dict, series: list, goodput: "dict | None") -> None:
        """On the writer's thread: the window's step record, its launcher.log calls and rank 0's goodput record."""
        for key in ("logged", "per_rank"):
            if key in record:
                record[key] = plain(record[key])
        if self.wandb:
            self.into_script_run(record)
        self.write(record)
        if series and self.series_fd != -1:
            self.write_series(record, series)
        if goodput is not None and self.goodput_fd != -1:
            self.write_goodput(goodput)

    def write(self, record: dict) -> None:
        if self.fd == -1:
            return
        try:
            if self.fd is None:
                self.fd = open_for_append(steps_file(self.where["run_dir"], self.rank), self.where["run_dir"])
            os.write(self.fd, (json.dumps(record) + "\n").encode())
        except (OSError, ValueError) as e:
            self.stop_writing(e)

    def write_series(self, record: dict, series: list) -> None:
        """One schema.SERIES line per launcher.log call, in one write."""
        head = {"v": schema.STEP_FORMAT, "rank": self.rank, "attempt": record["attempt"], "launch": record["launch"]}
        lines = [json.dumps({**head, "step": step, "own_step": own, "per_rank": per_rank, "t": at, "values": plain(values)})
                 for step, own, per_rank, at, values in series]
        try:
            if self.series_fd is None:
                self.series_fd = open_for_append(series_file(self.where["run_dir"], self.rank), self.where["run_dir"])
            if self.series_fd != -1:
                os.write(self.series_fd, ("\n".join(lines) + "\n").encode())
        except (OSError, ValueError) as e:
            self.stop_writing(e)

    def goodput_record(self, at: float) -> dict:
        """Its attempt's goodput record (schema.GOODPUT), its loop ending at `at` (the last step): a script's steps
        count as kept (it may keep checkpoints of its own)."""
        return {"first_step_at": self.first_at, "active_until": at, "start_step": 0, "step": self.step,
                "block_s": 0.0, "kept": {"step": self.step, "at": at, "block_s": 0.0},
                "marks": {"launch": self.started_at}}

    def write_goodput(self, record: dict) -> None:
        data = json.dumps(record).encode()
        try:
            if self.goodput_fd is None:
                where = self.where
                self.goodput_fd = open_for_rewrite(goodput_file(where["run_dir"], where["launch"], int(where.get("attempt", 0))),
                                                   where["run_dir"])
            os.pwrite(self.goodput_fd, data.ljust(schema.GOODPUT_RECORD_BYTES), 0)
        except (OSError, ValueError) as e:
            self.stop_writing(e)

    def stop_writing(self, e: Exception) -> None:
        """A full disk (or a vanished run directory) stops the records, never the training; said once."""
        self.fd = self.goodput_fd = self.series_fd = -1
        why = "its disk is full" if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) else str(e)
        print(f"launcher: step metrics of rank {self.rank} stop here ({why}); training goes on", file=sys.stderr)

    def into_script_run(self, record: dict) -> None:
        """The script's own W&B run gets the launcher's figures under launcher/ (commit=False: its step axis is its own)."""
        wandb = sys.modules.get("wandb")
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is None:
            return
        record["wandb"] = {"id": str(getattr(run, "id", "")), "project": str(getattr(run, "project", "")),
                           "name": str(getattr(run, "name", ""))}
        rows = [f.name for f in schema.STEP.fields.values() if f.rows or f.per_rank]  # what metrics.jsonl would show
        figures = {f"launcher/{k}": record[k] for k in ("step_time_s", *rows) if record.get(k) is not None}
        if record.get("window_s") and record["steps"]:
            figures["launcher/steps_per_s"] = record["steps"] / record["window_s"]
            if record.get("samples") is not None:
                figures["launcher/samples_per_s"] = record["samples"] / record["window_s"]
        try:
            run.log(figures, commit=False)
        except Exception:  # noqa: BLE001  (wandb raises many types; the script's run is the script's)
            self.wandb = False

    def close(self) -> None:
        """The script returned: the last window, marked final, and every write queued."""
        if self.waits is not None:
            self.waits.close()
        if self.fd != -1 and (self.step or self.logged or self.per_rank or self.series):
            self.flush(time.perf_counter(), final=True)
        self.writer.close()
        for fd in (self.fd, self.goodput_fd, self.series_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd = self.goodput_fd = self.series_fd = -1


def measured() -> dict:
    """The step record's fields the schema says how to measure (memory, and any a developer adds there)."""
    out = {}
    for field in schema.STEP.fields.values():
        if field.sample is not None:
            try:
                value = field.sample()
            except Exception:  # noqa: BLE001  (a measurement must never fail a training step)
                value = None
            if value is not None:
                out[field.name] = value
    return out


def plain(values: dict) -> dict:
    """Numbers only (tensors and NumPy scalars through .item(), once a window); non-finite kept as None."""
    out = {}
    for key, value in values.items():
        try:
            number = value.item() if hasattr(value, "item") else value
            number = float(number) if isinstance(number, bool) or not isinstance(number, int) else number
        except Exception:  # noqa: BLE001  (an .item() that fails is the script's business, not the record's)
            continue
        out[key] = number if number == number and number not in (float("inf"), float("-inf")) else None
    return out


def open_for_append(path: str, run_dir: str) -> int:
    """Create or append, never through a symlink (a shared output folder: docs/security.md)."""
    return safefs.open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, root=run_dir)


def open_for_rewrite(path: str, run_dir: str) -> int:
    return safefs.open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, root=run_dir)
