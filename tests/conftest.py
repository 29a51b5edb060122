"""Suite-wide rules: fast tests first, and no test may leave a process behind."""

from __future__ import annotations

import ctypes
import os
import resource
import sys
import time
from typing import Optional

import psutil
import pytest

# The suite runs more processes than the machine has cores (pytest-xdist workers, each starting jobs), and OpenMP's
# default waiting spins: a worker's threads burned their time slices at every parallel region's barrier while the
# thread they waited for was not scheduled (a sweep of 3 quick members took 279 CPU-s and 413 s; passive, 73 and 78).
# Passive waiting changes no result and is inherited by every process a test starts, torchrun included.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PR_SET_CHILD_SUBREAPER = 36
# Order of the layers: pure units first, then the shared clusters' groups (long, mostly waiting: under
# pytest-xdist they start early, each on a worker of its own, beside the rest), then network namespaces,
# then the other real multi-process runs. Under pytest-xdist GROUP_WALL_S orders the groups after the units.
LAYERS = ("slurm", "ray", "netns", "slow")


def pytest_configure(config: pytest.Config) -> None:
    # Orphans (a worker whose launcher died) re-parent to this process instead of init, so the
    # check below sees them too.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").prctl(PR_SET_CHILD_SUBREAPER, 1)
        except OSError:
            pass


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
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
        return min((i + 1 for i, name in enumerate(LAYERS) if name in marks), default=0)  # its first layer

    # Pure units first; then the groups that start processes, longest first (GROUP_WALL_S); within a group file by
    # file, each file's tests in pytest's own order: a group of several files (a cluster's) then runs each file's
    # module-scoped jobs once, not again after another file's test came between.
    position = {id(item): i for i, item in enumerate(items)}
    groups = {id(item): xdist_group(item) for item in items}
    layers = {id(item): layer(item) for item in items}
    items.sort(key=lambda item: (layers[id(item)] > 0, -GROUP_WALL_S.get(groups[id(item)], 0), layers[id(item)],
                                 groups[id(item)], str(item.path), position[id(item)]))
    for item in items:
        item.add_marker(pytest.mark.xdist_group(groups[id(item)]))


# Wall seconds each group took beside the others in a fresh-clone run (4 xdist workers, LAUNCHER_TEST_CPU, 2026-11-27).
# tests/run.sh keeps this order (--no-loadscope-reorder; xdist's own reorder is by test count): longest first, so
# no long group starts last and runs on alone while the other workers idle (the exit stress did, for ~40 s).
# A group missing here runs after these, in layer order; the figures only order the run, a stale one only slows it.
GROUP_WALL_S = {
    "slurm": 600, "ray": 480, "test_object_store.py": 220, "test_features_runs.py": 250,
    "test_torchrun_fidelity.py": 190, "test_strategies.py": 160, "test_restarts.py": 100, "test_metrics_runs.py": 120,
    "test_hangs.py": 110, "test_elastic.py": 110, "test_board.py": 110, "test_script_metrics.py": 100,
    "test_ls.py": 90, "test_user_modules.py": 90, "test_symlinks.py": 80, "test_exact_resume.py": 80,
    "test_scale_scripts.py": 80, "test_fork.py": 80, "test_multinode_failfast.py": 80, "test_multinode.py": 70,
    "test_rdzv_signing.py": 70, "test_bad_input.py": 70, "netns": 70, "test_torchrun_flags.py": 70, "test_lint.py": 70,
    "test_early_interrupt.py": 60, "test_randomness.py": 60, "test_sweep.py": 60, "test_command_stress.py": 50,
    "test_checkpoint.py": 50, "test_backend_contract.py:simulated": 50, "test_signals.py": 50,
    "test_run_ownership.py": 50, "test_backend_contract.py:two-agents": 50, "test_python_api.py": 50,
    "test_watchdog.py": 40, "test_prestart.py": 40, "test_ctrl_c.py": 40, "test_store_tamper.py": 40,
    "test_run_local.py": 40, "test_exit_stress.py": 30, "test_backend_contract.py:local": 30,
    "test_failed_runs.py": 30, "test_cli_bad_input.py": 30, "test_script_mode.py": 30, "test_board_token.py": 30,
    "test_doctor.py": 30, "test_root_cause.py": 40, "test_logged_series.py": 40, "test_stragglers.py": 150,
    "test_spares.py": 150,
    "test_torchrun_lines.py": 100, "test_torch_private.py": 30,
}


# Under pytest-xdist (tests/run.sh: `-n N --dist loadgroup`) one worker runs a whole group, in order.
SHARED = ("slurm", "ray", "netns")  # one dev cluster, Ray clusters on one machine, one set of namespaces


def xdist_group(item: pytest.Item) -> str:
    """The group a test runs in: its shared resource's, else its file's (module-scoped runs are made once).

    A file may split its groups further by a parameter (SPLIT_XDIST_BY = "backend" in
    tests/test_backend_contract.py: each backend's shared jobs are made once, on one worker).
    """
    marks = {m.name for m in item.iter_markers()}
    for shared in SHARED:
        if shared in marks:
            return shared
    split = getattr(getattr(item, "module", None), "SPLIT_XDIST_BY", None)
    callspec = getattr(item, "callspec", None)
    if split and callspec is not None and split in callspec.params:
        return f"{item.path.name}:{callspec.params[split]}"  # no "]": xdist takes "...]@name" for no group
    return item.path.name


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    from tests.ray_cluster import stop_unless_next_needs_it

    stop_unless_next_needs_it(nextitem)  # the Ray tests' shared cluster, once the Ray tests are done here


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.board_helpers import close_browser
    from tests.ray_cluster import stop_shared

    stop_shared()
    close_browser()


@pytest.fixture(autouse=True)
def no_leftover_processes():
    from tests.helpers import serves_the_session

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


# CPU seconds each test's processes used (pytest's own and every child it waited for, workers included through
# the launcher that waited for them): on 2 cores the suite's length is bounded by its CPU time, not by how many
# tests run at once, so this is the figure to cut (`LAUNCHER_TEST_CPU=FILE` appends "cpu_s wall_s end_time xdist_worker
# nodeid" lines: the end time and worker draw the run's timeline, where the cores idled).
CPU_LOG = os.environ.get("LAUNCHER_TEST_CPU")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object):
    if not CPU_LOG:
        yield
        return
    before, started = _cpu_seconds(), time.monotonic()
    yield
    with open(CPU_LOG, "a", encoding="utf-8") as f:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        f.write(f"{_cpu_seconds() - before:.1f} {time.monotonic() - started:.1f} {time.time():.1f} {worker} {item.nodeid}\n")


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
