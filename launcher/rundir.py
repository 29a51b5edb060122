"""The run directory: <output_dir>/<run_id>/ with config.yaml, plan.json, logs/, metrics.jsonl, summary.json."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict

from launcher.errors import ConfigError

SUMMARY_KEYS = (
    "run_id", "status", "world_size", "nodes", "gpus_per_node", "backend", "device_type", "strategy",
    "model", "steps", "global_batch_size", "samples_per_s", "step_time_s_median", "final_loss",
    "param_checksum", "time_to_first_step_s", "wall_s", "restarts",
)


def create_run_dir(output_dir: str, run_id: str) -> Path:
    """Make <output_dir>/<run_id>/logs, or say why it cannot be made."""
    run_dir = Path(output_dir) / run_id
    try:
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        # a probe of our own: nodes sharing the directory (one box, NFS) create it at the same time
        fd, probe = tempfile.mkstemp(dir=run_dir, prefix=".write-test-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(
            f"output_dir={output_dir} cannot be written ({e.strerror or e}): pick another with output_dir=PATH"
        ) from e
    return run_dir.resolve()


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file, fsync, rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def build_summary(base: Dict[str, Any], rank0: Dict[str, Any] | None) -> Dict[str, Any]:
    """The launcher's facts (status, sizes, wall time) merged with rank 0's training figures."""
    summary: Dict[str, Any] = {key: None for key in SUMMARY_KEYS}
    summary.update(base)
    if rank0:
        for key, value in rank0.items():
            if key not in ("rank", "restart_count") and summary.get(key) is None:
                summary[key] = value
    return summary
