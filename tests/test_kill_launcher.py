"""A SIGKILLed launcher leaves no process of its job behind: not its workers, and not the processes a script
started itself (a child, a grandchild through a shell, a child in a session of its own). torchrun leaves the
script's children running (PPID 1); the zygote, a subreaper, adopts them as their parents die and kills them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.helpers import kill_group, start_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SCRIPT = Path(__file__).parent / "scripts" / "children.py"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def recorded_pids(out: Path, ranks: int, proc, timeout: float) -> List[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [out / f"pids-{r}" for r in range(ranks)]
        if all(f.is_file() for f in files):
            return [int(p) for f in files for p in f.read_text().split()]
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start their processes within {timeout}s")


@pytest.mark.parametrize("shape", [["--gpus", "2"], ["--nodes", "2", "--gpus", "1"]], ids=["gpus2", "nodes2"])
def test_a_sigkilled_launcher_takes_the_scripts_own_processes_with_it(tmp_path, shape):
    out = tmp_path / "out"
    out.mkdir()
    proc = start_launcher([*shape, f"output_dir={tmp_path / 'runs'}", str(SCRIPT), str(out)], tmp_path)
    pids: List[int] = []
    try:
        pids = recorded_pids(out, 2, proc, 150)
        assert all(alive(p) for p in pids), pids
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, as an OOM killer or `kill -9 PID` does
        proc.wait(timeout=10)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.2)
        left = {p: " ".join(psutil.Process(p).cmdline()) for p in pids if alive(p)}
        assert not left, f"outlived the SIGKILLed launcher: {left}"
    finally:
        for pid in pids:  # the processes the job started for this test, by id
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        kill_group(proc)
        proc.wait(timeout=10)
