"""The board's view of a folder of runs: a sweep (sweep.json), a compare (compare.json), a scale sweep (scale.json).

Its members and their live status are the run index's (launcher.runindex: the same row `ls` shows);
the charts come from the folder's report once it is written, else from the members' summaries. Each
becomes the plain shape the page draws: charts ({title, type, x, series, xlabel, ylabel}) and a
table ({columns, rows, links}), links relative to the board's output directory.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.board.views import read_json
from launcher.runindex import read_entry

GROUP_KINDS = ("sweep", "compare", "scale")


def group_row(folder: Path) -> Optional[Dict[str, Any]]:
    """The folder's run-index row when it is a sweep, compare or scale folder; None for a run or anything else."""
    row = read_entry(folder, time.time())
    return row if row is not None and row.get("kind") in GROUP_KINDS else None


def chart(title: str, kind: str, x: List[Any], series: Dict[str, List[Any]], xlabel: str, ylabel: str) -> Dict[str, Any]:
    return {"title": title, "type": kind, "x": x, "series": [{"name": k, "y": v} for k, v in series.items()],
            "xlabel": xlabel, "ylabel": ylabel}


def group_view(folder: Path, root: Path, row: Dict[str, Any]) -> Dict[str, Any]:
    """Charts and a member table for a group row (group_row)."""
    members = row.get("members") or []
    keys = list(row.get("keys") or [])
    summaries = [_summary(Path(m["path"])) for m in members]
    labels = [" ".join(f"{k}={(m.get('overrides') or {}).get(k)}" for k in keys) or m["run_id"] for m in members]
    charts = {"sweep": member_charts, "compare": compare_charts, "scale": scale_charts}[row["kind"]](folder, labels, summaries)
    table = {
        "columns": ["member", "status", "progress", "samples/s", "final loss", "restarts"],
        "rows": [[label, m["status"], _progress(m),
                  s.get("samples_per_s") or m.get("throughput"), s.get("final_loss"), m.get("restarts")]
                 for label, m, s in zip(labels, members, summaries)],
        "links": [_rel(Path(m["path"]), root) if not m.get("pending") else None for m in members],
    }
    report = read_json(folder / "scale.json") if row["kind"] == "scale" else None
    return {"view": "group", "kind": row["kind"], "run_id": row["run_id"], "status": row["status"],
            "step": row.get("step"), "steps": row.get("steps"), "keys": keys, "command": row.get("command"),
            "notice": (report or {}).get("notice"), "charts": charts, "table": table}


def member_charts(folder: Path, labels: List[str], summaries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [chart("throughput by member", "bar", labels, {"samples/s": [s.get("samples_per_s") for s in summaries]},
                  "member", "samples/s"),
            chart("final loss by member", "bar", labels, {"final loss": [s.get("final_loss") for s in summaries]},
                  "member", "loss")]


def compare_charts(folder: Path, labels: List[str], summaries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    report = read_json(folder / "compare.json") or {}
    rows = report.get("rows") or [{"strategy": label.split("=", 1)[-1], **s} for label, s in zip(labels, summaries)]
    names = [r.get("strategy") for r in rows]
    return [chart("throughput by strategy", "bar", names, {"samples/s": [r.get("samples_per_s") for r in rows]},
                  "strategy", "samples/s"),
            chart("median step time by strategy", "bar", names,
                  {"ms": [(r.get("step_time_s_median") or 0) * 1000 or None for r in rows]}, "strategy", "ms")]


def scale_charts(folder: Path, labels: List[str], summaries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    report = read_json(folder / "scale.json") or {}
    sizes = report.get("sizes") or []
    if not sizes:  # still running: each finished size's throughput so far
        return member_charts(folder, labels, summaries)[:1]
    workers = [s.get("world_size") for s in sizes]
    base = sizes[0]
    ideal = [(base.get("samples_per_s") or 0) * w / (base.get("world_size") or 1) for w in workers]
    return [chart(f"throughput ({report.get('mode')} scaling)", "line", workers,
                  {"measured": [s.get("samples_per_s") for s in sizes], "ideal (linear)": ideal}, "workers", "samples/s"),
            chart("scaling efficiency", "line", workers,
                  {"measured": [100 * (s.get("scaling_efficiency") or 0) for s in sizes], "ideal": [100] * len(sizes)},
                  "workers", "%")]


def _progress(member: Dict[str, Any]) -> str:
    """step/steps, as the run list shows it: the step alone for a script (no target), nothing before the first."""
    step, steps = member.get("step"), member.get("steps")
    return "" if step is None else f"{step}/{steps}" if steps else str(step)


def _summary(run_dir: Path) -> Dict[str, Any]:
    summary = read_json(run_dir / "summary.json")
    return summary if isinstance(summary, dict) else {}


def _rel(path: Path, root: Path) -> Optional[str]:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return None
