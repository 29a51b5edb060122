"""Nothing of the project shadows a user's modules: a user's trainers.py, tests.py, cluster.py and configs.py
beside the script, in the working folder and on PYTHONPATH are the ones the script imports, under
`python -m launcher` and the `launcher` command alike, at --gpus 4 and at --nodes 2; and the launcher itself
still runs (the built-in trainer too) from a folder that holds them.

The expected answer is torchrun's: the same script, the same folders, run under torchrun first.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from tests.helpers import NO_WANDB, QUICK, REPO, run_bounded

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = REPO / "tests" / "scripts" / "user_modules.py"
NAMES = ("trainers", "tests", "cluster", "configs")
LAUNCHER_COMMAND = str(Path(sys.executable).parent / "launcher")
COMMANDS = {"python -m launcher": [sys.executable, "-m", "launcher"], "launcher": [LAUNCHER_COMMAND]}
SHAPES = {"one node": (["--gpus", "4"], 4), "two nodes": (["--nodes", "2", "--gpus", "1"], 2)}


def user_module(folder: Path, names, where: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.py").write_text(f"NAME = {where!r}\n")


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """Two jobs: a script whose own folder holds trainers.py and tests.py, started from a working folder that
    holds all four names; and a module (-m) started from a working folder that holds trainers.py and tests.py.
    Both find cluster.py and configs.py on PYTHONPATH."""
    root = tmp_path_factory.mktemp("user-modules")
    user_module(root / "pp", ("cluster", "configs"), "pythonpath")
    script_cwd = root / "script-job"
    user_module(script_cwd, NAMES, "cwd")
    user_module(script_cwd / "job", ("trainers", "tests"), "beside")
    shutil.copy(SCRIPT, script_cwd / "job" / "user_modules.py")
    module_cwd = root / "module-job"
    user_module(module_cwd, ("trainers", "tests"), "cwd")
    (module_cwd / "userjob").mkdir()
    (module_cwd / "userjob" / "__init__.py").write_text("")
    shutil.copy(SCRIPT, module_cwd / "userjob" / "user_modules.py")
    return {"root": root, "pp": root / "pp", "script": script_cwd, "module": module_cwd}


TARGETS = {"script": ["job/user_modules.py"], "module": ["-m", "userjob.user_modules"]}


def seen_by_ranks(out: Path, world: int) -> List[dict]:
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(world)]


def run_job(argv: List[str], cwd: Path, out: Path, pp: Path, what: str, world: int = 2) -> List[dict]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    done = run_bounded(argv + ["--out", str(out)], cwd, 150, {"PYTHONPATH": str(pp), "OMP_NUM_THREADS": "1"}, what)
    assert done.returncode == 0, done.stderr[-3000:]
    return seen_by_ranks(out, world)


@pytest.fixture(scope="module")
def torchruns(layout) -> Dict[str, List[dict]]:
    """What torchrun's workers import, for each job shape: the expected answer."""
    found = {}
    for kind, target in TARGETS.items():
        argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *target]
        found[kind] = run_job(argv, layout[kind], layout["root"] / f"torchrun-{kind}", layout["pp"], "torchrun")
    return found


def test_torchrun_imports_the_users_modules_from_where_python_finds_them(torchruns):
    """The baseline itself: the script's folder (or, for -m, the working folder) first, then PYTHONPATH."""
    assert torchruns["script"][0]["modules"] == {"trainers": "beside", "tests": "beside", "cluster": "pythonpath",
                                                 "configs": "pythonpath"}
    assert torchruns["module"][0]["modules"] == {"trainers": "cwd", "tests": "cwd", "cluster": "pythonpath",
                                                 "configs": "pythonpath"}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_scripts_own_modules_are_imported_never_the_launchers(layout, torchruns, command, shape):
    for kind, target in TARGETS.items():
        out = layout["root"] / f"ours-{kind}-{command.replace(' ', '_')}-{shape.replace(' ', '_')}"
        flags, world = SHAPES[shape]
        argv = [*COMMANDS[command], *flags, f"output_dir={layout['root'] / 'runs'}", *NO_WANDB, *target]
        ours = run_job(argv, layout[kind], out, layout["pp"], command, world)
        theirs = torchruns[kind][0]  # every rank of a job sees the same modules and path
        for rank, seen in enumerate(ours):
            assert seen["modules"] == theirs["modules"], (kind, rank)
            assert seen["path"] == theirs["path"], (kind, rank)  # no folder of the project added, element by element
            assert seen["pythonpath"] == str(layout["pp"]) and seen["world_size"] == world
            assert str(REPO) not in seen["path"]


def test_the_launcher_and_its_trainer_run_from_a_folder_holding_those_names(layout):
    """A working folder with trainers.py, tests.py, cluster.py and configs.py: the launcher's own imports, the
    shipped configs (--config quick) and the built-in trainer are the installed package's."""
    done = run_bounded([sys.executable, "-m", "launcher", "--gpus", "2", "--config", "quick", "trainer.steps=3",
                        "wandb.mode=disabled", f"output_dir={layout['root'] / 'runs'}", *QUICK],
                       layout["script"], 150, {"PYTHONPATH": str(layout["pp"])}, "launcher")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "completed" in done.stderr.splitlines()[-1]


def test_the_installed_distribution_has_one_top_level_name():
    """What pip recorded for this install: `launcher` only (tests/test_packaging.py checks a built wheel)."""
    code = ("import importlib.metadata as m, json; d = m.distribution('torch-launcher'); "
            "print(json.dumps((d.read_text('top_level.txt') or '').split()))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) in (["launcher"], [])  # an editable install may record none
    for name in NAMES:
        probe = subprocess.run([sys.executable, "-c", f"import importlib.util as u; print(u.find_spec({name!r}))"],
                               capture_output=True, text=True, timeout=60, cwd="/")
        assert probe.stdout.strip() == "None", (name, probe.stdout)
