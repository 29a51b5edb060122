"""Child runs: the `python -m launcher ...` processes that compare, scale and sweep start, one per
run, each an ordinary run in its own run directory (a crash or hang in one cannot take the others down)."""

from __future__ import annotations

from pathlib import Path
from typing import List

from launcher.backends.children import launcher_module_command


def launcher_command(args: List[str]) -> List[str]:
    """argv of a child launcher: this interpreter, the installed package (launcher.backends.children)."""
    return launcher_module_command("launcher", *args)


def last_line(path: Path) -> str:
    """The last non-blank line of a child's console log: usually its one-line error."""
    if not path.is_file():
        return ""
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else ""
