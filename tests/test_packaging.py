"""`pip install .` (not only editable) must carry the packages, the shipped configs and the dev cluster, all under
one top-level name; and `pip install -e .` keeps the torch a user has."""

import configparser
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from typing import List, Tuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers import REPO


@pytest.mark.timeout(180)
def test_wheel_carries_configs_and_console_script(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=170,
    )
    assert proc.returncode == 0, proc.stderr
    wheel = next(tmp_path.glob("*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in ("launcher/cli.py", "launcher/trainers/train.py", "launcher/configs/quick.yaml",
                     "launcher/configs/mlp_ddp.yaml", "launcher/cluster/__init__.py", "launcher/cluster/devcluster/up.sh",
                     "launcher/board/static/board.js", "launcher/board/static/board.html"):
        assert expected in names, expected
    # every package of the source tree is in it (setup.cfg lists them: a new subpackage must be added there)
    for init in REPO.joinpath("launcher").rglob("__init__.py"):
        assert init.relative_to(REPO).as_posix() in names, init
    for init in REPO.joinpath("trainers").rglob("__init__.py"):  # installed as launcher/trainers/...
        assert f"launcher/{init.relative_to(REPO).as_posix()}" in names, init
    # one top-level name: nothing of ours can shadow a user's trainers.py, configs.py, cluster.py or tests/
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} == {"launcher"}
    top_level = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["launcher"]
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "launcher = launcher.__main__:entry" in zipfile.ZipFile(wheel).read(entry_points).decode()


def _torch_requirements() -> List[Tuple[str, Requirement]]:
    """Every requirement on torch that `pip install -e .` weighs: ours (setup.cfg) and those of the distributions it
    pulls in, as installed here (their metadata), with markers that do not apply here dropped."""
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg", encoding="utf-8")
    ours = [Requirement(line.split("#", 1)[0]) for line in cfg["options"]["install_requires"].splitlines()
            if line.split("#", 1)[0].strip()]
    found, seen, todo = [], set(), [("setup.cfg", r) for r in ours]
    while todo:
        who, req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name == "torch":
            found.append((who, req))
            continue  # torch's own requirements do not bind torch
        if name in seen:
            continue
        seen.add(name)
        requires = importlib.metadata.distribution(req.name).requires or []
        todo += [(req.name, Requirement(r)) for r in requires]
    return found


@pytest.mark.parametrize("torch_version", ["2.14.1", "2.15.0"])
def test_pip_install_beside_a_supported_torch_keeps_it(torch_version):
    """`pip install -e .` beside torch X keeps X when every requirement on torch in the install admits X: pip's
    resolver leaves an installed distribution that satisfies every requirement on it as it is (its default upgrade
    strategy, only-if-needed). Those requirements are ours and our dependencies' (none of which names torch today).

    tests/run.sh makes the real install, torch first and then `pip install -e .`, beside the newest release and the
    oldest supported torch on every run, and fails if pip replaced that torch. 2.14.1 is checked only here: the real
    install would cost CI a ~3-minute download of a torch that a one-line requirement decides, and that this reads
    in milliseconds; 2.15.0 is checked both ways."""
    found = _torch_requirements()
    assert [who for who, _ in found] == ["setup.cfg"], found
    for who, req in found:
        assert req.specifier.contains(torch_version), f"{who} requires {req}: pip would replace a user's torch {torch_version}"


def test_run_sh_tests_the_oldest_torch_setup_cfg_admits():
    """The floor in setup.cfg is the torch tests/run.sh runs the compatibility layer on: a lower floor is untested."""
    [(_, req)] = _torch_requirements()
    floors = [spec.version for spec in req.specifier if spec.operator == ">="]
    assert len(floors) == 1, req
    assert re.search(rf"^COMPAT_TORCH=.*\b{re.escape(floors[0])}\b", (REPO / "tests" / "run.sh").read_text(), re.M), floors
