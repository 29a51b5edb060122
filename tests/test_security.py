"""Nothing of a job on one machine is reachable from another: every socket it listens on is on loopback.

A real job whose ranks hold their process group open until told; meanwhile the test reads every
listening TCP socket of the launcher's process tree (agent, node agents, zygote, workers), as
`ss -ltnp` would show them.
"""

from __future__ import annotations

import ipaddress
import time
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest

from tests.helpers import descendants, finish_all, start_launcher

pytestmark = pytest.mark.timeout(180)

# Each rank joins the process group, does one all-reduce (so gloo's connections are up), says it is
# ready, and keeps everything open until the test writes GO.
HOLDING_SCRIPT = """
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
here = Path(sys.argv[1])
(here / f"ready-{os.environ['RANK']}").touch()
while not (here / "GO").exists():
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
"""


def listening_sockets(root: int) -> List[Tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of root and its descendants."""
    found = []
    for proc in [psutil.Process(root), *descendants(root)]:
        try:
            connections = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        found += [(proc.pid, c.laddr.ip, c.laddr.port) for c in connections if c.status == psutil.CONN_LISTEN]
    return found


def wait_for(paths: List[Path], proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert proc.poll() is None, f"the launcher ended early: {proc.stdout.read()}"
        assert time.monotonic() < deadline, "the ranks did not get ready in time"
        time.sleep(0.2)


@pytest.mark.parametrize("shape", [["--gpus", "2"], ["--nodes", "2", "--gpus", "1"]], ids=["single", "simulated"])
def test_every_socket_of_a_job_on_one_machine_listens_on_loopback(tmp_path, shape):
    script = tmp_path / "hold.py"
    script.write_text(HOLDING_SCRIPT)
    proc = start_launcher([*shape, f"output_dir={tmp_path / 'runs'}", str(script), str(tmp_path)], tmp_path)
    try:
        wait_for([tmp_path / f"ready-{r}" for r in range(2)], proc, timeout=120)
        sockets = listening_sockets(proc.pid)
    finally:
        (tmp_path / "GO").touch()
    out, = finish_all([proc], timeout=60)
    assert proc.returncode == 0, out
    # the rendezvous store at least: a test that saw no socket would prove nothing
    assert sockets, "no listening socket found in the job's processes"
    exposed = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert exposed == [], f"listening beyond loopback (pid, address, port): {exposed}; all: {sockets}"


def test_node_files_copied_to_the_head_never_land_outside_their_shapes(tmp_path):
    """A batch of another node's files (launcher.backends.mirror) names its paths: the head writes only a rank's
    log, records and stacks and a node's record, below its run directory, whatever else a batch names."""
    from launcher.backends.mirror_files import Copies, encode

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    forged = ["../outside.log", "logs/../../outside.log", "/tmp/outside.log", "logs/x/rank-1.log", "config.yaml",
              "logs/rank-1.log/../../../outside.log", "heartbeats/rank-1"]
    good = ["logs/rank-3.log", "steps/rank-3.jsonl", "nodes/node-1.json"]
    names = forged + good
    blob = encode([(n, "w" if n.endswith(".json") or n == "config.yaml" else "a", 0, 3) for n in names],
                  [b"abc"] * len(names))
    assert Copies(str(run_dir)).apply(blob) == len(forged)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(f"run/{n}" for n in good)
