"""Every package our code imports is declared in setup.cfg, and an optional one is imported only where it may be.

Read from the source (ast), not by importing it: a module imported only by the board command counts as much
as one every run imports. A top-level import name maps to its distribution through the installed packages
(importlib.metadata.packages_distributions: `yaml` is PyYAML), so the venv must hold the test extra.
"""

from __future__ import annotations

import ast
import configparser
import functools
import importlib.metadata
import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

from tests.helpers import REPO

PACKAGES = ("launcher", "trainers", "cluster")
# Where an extra's packages may be imported at module level: modules the rest reach only from inside a
# function (the board command, the ray backend), so `pip install torch-launcher` without the extra still runs.
OPTIONAL_HOMES: Dict[str, Tuple[str, ...]] = {"board": ("launcher/board",), "ray": ("launcher/backends/ray",)}
# Declared, but seconds of start-up that most runs never need: imported inside the function that uses it.
LAZY_REQUIRED = {"wandb"}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(block: str) -> Set[str]:
    """Distribution names of a setup.cfg requirement list (versions, extras, markers and comments dropped)."""
    names = set()
    for line in block.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_normal(re.split(r"[\s\[<>=!~;]", line, maxsplit=1)[0]))
    return names


def declared() -> Tuple[Set[str], Dict[str, Set[str]]]:
    """install_requires, and each extra's distributions."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    extras = {name: _requirement_names(block) for name, block in cfg["options.extras_require"].items()}
    return _requirement_names(cfg["options"]["install_requires"]), extras


def imports(path: Path) -> Iterator[Tuple[str, int, bool]]:
    """(module imported, line, inside a function) of each absolute import in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def walk(node: ast.AST, in_function: bool) -> Iterator[Tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                yield from ((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module, child.lineno, in_function
            yield from walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from walk(tree, False)


@functools.lru_cache(maxsize=None)
def third_party() -> List[Tuple[str, str, int, bool]]:
    """(import name, module path, line, inside a function) for every import that is neither stdlib nor ours."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for module, line, lazy in imports(path):
                name = module.split(".")[0]
                if name not in sys.stdlib_module_names and name not in ("__future__", "launcher", *PACKAGES):
                    found.append((name, path.relative_to(REPO).as_posix(), line, lazy))
    return found


def test_every_third_party_import_is_a_declared_distribution():
    required, extras = declared()
    everything = required.union(*extras.values())
    by_name = importlib.metadata.packages_distributions()
    missing = []
    for name, where, line, _ in third_party():
        distributions = {_normal(d) for d in by_name.get(name, [])}
        if not distributions:
            missing.append(f"{where}:{line} imports {name}, which no installed distribution provides")
        elif not distributions & everything:
            missing.append(f"{where}:{line} imports {name} ({', '.join(sorted(distributions))}): not in setup.cfg "
                           "install_requires or an extra")
    assert not missing, "\n".join(missing)


def test_optional_packages_are_imported_only_where_their_extra_is_needed():
    required, extras = declared()
    by_name = importlib.metadata.packages_distributions()
    wrong = []
    for name, where, line, lazy in third_party():
        distributions = {_normal(d) for d in by_name.get(name, [])}
        if distributions & required:
            if name in LAZY_REQUIRED and not lazy:
                wrong.append(f"{where}:{line} imports {name} at module level: import it in the function that uses it")
            continue
        if not distributions & required.union(*extras.values()):
            continue  # undeclared: the test above names it
        owners = [extra for extra, names in extras.items() if distributions & names and extra in OPTIONAL_HOMES]
        at_home = any(where.startswith(home + "/") for extra in owners for home in OPTIONAL_HOMES[extra])
        if not lazy and not at_home:
            wrong.append(f"{where}:{line} imports {name} (an optional extra) at module level")
    assert not wrong, "\n".join(wrong)


def test_optional_homes_are_reached_only_from_inside_functions():
    """A module-level import of launcher.board (say) anywhere else would make flask a hard dependency."""
    homes = [home.replace("/", ".") for paths in OPTIONAL_HOMES.values() for home in paths]
    wrong = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            where = path.relative_to(REPO).as_posix()
            if any(where.startswith(home.replace(".", "/") + "/") for home in homes):
                continue
            wrong += [f"{where}:{line} imports {module} at module level" for module, line, lazy in imports(path)
                      if not lazy and any(module == home or module.startswith(home + ".") for home in homes)]
    assert not wrong, "\n".join(wrong)


def test_yaml_is_declared_in_its_own_right():
    """PyYAML came only through omegaconf's requirements while launcher.config imports it directly."""
    required, _ = declared()
    assert "pyyaml" in required
