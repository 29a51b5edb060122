"""How well the ranks' prints and progress bars come out on one console: the launcher against torchrun.

The same script (tests/scripts/tqdm_prints.py: every rank prints "rank R line I" on stdout and redraws a tqdm
bar "rank R: ..." on stderr) runs under `python -m launcher --gpus N` and under torchrun, stdout and stderr into
one pipe as on a terminal. What came out is judged two ways:
- rows: rendered as a terminal shows them (\\r back to the row's start, text overwriting, \\n a new row); a
  row is clean when it holds one rank's print or one rank's bar and nothing else (after one rank prefix:
  ours `[rankK]: `, torchrun's `[defaultK]:` with --tee, none without);
- pieces: the text between any two \\r or \\n, as a pipe or a log viewer shows it; clean likewise.
A mixed row or piece holds output of more than one rank, or a broken line (a print glued to a bar update,
or the rest of an overwritten bar behind it). Prints intact counts the prints found whole in a clean row.
tests/test_console.py asserts ours is no worse than torchrun's; bench/interleaving.py prints the figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from tests.helpers import REPO, communicate_bounded, launcher_env

SCRIPT = REPO / "tests" / "scripts" / "tqdm_prints.py"
PRINT = re.compile(r"rank (\d+) line (\d+)")
BAR = re.compile(r"rank (\d+): +\d+%\|[^|]*\| *\d+/\d+ \[[^\]]*\]")
PREFIX = re.compile(r"\[(?:rank|default)(\d+)\]: ?")
OURS = "launcher"
TORCHRUN = ("torchrun", "torchrun --tee 3")


@dataclass
class Mix:
    """One console's figures."""

    rows: int
    mixed_rows: int
    pieces: int
    mixed_pieces: int
    prints_intact: int
    prints: int

    @property
    def mixed_row_share(self) -> float:
        return self.mixed_rows / max(1, self.rows)

    @property
    def mixed_piece_share(self) -> float:
        return self.mixed_pieces / max(1, self.pieces)

    def __str__(self) -> str:
        return (f"{self.mixed_rows}/{self.rows} rows mixed ({100 * self.mixed_row_share:.0f}%), "
                f"{self.mixed_pieces}/{self.pieces} pieces mixed ({100 * self.mixed_piece_share:.0f}%), "
                f"{self.prints_intact}/{self.prints} prints intact")


def run_console(how: str, ranks: int, steps: int, tmp: Path, timeout: float = 240) -> Tuple[bytes, Path]:
    """Run the script one way; (its console: stdout and stderr in one pipe, what its ranks kept)."""
    out = tmp / "kept"
    out.mkdir()
    if how == OURS:
        argv = [sys.executable, "-m", "launcher", "--gpus", str(ranks), f"output_dir={tmp / 'runs'}", "run_id=mix"]
    else:
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
        argv += ["--tee", "3", "--log-dir", str(tmp / "torch-logs")] if "--tee" in how else []
    argv += [str(SCRIPT), str(out), str(steps)]
    return run_merged(argv, tmp, timeout, how), out


def run_merged(argv: List[str], cwd: Path, timeout: float, what: str) -> bytes:
    """argv's stdout and stderr as one pipe shows them (a terminal's order), bounded; fails on a non-zero exit."""
    proc = subprocess.Popen(argv, cwd=cwd, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out, _ = communicate_bounded(proc, timeout, what)
    assert proc.returncode == 0, f"{what} failed:\n{out.decode(errors='replace')[-3000:]}"
    return out


def rows(console: bytes) -> List[str]:
    """The console as a terminal leaves it: one string per row."""
    found: List[str] = []
    row: List[str] = []
    column = 0
    for char in console.decode("utf-8", errors="replace"):
        if char == "\n":
            found.append("".join(row))
            row, column = [], 0
        elif char == "\r":
            column = 0
        elif column < len(row):
            row[column] = char
            column += 1
        else:
            row.append(char)
            column += 1
    if row:
        found.append("".join(row))
    return found


def pieces(console: bytes) -> List[str]:
    return re.split(r"[\r\n]", console.decode("utf-8", errors="replace"))


def whose(text: str) -> Optional[Tuple[int, str]]:
    """(rank, kind) when text is exactly one rank's print or bar state (after at most one rank prefix), else None."""
    text = text.rstrip(" ")
    prefix = PREFIX.match(text)
    body = text[prefix.end():] if prefix else text
    for kind, pattern in (("print", PRINT), ("bar", BAR)):
        match = pattern.fullmatch(body)
        if match and (prefix is None or prefix.group(1) == match.group(1)):
            return int(match.group(1)), kind
    return None


def ours_or_theirs(text: str) -> bool:
    """Whether text is the ranks' (not a launcher's own line, which both print around the job)."""
    return bool(re.search(r"rank \d", text))


def measure(console: bytes, ranks: int, steps: int) -> Mix:
    shown = [r for r in rows(console) if r.strip() and ours_or_theirs(r)]
    parts = [p for p in pieces(console) if p.strip() and ours_or_theirs(p)]
    expected = {f"rank {r} line {i}" for r in range(ranks) for i in range(0, steps, 3)}
    intact = {PREFIX.sub("", r.rstrip(" "), count=1) for r in shown if whose(r) == (_rank_of(r), "print")}
    return Mix(rows=len(shown), mixed_rows=sum(1 for r in shown if whose(r) is None),
               pieces=len(parts), mixed_pieces=sum(1 for p in parts if whose(p) is None),
               prints_intact=len(expected & intact), prints=len(expected))


def _rank_of(text: str) -> int:
    match = PRINT.search(text) or BAR.search(text)
    return int(match.group(1)) if match else -1


def compare(ranks: int, steps: int) -> dict:
    """Every way, once each: {how: Mix}."""
    found = {}
    for how in (OURS, *TORCHRUN):
        with tempfile.TemporaryDirectory(prefix="mix-") as tmp:
            console, _ = run_console(how, ranks, steps, Path(tmp))
            found[how] = measure(console, ranks, steps)
    return found
