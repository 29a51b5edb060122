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

from launcher.agent.failures import first_cause
from launcher.config.schema import Config, MetricsConfig, to_yaml
from launcher.config.secrets import redact
from launcher.errors import ConfigError
from launcher.logs import setup_launcher_logging
from launcher.plan import LaunchPlan, starting_workers
from launcher.provenance import capture
from launcher.runtime import formatting, safefs
from launcher.runtime.goodput import format_goodput, job_goodput, membership_changes
from launcher.runtime.schema import NODE, NODES_DIR, SERIES_DIR, STEPS_DIR, SUMMARY, SUMMARY_ALWAYS, Status
from launcher.steps.records import read_records
from launcher.steps.rows import summary_figures


def check_can_create(output_dir: str, run_id: str, allow_other_owner: bool) -> None:
    """Before torch loads: output_dir cannot lie under a file, nor be another user's (check_owner). create_run_dir is
    the real test (permissions, a read-only disk) and says the same; this only names early, in the same words, what
    is sure to fail there."""
    path = Path(os.path.abspath(output_dir))
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    if existing is not None and os.path.exists(existing) and not os.path.isdir(existing):  # (dangling: left to it)
        raise ConfigError(f"output_dir={output_dir} cannot be written ({os.strerror(errno.ENOTDIR)}): "
                          f"pick another with output_dir=PATH")
    check_owner(output_dir, run_id, allow_other_owner)


def check_owner(output_dir: str, run_id: str, allow: bool) -> None:
    """The run directory, output_dir, or (where output_dir is not made yet) the folder it would be made in, owned by
    another user than this one and root: refused in one line unless allow (launcher.allow_other_owner). Its owner
    could rename or remove the locks, logs and plan written there, or swap the folder for another."""
    if allow:
        return
    top = Path(os.path.abspath(output_dir))
    existing = next((p for p in (top, *top.parents) if os.path.exists(p)), top)  # output_dir's links: the user's own
    for path, look in ((top / run_id, os.lstat), (existing, os.stat)):
        try:
            uid = look(path).st_uid
        except OSError:
            continue
        if uid not in (0, os.geteuid()):
            raise ConfigError(f"{path} belongs to {user_name(uid)}, not to {user_name(os.geteuid())}: they could rename "
                              "or remove what the launcher writes there; pick an output_dir=PATH of your own, or set "
                              "launcher.allow_other_owner=true to use it anyway")


