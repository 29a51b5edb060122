"""The project's layering (tests/layering.py reads it from the imports; nothing is imported or started).

Six rules: no import cycles among the project's modules; no module takes another module's
private name; trainers/ know only the runtime contract of launcher/ (launcher.runtime); launcher/ imports
trainers/ only where it runs the built-in trainer (trainers/ is an optional leaf: the run records' formats are
launcher.runtime's); no module over 400 lines; launcher/ (and trainers/) is not one flat folder. Each rule is
checked against the real tree, and against small synthetic trees to prove that it can fail (and does not fire
on what it allows).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from tests.layering import (PACKAGES, PROJECT_ROOT, TRAINER_CONTRACT, TRAINERS, flat_launcher_modules, import_cycles,
                            oversized_modules, private_imports, scan_project, trainer_imports_outside_contract, within)

MAX_FLAT_TRAINER_MODULES = 12
# The launcher's modules that may import the built-in trainer, and why: each runs it or its models.
RUN_THE_TRAINER = {
    "launcher.worker.bootstrap": "the zygote of a built-in trainer job imports it before forking its workers",
    "launcher.worker.trainer": "a worker runs the built-in trainer's loop (train) and its stop flag (STOP)",
    "launcher.commands.speedup": "times the built-in models (MLP) in one process",
}


def launcher_imports_of_the_trainer(root: Path) -> list[str]:
    """Rule 4: outside RUN_THE_TRAINER, launcher/ reads what the trainer writes through launcher.runtime."""
    return sorted({f"{edge.source} imports {edge.target} (line {edge.line})"
                   for edge in scan_project(root).edges
                   if within(edge.target, TRAINERS) and not within(edge.source, TRAINERS) and not edge.implied
                   and edge.source not in RUN_THE_TRAINER})


# ---------------------------------------------------------------- the real tree


def test_no_import_cycles():
    cycles = import_cycles(PROJECT_ROOT)
    if cycles:
        pytest.fail("import cycles:\n" + "\n".join(cycles), pytrace=False)


def test_no_private_names_across_modules():
    uses = private_imports(PROJECT_ROOT)
    if uses:
        pytest.fail("private names taken across modules:\n" + "\n".join(uses), pytrace=False)


def test_trainers_import_only_the_runtime_contract():
    imports = trainer_imports_outside_contract(PROJECT_ROOT)
    if imports:
        pytest.fail(f"trainers/ may import only {TRAINER_CONTRACT}(.*):\n" + "\n".join(imports), pytrace=False)


def test_the_launcher_imports_the_trainer_only_to_run_it():
    imports = launcher_imports_of_the_trainer(PROJECT_ROOT)
    if imports:
        pytest.fail("launcher/ imports trainers/ outside the modules that run it (read its records through "
                    "launcher.runtime, or add the module to RUN_THE_TRAINER with why):\n" + "\n".join(imports), pytrace=False)
    found = {edge.source for edge in scan_project(PROJECT_ROOT).edges if within(edge.target, TRAINERS)}
    assert set(RUN_THE_TRAINER) <= found, f"no longer imports the trainer: {set(RUN_THE_TRAINER) - found}"


def test_no_module_over_400_lines():
    big = oversized_modules(PROJECT_ROOT)
    if big:
        pytest.fail("\n".join(big), pytrace=False)


def test_launcher_is_not_one_flat_folder():
    flat = flat_launcher_modules(PROJECT_ROOT)
    if flat:
        pytest.fail("\n".join(flat), pytrace=False)


def test_trainers_is_not_one_flat_folder():
    """trainers/ keeps the loop's entry points at its top and groups the rest (checkpoint/, metrics/, ...)."""
    flat = sorted(path.name for path in (PROJECT_ROOT / "trainers").glob("*.py"))
    assert len(flat) <= MAX_FLAT_TRAINER_MODULES, f"trainers/ holds {len(flat)} modules directly: {', '.join(flat)}"
    for init in (PROJECT_ROOT / "trainers").glob("*/__init__.py"):  # each group says what it owns
        assert init.read_text().startswith('"""'), f"{init.relative_to(PROJECT_ROOT)}: a one-line docstring"


def test_the_scan_sees_the_project():
    """Guards the rules above against passing vacuously on a tree they cannot find."""
    project = scan_project(PROJECT_ROOT)
    assert {"launcher", "launcher.cli", "launcher.trainers.train", "launcher.backends.slurm.environment"} <= set(project.modules)
    assert any(edge.source == "launcher.cli" for edge in project.edges)


# ---------------------------------------------------------------- synthetic trees: each rule can fail


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write {relative path: source} under root, with empty __init__.py where none is given."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for package in PACKAGES:
        init = root / package / "__init__.py"
        if not init.exists():
            init.parent.mkdir(parents=True, exist_ok=True)
            init.write_text("", encoding="utf-8")
    return root


RuleCheck = Callable[[Path], list[str]]

