"""The one table style of the command line (ls, sweep, compare, scale): rich's Table without rules or borders, so
that each row is one line of columns two spaces apart and a file or a pipe gets text `grep` and `split` can read.

On a terminal the header is bold; lines are never wrapped or cut (a long command column runs on, as in `ls -l`).
"""

from __future__ import annotations

import io
import sys
from typing import Dict, List, Optional, Sequence, TextIO

WIDE = 100_000  # rich fits a table to the console width: wide enough that it never squeezes a column


def render(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = (),
           terminal: Optional[bool] = None) -> List[str]:
    """The table's lines, header first, one line per row; columns named in `right` align right (numbers)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", highlight=False)
    for name in header:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))  # Text: a '[' in a run name is no markup
    out = io.StringIO()
    Console(file=out, width=WIDE, force_terminal=terminal, color_system="standard" if terminal else None,
            highlight=False, emoji=False).print(table)
    return [line.rstrip() for line in out.getvalue().splitlines()]


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[str] = (),
                under: Optional[Dict[int, List[str]]] = None, title: str = "", out: TextIO = sys.stdout) -> None:
    """Print the table; `under` maps a row's index to lines printed beneath it (a failed run's error), outside
    the columns so they neither widen nor break them."""
    lines = render(header, rows, right, terminal=out.isatty())
    if title:
        out.write(title + "\n")
    out.write(lines[0] + "\n")
    for i, line in enumerate(lines[1:]):
        out.write(line + "\n")
        for extra in (under or {}).get(i, []):
            out.write(extra + "\n")
    out.flush()
