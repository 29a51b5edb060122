"""The board's view of a folder of runs: a compare (compare.json), a scale sweep (scale.json), a sweep (sweep.json).

Each becomes the same plain shape the page draws: charts ({title, type, x, series, xlabel,
ylabel}) and a table ({columns, rows, links}), links relative to the board's output directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.board.views import read_json, run_status

GROUP_FILES = (("sweep", "sweep.json"), ("compare", "compare.json"), ("scale", "scale.json"))


def group_kind(folder: Path) -> Optional[str]:
    for kind, name in GROUP_FILES:
        if (folder / name).is_file():
            return kind
    return None


def chart(title: str, kind: str, x: List[Any], series: Dict[str, List[Any]], xlabel: str, ylabel: str) -> Dict[str, Any]:
    return {"title": title, "type": kind, "x": x, "series": [{"name": k, "y": v} for k, v in series.items()],
            "xlabel": xlabel, "ylabel": ylabel}


def group_view(folder: Path, root: Path) -> Dict[str, Any]:
    kind = group_kind(folder)
    build = {"sweep": sweep_view, "compare": compare_view, "scale": scale_view}[kind or ""]
    view = build(folder, root)
    return {"kind": kind, "run_id": folder.name, **view}


def _rel(path: Path, root: Path) -> Optional[str]:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return None


def compare_view(folder: Path, root: Path) -> Dict[str, Any]:
    report = read_json(folder / "compare.json") or {}
    rows = report.get("rows") or []
    names = [r.get("strategy") for r in rows]
    step_ms = [(r.get("step_time_s_median") or 0) * 1000 or None for r in rows]
    return {
        "charts": [chart("throughput by strategy", "bar", names, {"samples/s": [r.get("samples_per_s") for r in rows]},
                         "strategy", "samples/s"),
                   chart("step time by strategy", "bar", names, {"median step (ms)": step_ms}, "strategy", "ms")],
        "table": {"columns": ["strategy", "status", "samples/s", "step ms", "final loss"],
                  "rows": [[r.get("strategy"), r.get("status"), r.get("samples_per_s"), ms, r.get("final_loss")]
                           for r, ms in zip(rows, step_ms)],
                  "links": [_rel(folder / "runs" / str(n), root) for n in names]},
    }


def scale_view(folder: Path, root: Path) -> Dict[str, Any]:
    report = read_json(folder / "scale.json") or {}
    sizes = report.get("sizes") or []
    workers = [s.get("world_size") for s in sizes]
    base = sizes[0] if sizes else {}
    ideal = [(base.get("samples_per_s") or 0) * w / (base.get("world_size") or 1) for w in workers]
    return {
        "notice": report.get("notice"),
        "charts": [chart(f"throughput ({report.get('mode')} scaling)", "line", workers,
                         {"measured": [s.get("samples_per_s") for s in sizes], "ideal (linear)": ideal},
                         "workers", "samples/s"),
                   chart("scaling efficiency", "line", workers,
                         {"measured": [100 * (s.get("scaling_efficiency") or 0) for s in sizes],
                          "ideal": [100] * len(sizes)}, "workers", "%")],
        "table": {"columns": ["workers", "nodes", "samples/s", "speedup", "efficiency"],
                  "rows": [[s.get("world_size"), s.get("nodes"), s.get("samples_per_s"), s.get("speedup"),
                            s.get("scaling_efficiency")] for s in sizes],
                  "links": [_rel(folder / "runs" / str(s.get("run_id")), root) if s.get("run_id") else None
                            for s in sizes]},
    }


def sweep_view(folder: Path, root: Path) -> Dict[str, Any]:
    record = read_json(folder / "sweep.json") or {}
    keys = list(record.get("keys") or [])
    members = record.get("members") or []
    labels, rows, links, tput, loss = [], [], [], [], []
    for member in members:
        run_dir = folder / str(member.get("run_dir") or "")
        summary = read_json(run_dir / "summary.json") if run_dir.is_dir() else None
        summary = summary if isinstance(summary, dict) else {}
        overrides = member.get("overrides") or {}
        labels.append(" ".join(f"{k}={overrides.get(k)}" for k in keys) or str(member.get("index")))
        status = run_status(run_dir, summary) if run_dir.is_dir() else member.get("status")
        tput.append(summary.get("samples_per_s"))
        loss.append(summary.get("final_loss"))
        rows.append([member.get("index"), *(overrides.get(k) for k in keys), status, tput[-1], loss[-1]])
        links.append(_rel(run_dir, root) if run_dir.is_dir() else None)
    return {
        "charts": [chart("throughput by member", "bar", labels, {"samples/s": tput}, " ".join(keys), "samples/s"),
                   chart("final loss by member", "bar", labels, {"final loss": loss}, " ".join(keys), "loss")],
        "table": {"columns": ["#", *keys, "status", "samples/s", "final loss"], "rows": rows, "links": links},
    }
