"""A real Ray cluster on this machine for the tests: a head and N-1 more nodes, each `ray start --block`.

Each node is its own `ray start` process (its raylet, and on the head the GCS, are its children), so a
node is killed by its raylet's pid and the whole cluster is stopped by those pids: nothing else on the
machine is touched. Small on purpose (2 logical CPUs a node, no dashboard, a small object store).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil
import pytest

from tests.helpers import SESSION_PIDS, free_port, launcher_env

CPUS_PER_NODE = 2
QUERY_MARK = "launcher-tests-query: "
QUERY = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False, namespace="launcher-tests")
from ray.util import placement_group_table
pgs = [p["name"] for p in placement_group_table().values() if p["state"] != "REMOVED"]
actors = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
nodes = [{"id": n["NodeID"], "alive": n["Alive"]} for n in ray.nodes()]
print(sys.argv[2] + json.dumps({"placement_groups": pgs, "actors": actors, "nodes": nodes}), flush=True)
"""


def ray_or_skip() -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install -e .[ray])")


class RayDevCluster:
    def __init__(self, root: Path, nodes: int) -> None:
        self.root, self.count = root, nodes
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: List[subprocess.Popen] = []
        self.killed: set = set()  # Ray node ids whose raylet a test killed: Ray calls them alive for ~30 s more
        self.temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it (108 bytes max)
        self.env = launcher_env({"RAY_USAGE_STATS_ENABLED": "0"})
        self.env.pop("RAY_ADDRESS", None)

    def start(self, timeout: float = 180) -> "RayDevCluster":
        ray_bin = str(Path(sys.executable).parent / "ray")
        common = ["--block", f"--num-cpus={CPUS_PER_NODE}", "--num-gpus=0", "--object-store-memory=100000000",
                  "--disable-usage-stats"]
        self.common = common
        for attempt in range(3):  # Ray's own start-up timeouts (GCS, raylet) can end a head on a loaded machine
            if attempt:  # what a failed head left may still hold its port
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
            head = [ray_bin, "start", "--head", f"--port={self.port}", "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}", f"--temp-dir={self.temp}", *common]
            self._spawn(head, "head")
            if self._wait_started(self.procs[-1], "head", timeout):
                break
            SESSION_PIDS.discard(self.procs[-1].pid)
            self.procs.pop()
        else:
            raise AssertionError(f"the Ray head did not start in 3 tries: see {self.root}/head.out")
        self.grow_to(self.count, timeout)
        return self

    def grow_to(self, count: int, timeout: float = 240) -> None:
        """Start nodes, one at a time, until count are alive (a test that killed one leaves the next a whole cluster)."""
        SESSION_PIDS.difference_update(p.pid for p in self.procs if p.poll() is not None)  # nodes killed earlier
        alive = sum(n["alive"] and n["id"] not in self.killed for n in self.query()["nodes"])
        for _ in range(count - alive):
            for _attempt in range(3):  # `ray start` gives a node 30 s to register, which a loaded machine can miss
                name = f"node{len(self.procs)}"
                self._spawn([str(Path(sys.executable).parent / "ray"), "start", f"--address={self.address}",
                             *self.common], name)
                if self._wait_started(self.procs[-1], name, timeout):
                    break
                SESSION_PIDS.discard(self.procs[-1].pid)
            else:
                raise AssertionError(f"a Ray node did not start in 3 tries: see {self.root}/*.out")

    def _wait_started(self, proc: subprocess.Popen, name: str, timeout: float) -> bool:
        """True once `ray start --block` says its node is up (read from its output: no Ray client started here)."""
        out, deadline = self.root / f"{name}.out", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if out.is_file() and "will now block forever" in out.read_text(errors="replace"):
                return True
            if proc.poll() is not None:
                return False
            time.sleep(0.5)
        raise AssertionError(f"the Ray node {name} did not start in {timeout}s: see {out}")

    def _spawn(self, argv: List[str], name: str) -> None:
        out = open(self.root / f"{name}.out", "ab")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
        out.close()
        self.procs.append(proc)
        SESSION_PIDS.add(proc.pid)

    def query(self) -> Dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", QUERY, self.address, QUERY_MARK], capture_output=True, text=True,
                              timeout=120, env=self.env)
        assert done.returncode == 0, done.stderr[-2000:]
        # Ray may print to stdout too (e.g. "raylet has lagging heartbeats" after a node was killed): only our line
        ours = [line[len(QUERY_MARK):] for line in done.stdout.splitlines() if line.startswith(QUERY_MARK)]
        assert len(ours) == 1, done.stdout[-2000:]
        return json.loads(ours[0])

    def raylet_pid(self, node_id: str) -> Optional[int]:
        for proc in self.procs:
            try:
                children = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:  # a node killed earlier
                continue
            for child in children:
                try:
                    if child.name() == "raylet" and f"--node_id={node_id}" in " ".join(child.cmdline()):
                        return child.pid
                except psutil.Error:
                    continue
        return None

    def leftovers(self) -> Dict[str, List[str]]:
        """The launcher's placement groups and actors still on the cluster (there should be none)."""
        found = self.query()
        return {"placement_groups": [n for n in found["placement_groups"] if n.startswith("launcher-")],
                "actors": [n for n in found["actors"] if n.startswith("launcher-")]}

    def stop(self) -> None:
        """SIGTERM each `ray start --block` (it stops its node), then kill whatever of theirs is left."""
        everything = []
        for proc in self.procs:
            try:
                everything += psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        _, alive = psutil.wait_procs(everything, timeout=10)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=10)
        for proc in self.procs:
            SESSION_PIDS.discard(proc.pid)
        shutil.rmtree(self.temp, ignore_errors=True)


