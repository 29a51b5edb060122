"""The board's run list: launcher.runindex.list_runs rows (what `ls --json` prints), each with its link.

Until launcher.runindex lands (branch `runs`), a minimal reader of the same row keys stands in.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List

from launcher.board.groups import group_kind
from launcher.board.views import configured_steps, live_step, read_json, run_status


def board_runs(root: Path) -> List[Dict[str, Any]]:
    """One row per run under root, newest first, each with "rel" (its path under root) for the page's links."""
    try:
        from launcher.runindex import list_runs
    except ImportError:
        list_runs = _list_runs
    rows = list_runs(root)
    base = root.resolve()
    for row in rows:
        for item in [row, *(row.get("members") or [])]:
            try:
                item["rel"] = str(Path(item["path"]).resolve().relative_to(base))
            except (KeyError, ValueError):
                item["rel"] = None
    return rows


def _list_runs(root: Path) -> List[Dict[str, Any]]:
    rows = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        if folder.is_dir() and (group_kind(folder) or (folder / "plan.json").is_file()):
            rows.append(_row(folder))
    return sorted(rows, key=lambda r: -(r["started"] or 0))


def _row(folder: Path) -> Dict[str, Any]:
    summary = read_json(folder / "summary.json")
    summary = summary if isinstance(summary, dict) else {}
    kind = group_kind(folder)
    started = (folder / "plan.json").stat().st_mtime if (folder / "plan.json").is_file() else folder.stat().st_mtime
    return {
        "run_id": folder.name, "path": str(folder.resolve()), "kind": kind or "local",
        "status": "unknown" if kind else run_status(folder, summary),
        "step": None if kind else live_step(folder), "steps": None if kind else configured_steps(folder),
        "throughput": summary.get("samples_per_s"), "goodput": summary.get("goodput"),
        "restarts": summary.get("restarts") or 0, "started": started, "age_s": time.time() - started,
        "command": f"python -m launcher resume {folder}",
    }
