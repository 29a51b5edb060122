"""Weights & Biases logging: one run per job, from rank 0 only, that never stops the training.

wandb is imported lazily (it is slow to import) and every call is guarded: the first failure
warns once on the console and the logger turns itself off; metrics.jsonl stays the full record.
The run id lives in <run_dir>/wandb_run_id so a restarted or requeued job resumes the same run.

What the run holds beside the logged rows: every node's machine (launcher.runtime.system's records, read
here every SYSTEM_S: system/node<k>/...; wandb's own system monitor, rank 0's machine alone, stays off), each
per-rank list of a row as one series a rank (<name>/rank<k>), the job's events as history marks
(events/<kind>: 1 at their step) and W&B alerts, the console (output.log, from the run's logs at its end), the
script's own arguments in its config (script_args), and by default the run id as its group and the engine,
nodes x workers and strategy (or "script") as tags. The history holds numbers only.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

from launcher.config.secrets import redact, redact_argv
from launcher.runtime import safefs
from launcher.runtime.goodput import said_change
from launcher.runtime.system import SystemFiles, as_history

RUN_ID_FILE = "wandb_run_id"
# Files of the run directory attached to the W&B run when it closes.
KEY_FILES = ("config.yaml", "plan.json", "metrics.jsonl", "logs/launcher.log")
SYSTEM_S = 5.0  # how often the sender reads every node's system records
MAX_RANK_SERIES = 64  # ranks whose per-rank values get a series each (a larger job's lists stay in metrics.jsonl)
# Bounds on wandb's own network waits, so a dead server or bad key costs seconds, not minutes.
SETTINGS: Dict[str, Any] = {"init_timeout": 10, "login_timeout": 5, "finish_timeout": 10, "x_graphql_retry_max": 0,
            "x_graphql_timeout_seconds": 5, "x_file_stream_retry_max": 1, "x_file_stream_timeout_seconds": 5,
            "x_file_transfer_retry_max": 1, "x_file_transfer_timeout_seconds": 5, "x_disable_stats": True,
            "console": "off", "silent": True}


@contextlib.contextmanager
def argv_redacted() -> Iterator[None]:
    """sys.argv as the run's records show it (launcher.config.secrets) while wandb.init reads it into the run's
    `args` metadata, which an online run uploads; this process's own argv again afterwards."""
    real = sys.argv
    sys.argv = [*real[:1], *redact_argv(real[1:])]
    try:
        yield
    finally:
        sys.argv = real


def read_or_create_run_id(run_dir: Path) -> str:
    """The job's W&B run id: the stored one after a restart, otherwise a new one, stored at once."""
    path = run_dir / RUN_ID_FILE
    if path.is_file():
        stored = safefs.read_bytes(str(path), root=str(run_dir)).decode("utf-8").strip()
        if stored:
            return stored
    run_id = secrets.token_hex(4)
    with safefs.open_file(str(path), "w", root=str(run_dir), encoding="utf-8") as f:  # never through a planted link
        f.write(run_id + "\n")
    return run_id


