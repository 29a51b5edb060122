"""The code passes its linters at zero findings: ruff (pyproject.toml's [tool.ruff]) over the whole repository, and
mypy (its [tool.mypy]) over launcher/ and trainers/. A failure prints every finding.

mypy keeps its cache in the repository's .mypy_cache (ignored by git): a fresh clone's first run checks every
module and the typed packages they import (about 33 CPU-s and 1.1 GB), a later one only what changed (1.5 CPU-s).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, run_bounded

CHECKED_BY_MYPY = ("launcher", "trainers")  # [tool.mypy] files
# mypy's first run in a clone is half a minute of CPU: the file runs with the groups, not the units (tests/conftest.py)
pytestmark = pytest.mark.slow


def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[test]'")
    result = run_bounded([sys.executable, "-m", "ruff", "check", "--no-cache", "."], REPO, 120, what="ruff")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_is_configured_to_find_what_it_must(tmp_path: Path) -> None:
    """The rules the repository passes do fire: a mutable default (B006) and a line over 140 columns (E501)."""
    pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[test]'")
    bad = tmp_path / "bad.py"
    bad.write_text(f"def f(seen: list = []) -> list:\n    return seen  # {'x' * 140}\n", encoding="utf-8")
    result = run_bounded([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"),
                          "--output-format", "concise", str(bad)], tmp_path, 60, what="ruff")
    assert result.returncode == 1, result.stdout + result.stderr
    assert {"B006", "E501"} <= set(re.findall(r"\b([A-Z]+\d+)\b", result.stdout)), result.stdout


def test_mypy_finds_nothing_in_launcher_and_trainers() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed: pip install -e '.[test]'")
    result = run_bounded([sys.executable, "-m", "mypy"], REPO, 280, what="mypy")
    assert result.returncode == 0, result.stdout + result.stderr
    # every module of both folders was checked (an emptied `files` would pass on nothing)
    modules = sum(1 for folder in CHECKED_BY_MYPY for path in (REPO / folder).rglob("*.py")
                  if "__pycache__" not in path.parts)
    assert f"no issues found in {modules} source files" in result.stdout, result.stdout
