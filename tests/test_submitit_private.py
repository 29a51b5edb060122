"""What we take from submitit's private code, pinned: a submitit release that changes it fails here first.

launcher/backends/slurm/submitit_private.py is the one module allowed to touch submitit's private names
(submitit has no public API for either thing; that module's docstring says why).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Set

import pytest

from launcher.backends.slurm.submitit_private import expand_nodelist, sbatch_script
from tests.helpers import REPO

ADAPTER = REPO / "launcher" / "backends" / "slurm" / "submitit_private.py"


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("gpu[01-03,7],cpu5", ["gpu01", "gpu02", "gpu03", "gpu7", "cpu5"]),
    ("a[8-10]-ib", ["a8-ib", "a9-ib", "a10-ib"]),
    ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
])
def test_expand_nodelist_expands_slurm_host_lists(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-2", "node[a-b]"])
def test_expand_nodelist_refuses_what_slurm_never_writes(text):
    with pytest.raises(ValueError):
        expand_nodelist(text)


def test_sbatch_script_is_the_text_submit_would_send_and_writes_nothing(tmp_path):
    import submitit

    folder = tmp_path / "slurm"
    executor = submitit.SlurmExecutor(folder=folder, python=sys.executable)
    executor.update_parameters(job_name="pinned", nodes=2, ntasks_per_node=1, cpus_per_task=3, time=7)
    lines = sbatch_script(executor).splitlines()
    assert lines[0] == "#!/bin/bash"
    for expected in ("#SBATCH --job-name=pinned", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                     "#SBATCH --cpus-per-task=3", "#SBATCH --time=7"):
        assert expected in lines, expected
    srun = next(line for line in lines if line.startswith("srun "))
    assert srun.endswith(f"{sys.executable} -u -m submitit.core._submit {folder}")  # the task that unpickles ours
    assert not any(folder.rglob("*")), "rendering the script submits nothing"


def _submitit_private_names() -> Set[str]:
    """Every private function, method and class name defined in the installed submitit."""
    import submitit

    names: Set[str] = set()
    for path in Path(submitit.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) \
                    and node.name.startswith("_") and not node.name.startswith("__"):
                names.add(node.name)
    return names


def _imports_submitit(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] == "submitit" for a in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "submitit"


def test_only_the_adapter_touches_submitits_private_names():
    private = _submitit_private_names()
    offenders = []
    for package in ("launcher", "trainers", "cluster"):
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if path == ADAPTER or not any(_imports_submitit(node) for node in ast.walk(tree)):
                continue  # a module that never imports submitit holds no submitit object (os._exit is not one)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("submitit"):
                    offenders += [f"{path.relative_to(REPO)} imports {a.name}" for a in node.names if a.name.startswith("_")]
                elif isinstance(node, ast.Attribute) and node.attr in private \
                        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} uses .{node.attr}")
    assert not offenders, offenders
