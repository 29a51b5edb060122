"""The run directory: <output_dir>/<run_id>/ with config.yaml, plan.json, logs/, metrics.jsonl, summary.json.

Every backend prepares it and writes summary.json through this module, so each run directory
has the same files and each summary the same base fields, wherever the job ran.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.config.schema import Config, MetricsConfig, to_yaml
from launcher.config.secrets import redact
from launcher.errors import ConfigError
from launcher.logs import setup_launcher_logging
from launcher.plan import LaunchPlan, job_workers
from launcher.provenance import capture
from launcher.runtime import formatting, safefs
from launcher.steps.records import read_records
from launcher.steps.rows import summary_figures
from launcher.trainers.metrics.goodput import format_goodput, job_goodput, membership_changes
from launcher.worker.progress import STEPS_DIR

SUMMARY_KEYS = (
    "run_id", "status", "world_size", "nodes", "gpus_per_node", "backend", "device_type", "strategy",
    "model", "steps", "global_batch_size", "samples_per_s", "step_time_s_median", "final_loss",
    "param_checksum", "time_to_first_step_s", "wall_s", "restarts", "goodput", "badput_s",
)


def check_can_create(output_dir: str) -> None:
    """Before torch loads: output_dir cannot lie under a file. create_run_dir is the real test (permissions, a
    read-only disk) and says the same; this only names early, in the same words, what is sure to fail there."""
    path = Path(os.path.abspath(output_dir))
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    if existing is not None and os.path.exists(existing) and not os.path.isdir(existing):  # (dangling: left to it)
        raise ConfigError(f"output_dir={output_dir} cannot be written ({os.strerror(errno.ENOTDIR)}): "
                          f"pick another with output_dir=PATH")


def create_run_dir(output_dir: str, run_id: str) -> Path:
    """Make <output_dir>/<run_id>/logs, or say why it cannot be made."""
    top = Path(output_dir).resolve()  # output_dir: resolved once (plan.json records the run directory under it)
    run_dir = top / run_id
    try:
        top.mkdir(parents=True, exist_ok=True)
        safefs.make_dirs(str(run_dir / "logs"), root=str(top))  # below output_dir: nothing followed
        # a probe of our own: nodes sharing the directory (one box, NFS) create it at the same time
        probe = str(run_dir / f".write-test-{os.getpid()}-{time.monotonic_ns()}")
        os.close(safefs.open_fd(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, root=str(run_dir)))
        os.unlink(probe)
    except safefs.PlantedLinkError:
        raise
    except OSError as e:
        raise ConfigError(
            f"output_dir={output_dir} cannot be written ({e.strerror or e}): pick another with output_dir=PATH"
        ) from e
    return run_dir


def archive_rank_logs(run_dir: Path, folder: str) -> Optional[Path]:
    """Move the earlier launch's rank logs into logs/<folder>/ so a new launch's logs start afresh beside them; a
    script's step records likewise into steps/<folder>/ (steps/ then holds this launch's, whichever node wrote them)."""
    archive(run_dir / STEPS_DIR, "rank-*.jsonl", folder)
    return archive(run_dir / "logs", "rank-*", folder)


def archive(where: Path, pattern: str, folder: str) -> Optional[Path]:
    old = sorted(p for p in where.glob(pattern) if not p.is_symlink()) if where.is_dir() and not where.is_symlink() else []
    if not old:
        return None
    keep = where / folder
    keep.mkdir(exist_ok=True)
    for path in old:
        path.replace(keep / path.name)
    return keep


def write_atomic(path: Path, text: str, root: Optional[Path] = None) -> None:
    """Write to a temporary file, fsync, rename: readers never see half a file. Nothing below root (the
    run directory; path's folder by default) is followed: a link planted there is refused (launcher.runtime.safefs)."""
    if root is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    where = str(root or path.parent)
    safefs.make_dirs(str(path.parent), root=where)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = safefs.open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666, root=where)  # 0o666: the umask applies
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        safefs.replace(tmp, str(path), root=where)  # a link at path is replaced itself, never written through
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def read_node_record(run_dir: Path, node: Optional[int]) -> Dict[str, Any]:
    """nodes/node-K.json as that node's launcher wrote it (launcher.backends.node), read back from a shared folder and
    so checked: {} where it is missing, a link or no record; a status, error or root cause of the wrong shape left out."""
    try:
        record = json.loads(safefs.read_bytes(str(run_dir / "nodes" / f"node-{node}.json"), root=str(run_dir)))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict):
        return {}
    checked = {k: v for k, v in record.items() if k not in ("status", "error", "root_cause")}
    checked.update({k: record[k] for k in ("status", "error") if isinstance(record.get(k), str)})
    cause = record.get("root_cause")
    if isinstance(cause, dict) and isinstance(cause.get("rank"), int) and not isinstance(cause.get("rank"), bool):
        checked["root_cause"] = cause
    return checked


