"""Each node's machine, while its job runs: one line of nodes/system-<node>.jsonl FIRST_S in, then about every INTERVAL_S (its CPU,
memory and load, and what the node's worker processes use), written by every node's launcher and read by the job's
W&B run (launcher.runtime.wandb_logger), so its system charts cover every node, not only rank 0's. A node's file
reaches the head with its other records (launcher.backends.mirror_files)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.runtime import safefs
from launcher.runtime.schema import SYSTEM

INTERVAL_S = 5.0
FIRST_S = 1.0  # the first line this soon: a node that ends before the head reads its file had none to read
FOLDER = "nodes"
MAX_LINE = 4096


def system_file(run_dir: str, node: int) -> str:
    return os.path.join(run_dir, FOLDER, f"system-{node}.jsonl")


class SystemSampler:
    """A thread of a node's launcher: start(), then stop() when the job ends. Never raises into the job."""

    def __init__(self, run_dir: str, node: int, workers: Any) -> None:
        """workers(): the pids of this node's worker processes now."""
        self.run_dir, self.node, self.workers = run_dir, node, workers
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self._run, name="launcher-system", daemon=True)
        self.processes: Dict[int, Any] = {}

    def start(self) -> "SystemSampler":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(timeout=5.0)

    def _run(self) -> None:
        import psutil

        psutil.cpu_percent()  # the first reading of a window starts it
        try:
            fd = safefs.open_fd(system_file(self.run_dir, self.node), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                root=self.run_dir)
        except OSError:
            return
        try:
            stopping, wait_s = False, FIRST_S
            while not stopping:  # one more as the job ends: a job shorter than INTERVAL_S has its figures too
                stopping, wait_s = self.halt.wait(wait_s), INTERVAL_S
                os.write(fd, (json.dumps(self.sample(psutil)) + "\n").encode())
        except OSError:
            pass  # a full disk or a vanished run directory: no more figures, the job goes on
        finally:
            os.close(fd)

    def sample(self, psutil: Any) -> Dict[str, Any]:
        line: Dict[str, Any] = {"node": self.node, "t": time.time(), "cpu_percent": psutil.cpu_percent(),
                                "memory_percent": psutil.virtual_memory().percent, "load1": os.getloadavg()[0]}
        cpu, rss = 0.0, 0.0
        for pid in self.workers():
            try:
                proc = self.processes.get(pid) or self.processes.setdefault(pid, psutil.Process(pid))
                cpu += proc.cpu_percent()
                rss += proc.memory_info().rss / 2**20
            except (psutil.Error, OSError):
                self.processes.pop(pid, None)
        line.update(workers_cpu_percent=cpu, workers_rss_mb=rss)
        return line


class SystemFiles:
    """Every node's nodes/system-<node>.jsonl, read as they grow: each line checked (SYSTEM) before it counts."""

    def __init__(self, run_dir: str) -> None:
        self.folder = Path(run_dir) / FOLDER
        self.offsets: Dict[str, int] = {}

    def new_lines(self) -> List[Dict[str, Any]]:
        found: List[Dict[str, Any]] = []
        try:
            if self.folder.is_symlink() or not self.folder.is_dir():
                return found
            paths = sorted(p for p in self.folder.iterdir() if p.name.startswith("system-") and p.suffix == ".jsonl")
        except OSError:
            return found
        for path in paths:
            found += self._read(path)
        return found

    def _read(self, path: Path) -> List[Dict[str, Any]]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return []
        try:
            os.lseek(fd, self.offsets.get(path.name, 0), os.SEEK_SET)
            data = os.read(fd, 1 << 20)
        except OSError:
            return []
        finally:
            os.close(fd)
        whole = data[:data.rfind(b"\n") + 1]
        self.offsets[path.name] = self.offsets.get(path.name, 0) + len(whole)
        out = []
        for line in whole.splitlines():
            if len(line) <= MAX_LINE:
                record: Optional[Dict[str, Any]] = None
                try:
                    record = SYSTEM.check(json.loads(line))
                except (ValueError, RecursionError):
                    pass
                if record is not None:
                    out.append(record)
        return out


def as_history(line: Dict[str, Any]) -> Dict[str, Any]:
    """A line as the W&B run charts it: system/node<k>/<figure>."""
    return {f"system/node{line['node']}/{k}": v for k, v in line.items() if k not in ("node", "t")}