FAILING_TREES: list[tuple[str, RuleCheck, dict[str, str], str]] = [
    ("cycle via a deferred import", import_cycles,
     {"launcher/a.py": "import launcher.b\n", "launcher/b.py": "def later():\n    from launcher import a\n"},
     "launcher.a -> launcher.b -> launcher.a"),
    ("cycle via relative imports", import_cycles,
     {"trainers/a.py": "from .b import x\n", "trainers/b.py": "from . import a\n"},
     "launcher.trainers.a -> launcher.trainers.b -> launcher.trainers.a"),
    ("cycle via a parent package's __init__", import_cycles,
     {"launcher/runtime/__init__.py": "from launcher.agent.env import RANK\n", "launcher/agent/__init__.py": "",
      "launcher/agent/env.py": "from launcher.runtime.contract import RANK\n",
      "launcher/runtime/contract.py": "RANK = 'RANK'\n"},
     "launcher.agent.env -> launcher.runtime -> launcher.agent.env"),
    ("three-module cycle", import_cycles,
     {"launcher/a.py": "from launcher.b import f\n", "launcher/b.py": "from launcher.c import g\n",
      "launcher/c.py": "import launcher.a\n"},
     "launcher.a -> launcher.b -> launcher.c -> launcher.a"),
    ("private import", private_imports,
     {"launcher/run.py": "def _finish():\n    pass\n", "launcher/node.py": "from launcher.run import _finish\n"},
     "launcher.node imports _finish from launcher.run"),
    ("private re-export by the package", private_imports,
     {"launcher/__init__.py": "from .run import _finish\n", "launcher/run.py": "def _finish():\n    pass\n"},
     "launcher imports _finish from launcher.run"),
    ("private attribute of an imported module", private_imports,
     {"launcher/run.py": "def _finish():\n    pass\n", "launcher/node.py": "from launcher import run\nrun._finish()\n"},
     "launcher.node uses _finish from launcher.run"),
    ("trainers import launcher.config", trainer_imports_outside_contract,
     {"launcher/config.py": "", "trainers/train.py": "def main():\n    from launcher.config import load\n"},
     "launcher.trainers.train imports launcher.config"),
    ("trainers import the launcher package", trainer_imports_outside_contract,
     {"trainers/train.py": "from launcher import heartbeat\n"},
     "launcher.trainers.train imports launcher (line 1)"),
    ("the launcher reads a trainer's module", launcher_imports_of_the_trainer,
     {"trainers/metrics/goodput.py": "", "launcher/rundir.py": "from launcher.trainers.metrics.goodput import x\n"},
     "launcher.rundir imports launcher.trainers.metrics.goodput (line 1)"),
    ("401-line module", oversized_modules,
     {"cluster/big.py": "x = 1\n" * 401},
     "cluster/big.py has 401 lines"),
    ("16 flat launcher modules", flat_launcher_modules,
     {f"launcher/m{i}.py": "" for i in range(15)},
     "launcher/ holds 16 modules directly"),
]


@pytest.mark.parametrize("check, files, expected", [case[1:] for case in FAILING_TREES],
                         ids=[case[0] for case in FAILING_TREES])
def test_each_rule_can_fail(tmp_path, check, files, expected):
    report = check(write_tree(tmp_path, files))
    assert any(expected in line for line in report), report


PASSING_TREES: list[tuple[str, RuleCheck, dict[str, str]]] = [
    ("cycle only under TYPE_CHECKING", import_cycles,
     {"launcher/a.py": "from typing import TYPE_CHECKING\nimport launcher.b\nif TYPE_CHECKING:\n    import launcher.c\n",
      "launcher/b.py": "", "launcher/c.py": "import typing\nif typing.TYPE_CHECKING:\n    from launcher import a\n"}),
    ("importlib strings are a dispatch table", import_cycles,
     {"launcher/cli.py": "import importlib\nCOMMANDS = {'run': 'launcher.run'}\n"
                         "def main(n):\n    return importlib.import_module(COMMANDS[n])\n",
      "launcher/run.py": "from launcher import cli\n"}),
    ("a submodule the package __init__ imports", import_cycles,
     {"launcher/__init__.py": "from launcher.beats import heartbeat\n",
      "launcher/beats.py": "from launcher.errors import E\n", "launcher/errors.py": "class E(Exception):\n    pass\n"}),
    ("private name used in its own module", private_imports,
     {"launcher/run.py": "def _finish():\n    pass\n_finish()\n", "launcher/node.py": "from launcher.run import __all__\n"}),
    ("trainers use the runtime contract", trainer_imports_outside_contract,
     {"launcher/runtime/__init__.py": "", "launcher/runtime/env.py": "",
      "trainers/a.py": "import launcher.runtime\nfrom launcher.runtime.env import RANK\nfrom launcher import runtime\n"}),
    ("the worker runs the trainer; the launcher reads the runtime", launcher_imports_of_the_trainer,
     {"trainers/train.py": "from launcher.runtime.goodput import x\n", "launcher/runtime/goodput.py": "",
      "launcher/worker/trainer.py": "from launcher.trainers.train import train\n"}),
    ("400-line module", oversized_modules, {"cluster/ok.py": "x = 1\n" * 400}),
    ("15 flat modules and a subpackage", flat_launcher_modules,
     {**{f"launcher/m{i}.py": "" for i in range(14)}, "launcher/sub/__init__.py": "", "launcher/sub/a.py": ""}),
]


@pytest.mark.parametrize("check, files", [case[1:] for case in PASSING_TREES],
                         ids=[case[0] for case in PASSING_TREES])
def test_each_rule_allows_what_it_should(tmp_path, check, files):
    assert check(write_tree(tmp_path, files)) == []
