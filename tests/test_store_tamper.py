"""Another local process, or another user, writing to a one-machine job's loopback store ends the job in
one line naming the store and what happened, never in a misleading rendezvous timeout (docs/security.md).

A real job holds its process group open; the attacker, a separate process with a plain TCPStore client
(as anyone on the machine can run: the job's loopback ports are visible to every user in
/proc/net/tcp), connects to the launcher's listening ports and overwrites the rendezvous keys. As root,
the same attack is made by a second, temporary user: the attacker imports torch as root (this
interpreter lives under /root, which another user cannot enter), then drops to that user's uid and
gid for good before it connects. Every run is bounded and leaves no process.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import psutil
import pytest

from tests.helpers import group_processes, kill_group, only_run_dir, start_launcher, wait_gone

pytestmark = pytest.mark.timeout(240)

# Each rank joins its process group, says it is ready, and holds everything open until GO (or 120 s).
HOLDING_SCRIPT = """
import os, sys, time
from pathlib import Path
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
here = Path(sys.argv[1])
(here / f"ready-{os.environ['RANK']}").touch()
deadline = time.monotonic() + 120
while not (here / "GO").exists() and time.monotonic() < deadline:
    time.sleep(0.1)
"""

# The attacker: python attacker.py KIND RDZV_ID MARKER UID PORT...; as UID (-1: as is), writes over the
# rendezvous keys on every port it is given that answers as a store. Prints its uid and how many stores
# it wrote to.
ATTACKER = """
import base64, datetime, os, pickle, pwd, sys
from torch.distributed import TCPStore
kind, rdzv_id, marker, uid, ports = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]
if uid >= 0:
    os.setgroups([])
    os.setgid(pwd.getpwuid(uid).pw_gid)
    os.setuid(uid)  # for good: no way back to root from here

class Forged:
    def __reduce__(self):
        return (open, (marker, "w"))

value = {"forged": base64.b64encode(pickle.dumps(Forged())).decode(), "garbage": "not a state at all!",
         "reset": "Y2FuaW1hZGFt"}[kind]  # reset: torch's empty-state sentinel
written = 0
for port in ports:
    try:
        store = TCPStore("127.0.0.1", int(port), is_master=False, timeout=datetime.timedelta(seconds=5))
        store.set(f"torch.rendezvous.{rdzv_id}", value)
        store.set(f"torch.rendezvous.{rdzv_id}.0/MASTER_PORT", "1")
        written += 1
    except Exception as e:
        print(f"port {port}: {e!r}", file=sys.stderr)
print(os.getuid(), written)
"""


def listening_ports(pid: int) -> List[int]:
    """The loopback TCP ports the launcher process itself listens on (its rendezvous and workers' stores)."""
    found = psutil.Process(pid).net_connections(kind="tcp")
    return sorted({c.laddr.port for c in found if c.status == psutil.CONN_LISTEN})


def wait_ready(tmp_path: Path, proc: subprocess.Popen, ranks: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all((tmp_path / f"ready-{r}").exists() for r in range(ranks)):
        assert proc.poll() is None, f"the launcher ended early: {proc.stdout.read()}"
        assert time.monotonic() < deadline, "the ranks did not get ready in time"
        time.sleep(0.2)


@pytest.fixture
def other_user() -> Iterator[Optional[str]]:
    """A temporary second user (removed afterwards), as root; None elsewhere. Its only process is the
    attacker, which subprocess.run waits for (and kills on its timeout) before the user is removed."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        yield None
        return
    name = f"lt{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], timeout=30, check=False)


def attack(kind: str, rdzv_id: str, marker: Path, ports: List[int], user: Optional[str]) -> None:
    """Run the attacker (as user, where given) from a world-readable folder; it must have written somewhere."""
    folder = Path(tempfile.mkdtemp(prefix="tamper-"))
    uid = pwd.getpwnam(user).pw_uid if user else -1
    try:
        folder.chmod(0o755)
        (folder / "attacker.py").write_text(ATTACKER)
        argv = [sys.executable, str(folder / "attacker.py"), kind, rdzv_id, str(marker), str(uid), *map(str, ports)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    ran_as, written = map(int, done.stdout.split())
    assert written > 0, done.stderr
    assert ran_as == (uid if user else os.getuid()), done.stdout


def attacked_job(tmp_path: Path, shape: List[str], kind: str, user: Optional[str],
                 go: bool = False) -> Tuple[subprocess.Popen, str, List[int], Dict[str, Any]]:
    """A holding job of this shape, attacked once its ranks are ready (go: then let them end); returns the
    launcher, its output, the ports attacked and plan.json. Asserts the forged state was never unpickled and that
    nothing is left running."""
    script = tmp_path / "hold.py"
    script.write_text(HOLDING_SCRIPT)
    marker = Path(tempfile.gettempdir()) / f"tamper-{uuid.uuid4().hex}"  # a second user can write there
    proc = start_launcher([*shape, f"output_dir={tmp_path / 'runs'}", str(script), str(tmp_path)], tmp_path)
    try:
        wait_ready(tmp_path, proc, 2, timeout=120)
        ports = listening_ports(proc.pid)
        plan = json.loads((only_run_dir(tmp_path / "runs") / "plan.json").read_text())
        attack(kind, plan["rdzv_id"], marker, ports, user)
        if go:
            (tmp_path / "GO").touch()
        out, _ = proc.communicate(timeout=60)
        left = wait_gone(group_processes(proc.pid), timeout=10)
    finally:
        (tmp_path / "GO").touch()
        kill_group(proc)
    assert left == [], f"left running after the launcher exited: {left}"
    assert not marker.exists(), "the forged state was unpickled"
    return proc, out, ports, plan


@pytest.mark.parametrize("kind,as_user", [("forged", False), ("garbage", False), ("reset", False), ("forged", True)],
                         ids=["forged-state", "garbage", "reset-to-empty", "forged-by-another-user"])
def test_a_stranger_writing_to_the_jobs_store_ends_it_in_one_line(tmp_path, other_user, kind, as_user):
    if as_user and other_user is None:
        pytest.skip("needs root (useradd, setuid) to attack as a second user")
    # elastic: torch's c10d rendezvous, whose state is pickled (a one-node job's static one has none: below)
    proc, out, ports, _ = attacked_job(tmp_path, ["--nodes", "1:2"], kind, other_user if as_user else None)
    assert proc.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    # one line, or one per node that read the state before it was stopped: the same cause, no node "lost" to it
    assert len({line.split(":", 2)[2] for line in errors}) == 1 and len(errors) <= 2, out
    assert "goes on without it" not in out, out
    port = next(p for p in ports if f"127.0.0.1:{p}" in errors[0])
    assert "a value not signed by this job (another user or process wrote to this job's store)" in errors[0], out
    assert f"at 127.0.0.1:{port}" in errors[0]
    assert "did not meet" not in out and "Traceback" not in out, out


def test_a_one_node_job_has_no_rendezvous_state_a_stranger_could_forge(tmp_path):
    """One node runs on torch's static rendezvous: no state is read back from its store, so a forged one is never
    loaded and the job trains on to its end."""
    proc, out, _, plan = attacked_job(tmp_path, ["--gpus", "2"], "forged", None, go=True)
    assert plan["rdzv_backend"] == "static", plan
    assert proc.returncode == 0 and "completed" in out, out
