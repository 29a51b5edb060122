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

from launcher.board.files import read_json
from launcher.runindex import entry_or_damaged
from launcher.runtime.schema import SUMMARY

GROUP_KINDS = ("sweep", "compare", "scale")


def group_row(folder: Path) -> Optional[Dict[str, Any]]:
    """The folder's run-index row when it is a sweep, compare or scale folder; None for a run or anything else."""
    row = entry_or_damaged(folder, time.time())  # a run whose files cannot be read: a damaged run's row
    return row if row is not None and row.get("kind") in GROUP_KINDS else None


def chart(title: str, kind: str, x: List[Any], series: Dict[str, List[Any]], xlabel: str, ylabel: str) -> Dict[str, Any]:
    return {"title": title, "type": kind, "x": x, "series": [{"name": k, "y": v} for k, v in series.items()],
            "xlabel": xlabel, "ylabel": ylabel}


def group_view(folder: Path, root: Path, row: Dict[str, Any]) -> Dict[str, Any]:
    """Charts and a member table for a group row (group_row)."""
    members = row.get("members") or []
    keys = list(row.get("keys") or [])
    summaries = [_summary(Path(m["path"])) for m in members]
    labels = [label(m, keys) for m in members]
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
            "notice": (report or {}).get("notice"), "notes": report_notes(report), "charts": charts, "table": table}


def label(member: Dict[str, Any], keys: List[str]) -> str:
    """What a member varies ("nodes=1 gpus=2 round=3"), the keys it has values for; its run id where it has none."""
    given = member.get("overrides") or {}
    return " ".join(f"{k}={given[k]}" for k in keys if given.get(k) is not None) or member["run_id"]


def report_notes(report: Any) -> List[str]:
    """A scale sweep's verdict, the lines under scale.md's table (scale.json's notes; an older one's noisy line and
    flags)."""
    if not isinstance(report, dict):
        return []
    notes = report.get("notes")
    if isinstance(notes, list):
        return [str(n) for n in notes]
    sizes = [s for s in report.get("sizes") or [] if isinstance(s, dict)]
    flags = [f"{s.get('world_size')} workers: {s['flag']}" for s in sizes if s.get("flag")]
    return flags + ([str(report["noisy"])] if report.get("noisy") else [])


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
    """Throughput and efficiency against workers: each size's median with error bars from its slowest to its
    fastest round (efficiency: scale.json's efficiency_range), every round as a dot, and the ideal line."""
    report = read_json(folder / "scale.json") or {}
    sizes = [s for s in report.get("sizes") or [] if isinstance(s, dict)]
    if not sizes:  # still running: each finished size's throughput so far
        return member_charts(folder, labels, summaries)[:1]
    key = report.get("efficiency_from") or "samples_per_s"
    unit = "steps/s" if key == "steps_per_s" else "samples/s"
    workers = [s.get("world_size") for s in sizes]
    base = sizes[0]
    flat = key == "steps_per_s"  # a script's steps/s at a kept per-worker batch: ideal is flat
    ideal = [(base.get(key) or 0) * (1 if flat else (w or 0) / (base.get("world_size") or 1)) for w in workers]
    bounds = [_bounds(s, key) for s in sizes]
    rounds = [[w, v] for w, s in zip(workers, sizes) for v in s.get(f"{key}_rounds") or [] if isinstance(v, (int, float))]
    ranges: List[List[Any]] = [r if isinstance(r := s.get("efficiency_range"), list) and len(r) == 2 else [None, None]
                               for s in sizes]
    throughput = chart(f"throughput ({report.get('mode')} scaling; bars: slowest to fastest round)", "line", workers,
                       {"measured": [s.get(key) for s in sizes]}, "workers", unit)
    throughput["series"][0].update(low=[b[0] for b in bounds], high=[b[1] for b in bounds])
    throughput["series"] += [{"name": "each round", "y": [r[1] for r in rounds], "points": rounds},
                             {"name": "ideal (flat)" if flat else "ideal (linear)", "y": ideal}]
    efficiency = chart("scaling efficiency (bars: its range over the rounds)", "line", workers,
                       {"measured": [100 * (s.get("scaling_efficiency") or 0) for s in sizes],
                        "ideal": [100] * len(sizes)}, "workers", "%")
    efficiency["series"][0].update(low=[_percent(r[0]) for r in ranges], high=[_percent(r[1]) for r in ranges])
    return [throughput, efficiency]


def _bounds(size: Dict[str, Any], key: str) -> List[Any]:
    figures = [v for v in size.get(f"{key}_rounds") or [] if isinstance(v, (int, float))]
    return [min(figures), max(figures)] if figures else [size.get(key), size.get(key)]


def _percent(value: Any) -> Any:
    return 100 * value if isinstance(value, (int, float)) else None


def _progress(member: Dict[str, Any]) -> str:
    """step/steps, as the run list shows it: the step alone for a script (no target), nothing before the first."""
    step, steps = member.get("step"), member.get("steps")
    return "" if step is None else f"{step}/{steps}" if steps else str(step)


def _summary(run_dir: Path) -> Dict[str, Any]:
    return SUMMARY.read(read_json(run_dir / "summary.json"))  # its fields as launcher.runtime.schema declares them


def _rel(path: Path, root: Path) -> Optional[str]:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return None
