"""The board's run list: launcher.runindex.list_runs rows (what `ls --json` prints), each with its link."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

from launcher.runindex import list_runs


def board_runs(root: Path) -> List[Dict[str, Any]]:
    """The run index's rows for root, in its order, each (and each member) with "rel": its path under root,
    the page's link, or None when it lies outside (a link the board will not follow)."""
    rows = list_runs(root)
    base = root.resolve()
    for row in rows:
        for item in [row, *(row.get("members") or [])]:
            try:
                item["rel"] = str(Path(item["path"]).resolve().relative_to(base))
            except (KeyError, ValueError):
                item["rel"] = None
    return rows
