"""What the command line offers, told from launcher.cli's table of subcommands: one line per subcommand for the
top-level --help, and "did you mean ls?" for a first word that is a mistyped subcommand rather than a script.

Each subcommand's line is the first sentence of its module's docstring, read from the source without importing
the module (importing them all would cost the top-level --help seconds), so a new subcommand lists itself.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import os
import re
from typing import Mapping, Optional

# "`python -m launcher ls [OUTPUT_DIR] ...`: every run" and "The `board` command: a web page": the part that
# names the command, which the listing shows in its own column already
NAMED = re.compile(r"^(?:`python -m launcher [^`]*`|The `[^`]*` command):\s*")
NEAR = 0.6  # difflib's similarity cut-off: lss, stauts and sweeep match; train, run and main match nothing


def summary(module: str) -> str:
    """The first sentence of the module's docstring, without the words that name the command."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    first = " ".join(doc.split("\n\n", 1)[0].split())
    first = NAMED.sub("", first).replace("`", "")
    first = re.split(r"\.(?:\s|$)", first, maxsplit=1)[0]  # its first sentence
    return first[:1].upper() + first[1:]


def command_list(commands: Mapping[str, str]) -> str:
    """The 'commands:' block of the top-level --help, one line per subcommand, in the table's order."""
    width = max(len(name) for name in commands)
    lines = [f"  {name.ljust(width)}  {summary(module)}" for name, module in commands.items()]
    return "commands (python -m launcher COMMAND --help for each one's options):\n" + "\n".join(lines)


def mistyped(word: str, commands: Mapping[str, str]) -> Optional[str]:
    """The subcommand `word` is likely a typo of, when it cannot be anything else: not a flag, a key=value, a path
    or an existing file (a script called `lss` still runs)."""
    if not word or word.startswith("-") or "=" in word or "/" in word or "." in word or os.path.exists(word):
        return None
    near = difflib.get_close_matches(word, list(commands), n=1, cutoff=NEAR)
    return near[0] if near else None
