"""The board's run list: launcher.runindex.list_runs rows (what `ls --json` prints), each with its link, newest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from launcher.board.groups import label
from launcher.runindex import list_runs


def board_runs(root: Path) -> List[Dict[str, Any]]:
    """The run index's rows for root, newest first (a run started now is at the top, not below a screen of old
    ones; `ls` keeps the index's oldest-first order for a terminal, the newest next to the prompt), each (and each
    member, in its sweep's order) with "rel": its path under root, the page's link, or None when it lies outside
    (a link the board will not follow); each member with "label", what it varies in its parent's key order (a JSON
    object's keys reach the page sorted)."""
    rows = list_runs(root)[::-1]
    base = root.resolve()
    for row in rows:
        for member in row.get("members") or []:
            member["label"] = label(member, list(row.get("keys") or []))
        for item in [row, *(row.get("members") or [])]:
            try:
                item["rel"] = str(Path(item["path"]).resolve().relative_to(base))
            except (KeyError, ValueError):
                item["rel"] = None
    return rows
