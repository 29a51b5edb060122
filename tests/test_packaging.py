"""`pip install .` (not only editable) must carry the packages, the shipped configs and the dev cluster, all under
one top-level name."""

import subprocess
import sys
import zipfile

import pytest

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