SHARED: Dict[str, RayDevCluster] = {}  # the one cluster the Ray tests share, while they run one after another


def ray_cluster(tmp_path_factory: Any, nodes: int):
    """Generator body of a module-scoped fixture: the Ray tests' shared cluster with `nodes` nodes alive.

    One cluster serves every Ray test (a start costs ~18 CPU-s and ~20 s, and its idle nodes ~6 CPU-s a
    minute): a larger size grows it, a smaller one starts it afresh. It stops once the next test this
    process runs needs no Ray (stop_unless_next_needs_it, from tests/conftest.py), or at the session's end.
    """
    ray_or_skip()
    cluster = SHARED.get("cluster")
    if cluster is not None and cluster.count > nodes:
        stop_shared()
        cluster = None
    if cluster is None:
        cluster = RayDevCluster(tmp_path_factory.mktemp(f"ray{nodes}"), nodes).start()
        SHARED["cluster"] = cluster
    else:
        cluster.count = max(cluster.count, nodes)
        cluster.grow_to(nodes)  # a node an earlier test killed is replaced
    yield cluster


def stop_shared() -> None:
    cluster = SHARED.pop("cluster", None)
    if cluster is not None:
        cluster.stop()


def stop_unless_next_needs_it(nextitem: Any) -> None:
    """After a test: the shared cluster stops unless the next test on this process is a Ray test too (under
    pytest-xdist one worker runs the whole `ray` group in a row, tests/conftest.py)."""
    if "cluster" in SHARED and (nextitem is None or nextitem.get_closest_marker("ray") is None):
        stop_shared()


def ray_env(cluster: RayDevCluster) -> Dict[str, str]:
    return {"RAY_ADDRESS": cluster.address, "RAY_USAGE_STATS_ENABLED": "0"}


def kill_node(cluster: RayDevCluster, node_id: str) -> int:
    pid = cluster.raylet_pid(node_id)
    assert pid is not None, f"no raylet for Ray node {node_id} among the dev cluster's processes"
    os.kill(pid, signal.SIGKILL)
    cluster.killed.add(node_id)
    return pid
