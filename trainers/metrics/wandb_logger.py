"""Weights & Biases logging: one run per job, from rank 0 only, that never stops the training.

wandb is imported lazily (it is slow to import) and every call is guarded: the first failure
warns once on the console and the logger turns itself off; metrics.jsonl stays the full record.
The run id lives in <run_dir>/wandb_run_id so a restarted or requeued job resumes the same run.
"""

from __future__ import annotations

import os
import queue
import secrets
import sys
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.runtime import safefs

RUN_ID_FILE = "wandb_run_id"
# Files of the run directory attached to the W&B run when it closes.
KEY_FILES = ("config.yaml", "plan.json", "metrics.jsonl", "logs/launcher.log")
# Bounds on wandb's own network waits, so a dead server or bad key costs seconds, not minutes.
SETTINGS = {"init_timeout": 10, "login_timeout": 5, "finish_timeout": 10, "x_graphql_retry_max": 0,
            "x_graphql_timeout_seconds": 5, "x_file_stream_retry_max": 1, "x_file_stream_timeout_seconds": 5,
            "x_file_transfer_retry_max": 1, "x_file_transfer_timeout_seconds": 5, "x_disable_stats": True,
            "console": "off", "silent": True}


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

    def __init__(self, wandb_cfg: Any, config: Dict[str, Any], run_dir: Optional[str]) -> None:
        self._run: Any = None
        self._warned = False
        self._run_dir = Path(run_dir) if run_dir else None
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
        return wandb.init(
            project=wandb_cfg.project, entity=wandb_cfg.entity, group=wandb_cfg.group,
            tags=list(wandb_cfg.tags) or None, mode=wandb_cfg.mode, id=run_id, resume="allow",
            dir=folder, config=config, name=self._run_dir.name if self._run_dir else None,
            settings=wandb.Settings(**SETTINGS), reinit="finish_previous",
        )

    @property
    def active(self) -> bool:
        return self._run is not None

    def log(self, metrics: Dict[str, Any]) -> None:
        if self._run is not None:
            # per-rank lists stay in metrics.jsonl (the board's heatmap); W&B charts scalars
            self._queue.put(("log", {k: v for k, v in metrics.items() if v is not None and not isinstance(v, list)}))

    def log_summary(self, summary: Dict[str, Any]) -> None:
        if self._run is not None:
            flat = {**summary, **{f"{k}/{sub}": v for k, d in summary.items() if isinstance(d, dict) for sub, v in d.items()}}
            self._queue.put(("summary", {k: v for k, v in flat.items() if isinstance(v, (int, float, str, bool))}))

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
                if kind == "log":
                    run.log(values, step=int(values.get("step", 0)))
                else:
                    for key, value in values.items():
                        run.summary[key] = value
            except Exception as e:
                self._fail("stopped logging" if kind == "log" else "could not write the summary", e)

    def close(self) -> None:
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

        run = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.entity, group=wandb_cfg.group,
                         tags=list(wandb_cfg.tags) or None, mode=wandb_cfg.mode, dir=str(run_dir), config=config,
                         name=name, job_type="scale", settings=wandb.Settings(**SETTINGS), reinit="finish_previous")
        table = wandb.Table(columns=columns, data=rows)
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