class WandbLogger:
    """A MetricsLogger that sends to one W&B run; any W&B error warns once and disables it.

    ``log`` and ``log_summary`` only queue: a thread of this process hands them to wandb, so the
    training loop never waits for wandb's serialisation (0.5-3 ms a call here) and the thread runs
    while the loop waits in collectives. ``close`` drains the queue within wandb's finish timeout.
    """

    def __init__(self, wandb_cfg: Any, config: Dict[str, Any], run_dir: Optional[str],
                 labels: Optional[Tuple[str, List[str]]] = None) -> None:
        """labels: the job's default group and tags (job_labels), where the config names none."""
        self._run: Any = None
        self._warned = False
        self._run_dir = Path(run_dir) if run_dir else None
        self._labels = labels
        self._system = SystemFiles(str(run_dir)) if run_dir else None
        self._step = 0  # the newest step logged: system figures and events are charted there
        self._queue: "queue.Queue[Optional[Tuple[str, Dict[str, Any]]]]" = queue.Queue()
        self._sender: Optional[threading.Thread] = None
        try:
            self._run = self._init(wandb_cfg, config)
        except Exception as e:  # wandb raises many types (CommError, UsageError, timeouts ...)
            self._fail("could not start", e)
        if self._run is not None:
            self._sender = threading.Thread(target=self._send, name="wandb-logger", daemon=True)
            self._sender.start()

    def _init(self, wandb_cfg: Any, config: Dict[str, Any]) -> Any:
        import wandb

        run_id = read_or_create_run_id(self._run_dir) if self._run_dir else None
        folder = str(self._run_dir) if self._run_dir else None  # wandb makes <run_dir>/wandb/
        group, tags = self._labels or (None, [])
        with argv_redacted():
            run = wandb.init(
                project=wandb_cfg.project, entity=wandb_cfg.entity, group=redact(wandb_cfg.group) or group,
                tags=redact(list(wandb_cfg.tags)) or tags or None, mode=wandb_cfg.mode, id=run_id, resume="allow",
                dir=folder, config=config, name=self._run_dir.name if self._run_dir else None,
                settings=wandb.Settings(**SETTINGS), reinit="finish_previous",
            )
        # every chart over the logged "step", not wandb's count of log calls: a launcher.log value logged at an
        # earlier step than the row before it (rows come once a second) is still charted where it belongs
        run.define_metric("step")
        run.define_metric("*", step_metric="step")
        return run

    @property
    def active(self) -> bool:
        return self._run is not None

    def log(self, metrics: Dict[str, Any]) -> None:
        if self._run is not None:
            self._queue.put(("log", history_row(metrics)))

    def event(self, kind: str, text: str, level: str = "WARN") -> None:
        """A job event (restart, membership change, preemption, hang, straggler): a history mark at the newest step
        and a W&B alert."""
        if self._run is not None:
            self._queue.put(("event", {"kind": kind, "text": text, "level": level}))

    def log_summary(self, summary: Dict[str, Any]) -> None:
        if self._run is not None:
            changes = summary.get("membership_changes") or []
            for change in changes:  # who left, who took the place (a hot spare), when
                self.event("membership", said_change(change), level="INFO")
            if changes:
                summary = {**summary, "membership_changes": len(changes),
                           "replacements": sum(len(c.get("replaced") or []) for c in changes),
                           "evictions": sum(1 for c in changes if c.get("evicted"))}
            flat = {**summary, **{f"{k}/{sub}": v for k, d in summary.items() if isinstance(d, dict) for sub, v in d.items()}}
            # str(v): a plain string for a str Enum too (summary.json's status), as wandb serialises it
            self._queue.put(("summary", {k: str(v) if isinstance(v, str) else v for k, v in flat.items()
                                         if isinstance(v, (int, float, str, bool))}))

    def _send(self) -> None:
        """The sender thread: hands queued records to wandb in order until close()."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, values = item
            run = self._run
            if run is None:
                continue  # failed earlier: drop the rest, metrics.jsonl has them
            try:
                self._system_figures(run, last=kind == "last")
                if kind in ("log", "last"):
                    self._step = max(self._step, int(values.get("step") or 0))
                    run.log(values)  # at its own "step" (define_metric above)
                elif kind == "event":
                    run.log({"step": self._step, f"events/{values['kind']}": 1})
                    run.alert(title=f"{values['kind']}: {self._run_dir.name if self._run_dir else 'job'}",
                              text=values["text"], level=values["level"], wait_duration=0)
                else:
                    for key, value in values.items():
                        run.summary[key] = value
            except Exception as e:
                self._fail("stopped logging" if kind == "log" else "could not write the summary", e)

    def _system_figures(self, run: Any, last: bool = False) -> None:
        """Every node's machine since the last look (at most every SYSTEM_S; the last look whenever), at the newest step."""
        now = time.monotonic()
        if self._system is None or (now < getattr(self, "_system_at", 0.0) and not last):
            return
        self._system_at = now + SYSTEM_S
        for line in self._system.new_lines():
            run.log({"step": self._step, **as_history(line)})

    def close(self, console: Optional[str] = None) -> None:
        """console: the job's console as its lines came (output.log of the run)."""
        if self._run is not None and console:
            try:
                with open(Path(self._run.dir) / "output.log", "w", encoding="utf-8") as f:
                    f.write(console)
            except OSError:
                pass  # the run's own folder: its console is the only thing lost
        if self._run is not None:
            # every node's last system figures (each node's sampler writes one as it ends), however soon after the look before
            self._queue.put(("last", {"step": self._step}))
        if self._sender is not None:
            self._queue.put(None)
            self._sender.join(timeout=float(SETTINGS["finish_timeout"]))
            if self._sender.is_alive():
                self._fail("could not keep up", TimeoutError(f"records still queued after {SETTINGS['finish_timeout']}s"))
            self._sender = None
        if self._run is None:
            return
        try:
            self._attach_files()
            self._run.finish()
        except Exception as e:
            self._fail("could not finish the run", e)
        self._run = None

    def _attach_files(self) -> None:
        if self._run_dir is None:
            return
        # Copied into the W&B run's files folder (uploaded with the run, by `wandb sync` when offline);
        # run.save() would symlink them and warn once per file.
        files = Path(self._run.dir)
        for name in KEY_FILES:
            try:
                data = safefs.read_bytes(str(self._run_dir / name), root=str(self._run_dir))
            except OSError:  # not written, or a link planted in its place: never uploaded
                continue
            with safefs.open_file(str(files / name), "wb", root=str(files)) as f:
                f.write(data)

    def _fail(self, what: str, error: BaseException) -> None:
        if not self._warned:
            first = (str(error).strip().splitlines() or [error.__class__.__name__])[0]
            print(f"warning: W&B {what} ({error.__class__.__name__}: {first}); "
                  "training continues, metrics.jsonl has every logged value", file=sys.stderr, flush=True)
            self._warned = True
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish(exit_code=1)
            except Exception:
                pass  # already warned; a broken run cannot be closed any better


