"""`pip install .` (not only editable) must carry the packages, the shipped configs and the dev cluster."""

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
    for expected in ("launcher/cli.py", "trainers/train.py", "configs/quick.yaml", "configs/mlp_ddp.yaml", "cluster/__init__.py",
                     "launcher/board/static/board.js", "launcher/board/static/board.html"):
        assert expected in names, expected
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "launcher = launcher.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
