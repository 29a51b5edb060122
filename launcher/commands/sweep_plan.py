"""What a sweep runs, as data: the grid (or list) expanded into members, their names, and sweep.json.

Pure: nothing here starts a process. A sweep is a folder <output_dir>/<sweep_id>/ holding sweep.json
and one ordinary run directory per member; sweep.json's format is shared with `ls` and the board:

    {"kind": "sweep", "sweep_id", "created", "cluster": "local"|"slurm", "keys": [varied keys],
     "base_args": [launcher args common to all members],
     "members": [{"index", "overrides": {key: value}, "run_dir": "<relative to the sweep folder>",
                  "status": "pending"|"running"|"completed"|"failed"}]}
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.errors import ConfigError
from launcher.rundir import read_json, write_json
from launcher.runtime.schema import Status
from launcher.usage import OVERRIDE

SWEEP_FILE = "sweep.json"
UNFINISHED = (Status.PENDING, Status.RUNNING, Status.FAILED)
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")
NAME_MAX = 120  # member run ids stay well under a directory name's 255 bytes


def is_grid_item(token: str) -> bool:
    """key=a,b: a swept key. A YAML list or mapping value ([..], {..}) is an ordinary override."""
    if not OVERRIDE.match(token):
        return False
    value = token.split("=", 1)[1]
    return "," in value and not value.lstrip().startswith(("[", "{"))


def parse_grid(items: List[str]) -> List[Tuple[str, List[str]]]:
    """[(key, [values])] from key=a,b,c items, in the order given."""
    grid: List[Tuple[str, List[str]]] = []
    for item in items:
        key, text = item.split("=", 1)
        values = [v.strip() for v in text.split(",")]
        if not all(values):
            raise ConfigError(f"sweep: {item} has an empty value: write it like {key}=0.1,0.01 (no empty items)")
        if any(key == k for k, _ in grid):
            raise ConfigError(f"sweep: {key} is swept twice: give all its values in one item, {key}=a,b,c")
        grid.append((key, values))
    return grid


def read_list(path: str) -> List[Dict[str, str]]:
    """--list FILE: one member per line, `key=value key=value`; blank lines and # comments skipped."""
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block the read forever, as --config says
        what = "a directory" if os.path.isdir(path) else "not a regular file"
        raise ConfigError(f"sweep: --list {path} is {what}: pass a text file with one member per line")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"sweep: --list {path}: cannot read it ({e.__class__.__name__}): check the path") from e
    sets: List[Dict[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        overrides: Dict[str, str] = {}
        for item in line.split():
            if not OVERRIDE.match(item) or not item.split("=", 1)[1]:
                raise ConfigError(f"sweep: --list {path} line {number}: '{item}' is not key=value: "
                                  "write one member per line, e.g. trainer.lr=0.1 data.batch_size=32")
            key, value = item.split("=", 1)
            overrides[key] = value
        sets.append(overrides)
    if not sets:
        raise ConfigError(f"sweep: --list {path} holds no member: write one per line, e.g. trainer.lr=0.1 seed=2")
    return sets


def expand(grid: List[Tuple[str, List[str]]], listed: Optional[List[Dict[str, str]]]) -> List[Dict[str, str]]:
    """Every combination: each listed set (or one empty set) crossed with the grid."""
    if not grid and not listed:
        raise ConfigError("sweep: nothing to sweep: give a key with several values (trainer.lr=0.1,0.01) "
                          "or --list FILE with one override set per line")
    combos = [dict(zip([k for k, _ in grid], values)) for values in itertools.product(*[v for _, v in grid])]
    return [{**base, **combo} for base in (listed or [{}]) for combo in combos]


def varied_keys(members: List[Dict[str, str]]) -> List[str]:
    """The keys set in any member, first appearance first."""
    keys: List[str] = []
    for overrides in members:
        keys += [k for k in overrides if k not in keys]
    return keys


def member_name(index: int, overrides: Dict[str, str], keys: List[str]) -> str:
    """A readable run id: m003-lr=0.1-batch_size=64 (the key's last part where that is unambiguous)."""
    lasts = [k.rsplit(".", 1)[-1] for k in keys]
    parts = [f"m{index:03d}"]
    for key in keys:
        if key in overrides:
            short = key.rsplit(".", 1)[-1] if lasts.count(key.rsplit(".", 1)[-1]) == 1 else key
            parts.append(_UNSAFE.sub("_", f"{short}={overrides[key]}").strip("._") or "_")
    return "-".join(parts)[:NAME_MAX]


def new_sweep(sweep_id: str, created: float, cluster: str, keys: List[str], base_args: List[str],
              members: List[Dict[str, str]]) -> Dict[str, Any]:
    """sweep.json's content for a new sweep: every member pending."""
    return {"kind": "sweep", "sweep_id": sweep_id, "created": created, "cluster": cluster, "keys": keys,
            "base_args": base_args,
            "members": [{"index": i, "overrides": o, "run_dir": member_name(i, o, keys), "status": Status.PENDING}
                        for i, o in enumerate(members)]}


def read_sweep(sweep_dir: Path) -> Dict[str, Any]:
    try:
        sweep = read_json(sweep_dir / SWEEP_FILE)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{sweep_dir / SWEEP_FILE} cannot be read ({e.__class__.__name__}): "
                          "is this a sweep folder made by `python -m launcher sweep`?") from e
    if not isinstance(sweep, dict) or sweep.get("kind") != "sweep" or not isinstance(sweep.get("members"), list):
        raise ConfigError(f"{sweep_dir / SWEEP_FILE} is not a sweep record: pass a folder made by `python -m launcher sweep`")
    return sweep


def write_sweep(sweep_dir: Path, sweep: Dict[str, Any]) -> None:
    write_json(sweep_dir / SWEEP_FILE, sweep)


def member_argv(split: Tuple[List[str], List[str]], member: Dict[str, Any], sweep_dir: Path) -> List[str]:
    """A member's launcher arguments: the common ones, its overrides, its run directory, then the script.

    split: the sweep's base_args cut into (launcher arguments, script and its arguments) by
    launcher.usage.split_argv, which leaves `-m MODULE` at the end of the first part. Everything of
    ours goes before it (after it, all is the module's); --output-dir after the user's: the last flag wins.
    """
    ours, script = split
    module: List[str] = []
    if len(ours) >= 2 and ours[-2] == "-m":
        ours, module = ours[:-2], ours[-2:]
    overrides = [f"{k}={v}" for k, v in member["overrides"].items()]
    return [*ours, *overrides, f"run_id={member['run_dir']}", "--output-dir", str(sweep_dir), *module, *script]
