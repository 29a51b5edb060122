"""Suite-wide rules: fast tests first, and no test may leave a process behind."""

from __future__ import annotations

import ctypes
import sys

import psutil
import pytest

PR_SET_CHILD_SUBREAPER = 36
# Order of the layers: pure units, then real multi-process runs, then network namespaces, then SLURM.
LAYERS = ("slow", "netns", "slurm", "ray")


def pytest_configure(config: pytest.Config) -> None:
    # Orphans (a worker whose launcher died) re-parent to this process instead of init, so the
    # check below sees them too.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(PR_SET_CHILD_SUBREAPER, 1)
        except OSError:
            pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def starts_processes(item: pytest.Item) -> bool:
        source = getattr(getattr(item, "module", None), "__file__", None)
        if not source:
            return False
        with open(source, encoding="utf-8") as f:
            text = f.read()
        return any(word in text for word in ("run_launcher", "start_launcher", "subprocess"))

    def layer(item: pytest.Item) -> int:
        marks = {m.name for m in item.iter_markers()}
        if "slow" not in marks and starts_processes(item):
            marks.add("slow")
        return max((i + 1 for i, name in enumerate(LAYERS) if name in marks), default=0)

    items.sort(key=layer)  # stable: file order within a layer


@pytest.fixture(autouse=True)
def no_leftover_processes():
    yield
    me = psutil.Process()
    children = [p for p in me.children(recursive=True) if not serves_the_session(p)]
    _, running = psutil.wait_procs(children, timeout=5)  # give exiting processes a moment
    leftovers = [p for p in running if _alive(p)]
    names = [f"{p.pid} {_cmd(p)}" for p in leftovers]
    for p in leftovers:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=5)
    # reap zombies re-parented to us
    for p in me.children():
        try:
            p.wait(timeout=0)
        except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
            pass
    assert not names, f"the test left processes running: {names}"


def serves_the_session(p: psutil.Process) -> bool:
    """A process of a cluster a fixture started for several tests (tests/ray_cluster.py), or one of its children."""
    from tests.helpers import SESSION_PIDS

    try:
        return bool(SESSION_PIDS) and any(q.pid in SESSION_PIDS for q in [p, *p.parents()])
    except psutil.Error:
        return False


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:120]
    except psutil.Error:
        return "?"