def build_summary(base: Dict[str, Any], rank0: Dict[str, Any] | None) -> Dict[str, Any]:
    """The launcher's facts (status, sizes, wall time) merged with rank 0's training figures."""
    summary: Dict[str, Any] = {key: None for key in SUMMARY_KEYS}
    summary.update(base)
    if rank0:
        for key, value in rank0.items():
            if key not in ("rank", "restart_count") and summary.get(key) is None:
                summary[key] = value
    return summary


def prepare_run_dir(cfg: Config, plan: LaunchPlan, started: float) -> logging.Logger:
    """config.yaml, plan.json and the launcher's log in a created run directory; say what will run."""
    run_dir = Path(plan.run_dir)
    log = setup_launcher_logging(run_dir / "logs" / "launcher.log")
    write_atomic(run_dir / "config.yaml", to_yaml(cfg, recorded=True))
    write_json(run_dir / "plan.json", redact(plan.to_dict()))  # the workers get the real command
    # env/: in the background, through no link below the run directory
    capture.start(run_dir, cfg.script.path, cfg.script.module, functools.partial(write_atomic, root=run_dir))
    for notice in plan.notices:
        log.info(notice)
    if plan.start_method == "spawn":
        log.info(plan.start_method_reason)
    log.info(f"run {plan.run_id}: {job_workers(plan.nodes, plan.workers_per_node, 'worker')}, "
             f"{plan.backend}, start method {plan.start_method}; run directory {run_dir}")
    return log


def summary_base(cfg: Config, plan: LaunchPlan) -> Dict[str, Any]:
    """The summary fields every backend knows before the job starts."""
    builtin = cfg.script.path is None
    return {
        "run_id": plan.run_id, "world_size": plan.world_size, "nodes": plan.nodes,
        "gpus_per_node": plan.workers_per_node, "backend": plan.backend, "device_type": plan.device_type,
        "strategy": cfg.trainer.strategy if builtin else None, "model": cfg.model.name if builtin else None,
        "script": cfg.script.path, "restarts": 0,
        **({"elastic_nodes": f"{plan.min_nodes}:{plan.nodes}"} if plan.elastic else {}),
    }


def finish(run_dir: Path, base: Dict[str, Any], rank0: Optional[Dict[str, Any]], status: str, started: float,
           error: Optional[str] = None, restarts: int = 0) -> Dict[str, Any]:
    """Write summary.json: the base fields, how the job ended, its wall time and rank 0's figures."""
    ended = time.time()
    figures = job_figures(run_dir, base, started, ended, status)
    summary = build_summary({**base, "status": status, "wall_s": ended - started, "restarts": restarts, **figures},
                            rank0)
    if error:
        summary["error"] = error
    try:
        write_json(run_dir / "summary.json", summary)
    except OSError as e:  # a full disk: the job's own error says more than a traceback from here would
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        logging.getLogger("launcher").info(f"summary.json not written: {run_dir} is full ({e.strerror})")
    capture.wait()  # env/ of a run that ended before its capture did
    return summary


def job_figures(run_dir: Path, base: Dict[str, Any], started: float, ended: float, status: str) -> Dict[str, Any]:
    """Steps, throughput, first step and goodput: the built-in trainer's from its goodput records (its own figures
    come with rank 0's result), a script's from its workers' step records (launcher.steps)."""
    if base.get("model"):
        return job_goodput(str(run_dir), started, ended, status)  # membership changes included
    if base.get("script") is None:
        return {}
    records = read_records(run_dir)
    changes = membership_changes(run_dir, started)  # an elastic job's, with or without optimizer steps
    figures = {**summary_figures(records, started, MetricsConfig.straggler_fraction),
               **({"membership_changes": changes} if changes else {})}
    if "steps" in figures:
        figures.update(job_goodput(str(run_dir), started, ended, status))
    return figures


def one_line_summary(summary: Dict[str, Any], run_dir: Path) -> str:
    """The launcher's last line. After a resume the time is this launch's and goodput covers every launch of the
    run, so each figure says which it is (a 14s launch beside 22s lost to startup is no contradiction then)."""
    launches = int(summary.get("goodput_launches") or 1)
    parts = [f"{summary['status']} in {formatting.seconds(summary['wall_s'])}" + (" (this launch)" if launches > 1 else "")]
    if summary.get("steps"):
        figures = [f"{summary['steps']} steps"]
        if summary.get("final_loss") is not None:
            figures.append(f"loss {formatting.loss(summary['final_loss'])}")
        if summary.get("samples_per_s"):
            figures.append(f"{formatting.rate(summary['samples_per_s'])} samples/s")
        elif summary.get("steps_per_s"):
            figures.append(f"{summary['steps_per_s']:.1f} steps/s")
        parts.append(", ".join(figures))
    if summary.get("time_to_first_step_s"):
        parts.append(f"first step after {formatting.seconds(summary['time_to_first_step_s'])}")
    if summary.get("goodput") is not None:
        parts.append(format_goodput(summary))
    return "; ".join(parts) + f"; run directory {run_dir}"
