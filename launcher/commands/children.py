"""Child runs: the `python -m launcher ...` processes that compare, scale and sweep start, one per
run, each an ordinary run in its own run directory (a crash or hang in one cannot take the others down)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, List


def launcher_command(args: List[str]) -> List[str]:
    """argv of a child launcher: this interpreter, this package."""
    return [sys.executable, "-m", "launcher", *args]


def child_env() -> Dict[str, str]:
    """The launcher package must be importable from the child whatever its working directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def last_line(path: Path) -> str:
    """The last non-blank line of a child's console log: usually its one-line error."""
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""
