"""The actor in each bundle: it starts this project's node agent (launcher.backends.ray.task) on its Ray node.

The agent runs as a child process, not inside the actor: Ray's worker process holds gRPC threads,
and the agent forks its warm workers. The child dies with the actor (PR_SET_PDEATHSIG), so a
killed actor or a dead Ray node takes the agent and its workers with it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any, Dict, Tuple

from launcher.backends.children import zygote_module_command
from launcher.runtime import env, safefs


class NodeRunner:
    """One node of the job. Threaded (max_concurrency=2): stop() is answered while run() waits."""

    def __init__(self) -> None:
        self.proc: "subprocess.Popen[bytes] | None" = None

    def address(self) -> Tuple[str, int]:
        """This node's IP (as Ray knows it) and a port free on it now: the job's rendezvous, on node 0."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            return ip, int(s.getsockname()[1])

    def run(self, payload: Dict[str, Any], secret: str, log_path: str, cwd: str) -> int:
        """Run this node's agent to its end; its exit code. The secret reaches it through its environment only."""
        child_env = dict(os.environ)
        child_env[env.RDZV_SECRET] = secret
        for name in ("RAY_ADDRESS", "RAY_JOB_ID"):  # the agent is a plain process, not a Ray driver
            child_env.pop(name, None)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        import json

        with safefs.open_file(log_path, "ab", root=str(Path(log_path).parents[1])) as log:  # <run_dir>/logs/...: no link, no FIFO
            kind = payload.get("workers")  # the driver's (launcher.backends.children.workers_kind)
            self.proc = subprocess.Popen(zygote_module_command("launcher.backends.ray.task", kind, str(os.getpid())),
                                         stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                         cwd=cwd if os.path.isdir(cwd) else None, start_new_session=True)
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(payload).encode())
            self.proc.stdin.close()
            return self.proc.wait()

    def stop(self, signum: int = int(signal.SIGTERM)) -> bool:
        """Signal the agent and its workers, as Ctrl-C in a terminal does (they stop and record how the job ended);
        False if it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, signum)  # its own session: the agent, its zygote and its workers
        except ProcessLookupError:
            return False
        return True


def remote_class(ray: Any) -> Any:
    return ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)(NodeRunner)