def user_name(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def create_run_dir(output_dir: str, run_id: str, allow_other_owner: bool = False) -> Path:
    """Make <output_dir>/<run_id>/logs, or say why it cannot be made (another user's folder included: check_owner,
    again once made, as a folder swapped in meanwhile is no better)."""
    top = Path(output_dir).resolve()  # output_dir: resolved once (plan.json records the run directory under it)
    run_dir = top / run_id
    check_owner(str(top), run_id, allow_other_owner)
    try:
        top.mkdir(parents=True, exist_ok=True)
        safefs.make_dirs(str(run_dir / "logs"), root=str(top))  # below output_dir: nothing followed
        check_owner(str(top), run_id, allow_other_owner)
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
    script's step records and launcher.log series likewise into steps/<folder>/ and series/<folder>/ (each then
    holds this launch's, whichever node wrote them)."""
    archive(run_dir / STEPS_DIR, "rank-*.jsonl", folder)
    archive(run_dir / SERIES_DIR, "rank-*.jsonl", folder)
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
    with os.fdopen(safefs.open_regular(str(path)), encoding="utf-8") as f:  # a FIFO planted there is refused, not waited on
        return json.loads(f.read())


def read_node_record(run_dir: Path, node: Optional[int]) -> Dict[str, Any]:
    """nodes/node-K.json as that node's launcher wrote it (launcher.backends.node), read back from a shared folder and
    so checked (launcher.runtime.schema.NODE): {} where it is missing, a link or no record; a field of the wrong
    shape left out."""
    try:
        record = json.loads(safefs.read_bytes(str(run_dir / NODES_DIR / f"node-{node}.json"), root=str(run_dir)))
    except (OSError, ValueError, RecursionError):
        return {}
    return NODE.read(record)


def first_failed_node(run_dir: Path, nodes: int, also: Optional[Dict[str, Any]] = None) -> Optional[int]:
    """The node whose rank failed first, by the nodes' records (each names its own first failed rank, and when):
    the job's root cause is that rank, not a peer that failed because it had gone. also: a record of a node not
    written yet ({node_rank, root_cause}, the caller's own)."""
    records = {k: read_node_record(run_dir, k) for k in range(nodes)}
    if also is not None and isinstance(also.get("node_rank"), int):
        records[also["node_rank"]] = also
    cause = first_cause(r.get("root_cause") for r in records.values())
    return next((k for k, r in records.items() if cause is not None and r.get("root_cause") is cause), None)


def build_summary(base: Dict[str, Any], rank0: Dict[str, Any] | None) -> Dict[str, Any]:
    """The launcher's facts (status, sizes, wall time) merged with rank 0's training figures."""
    summary: Dict[str, Any] = {key: None for key in SUMMARY_ALWAYS}
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
    log.info(f"run {plan.run_id}: {starting_workers(plan)}, "
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
        **({"spares": plan.spares} if plan.spares else {}),
    }


# the launcher's exit code for each way a job ends (docs/run-directory.md); a stop by a signal says 128 + it
EXIT_CODES = {Status.COMPLETED: 0, Status.FAILED: 1, Status.HUNG: 1, Status.INTERRUPTED: 130, Status.PREEMPTED: 140}


def finish(run_dir: Path, base: Dict[str, Any], rank0: Optional[Dict[str, Any]], status: Status, started: float,
           error: Optional[str] = None, restarts: int = 0) -> Dict[str, Any]:
    """Write summary.json: the base fields, how the job ended, its wall time and rank 0's figures."""
    ended = time.time()
    figures = job_figures(run_dir, base, started, ended, status)
    summary = build_summary({**base, "status": Status(status), "wall_s": ended - started, "restarts": restarts,
                             **figures}, rank0)
    if error:
        summary["error"] = error
    summary["exit_code"] = base.get("exit_code", EXIT_CODES.get(Status(status), 1))  # a stop's: 128 + its signal
    undeclared = SUMMARY.undeclared(summary)
    if undeclared:  # a writer's mistake: every reader leaves these out
        logging.getLogger("launcher").warning(f"summary.json: {', '.join(undeclared)} not declared in "
                                              "launcher/runtime/schema.py (SUMMARY): readers leave them out")
    try:
        write_json(run_dir / "summary.json", summary)
    except OSError as e:  # a full disk: the job's own error says more than a traceback from here would
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        logging.getLogger("launcher").info(f"summary.json not written: {run_dir} is full ({e.strerror})")
    capture.wait()  # env/ of a run that ended before its capture did
    return summary


def job_figures(run_dir: Path, base: Dict[str, Any], started: float, ended: float, status: Status) -> Dict[str, Any]:
    """Steps, throughput, first step and goodput: the built-in trainer's from its goodput records (its own figures
    come with rank 0's result), a script's from its workers' step records (launcher.steps)."""
    if base.get("model"):
        return job_goodput(str(run_dir), started, ended, status)  # membership changes included
    if base.get("script") is None:
        return {}
    records = read_records(run_dir)
    changes = membership_changes(run_dir, started)  # an elastic job's, with or without optimizer steps
    nodes, world = base.get("nodes"), base.get("world_size")
    per_node = world // nodes if isinstance(nodes, int) and isinstance(world, int) and nodes > 0 else 0
    figures = {**summary_figures(records, started, MetricsConfig.straggler_fraction, per_node),
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