def history_row(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """What of a row W&B's history gets: numbers only (a string belongs in the summary or the config), and each
    per-rank list as one series a rank."""
    out: Dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, list) and key.endswith("_per_rank") and len(value) <= MAX_RANK_SERIES:
            name = key[:-len("_per_rank")]
            out.update({f"{name}/rank{r}": v for r, v in enumerate(value) if isinstance(v, (int, float))})
        elif isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, bool):
            out[key] = value
    return out


def job_labels(cfg: Any, run_dir: Optional[str]) -> Tuple[str, List[str]]:
    """A job's default W&B group (its run id: a sweep member's runs, a restarted job's, gather there) and tags:
    the engine, nodes x workers per node, and the strategy or "script"."""
    kind = "script" if cfg.script.path else str(cfg.trainer.strategy)
    return (Path(run_dir).name if run_dir else str(cfg.run_id or "job"),
            [str(cfg.cluster), f"{cfg.nodes}x{cfg.gpus}", kind])


def import_wandb() -> None:
    """wandb's import alone, ahead of a run (it changes no environment variable; starting its service would, and a
    worker started after it would inherit that); any failure is left to the run's own start, which warns."""
    try:
        import wandb  # noqa: F401
    except Exception:  # noqa: BLE001  (a broken install: WandbLogger says so when it starts)
        pass


def wandb_enabled(wandb_cfg: Any) -> bool:
    return wandb_cfg is not None and wandb_cfg.mode != "disabled" and os.environ.get("WANDB_MODE") != "disabled"


def log_table(wandb_cfg: Any, name: str, columns: List[str], rows: List[List[Any]], config: Dict[str, Any],
              run_dir: Path, charts: Dict[str, tuple], images: Dict[str, Path]) -> Optional[str]:
    """One W&B run holding a table, line charts over it and images (the scaling sweep's record).

    Returns a warning line instead of raising when W&B fails.
    """
    if not wandb_enabled(wandb_cfg):
        return None
    try:
        import wandb

        with argv_redacted():
            run = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.entity, group=redact(wandb_cfg.group),
                             tags=redact(list(wandb_cfg.tags)) or None, mode=wandb_cfg.mode, dir=str(run_dir), config=config,
                             name=name, job_type="scale", settings=wandb.Settings(**SETTINGS), reinit="finish_previous")
        table = wandb.Table(columns=list(columns), data=rows)  # a list[str | int], as wandb types it
        logged: Dict[str, Any] = {"scale_table": table}
        for key, (x, y, title) in charts.items():
            logged[key] = wandb.plot.line(table, x, y, title=title)
        for key, path in images.items():
            logged[key] = wandb.Image(str(path))
        run.log(logged)
        run.finish()
        return None
    except Exception as e:
        return f"warning: W&B logging of the sweep failed ({e.__class__.__name__}); scale.json has everything"
