"""One `--cluster ray` launch of the built-in trainer, checked end to end: the suite repeats it a few times
(tests/test_ray.py), bench/ray_stress.py fifty.

A `--wait` launch must exit 0 with summary status completed; a cancelled one is submitted, followed
until it trains, stopped with `python -m launcher cancel` and must end interrupted (from its step 10 on, rank 0
sleeps a second a step, the fault injector's slow rank: it waits for the cancel without burning the CPU). Either way the
cluster must hold none of the launcher's placement groups or actors afterwards, and no process of
ours may still name the run directory. A launch not done within the timeout is a hang: its process
group is killed and the launch fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import psutil

from tests.helpers import QUICK, Stamped, command_line, launcher_env, log_line_times
from tests.ray_cluster import RayDevCluster, ray_env

NOTHING_LEFT = {"placement_groups": [], "actors": []}
SLOW_FROM_10 = {"LAUNCHER_INJECT_FAULT": "rank=0,step=10,action=slow"}  # reaches the Ray nodes (docs/ray.md)


def _launcher(args: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=cwd, env=launcher_env(env), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, -9, out, err + f"\n[ray launch] not done in {timeout:g}s: a hang")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _stamped_launcher(args: List[str], cwd: Path, env: Dict[str, str], timeout: float) -> Tuple[subprocess.CompletedProcess, List]:
    """_launcher's, with every output line's arrival time (tests.helpers.Stamped)."""
    run = Stamped([sys.executable, "-m", "launcher", *args], cwd, env)
    try:
        code = run.finish(timeout)
    except AssertionError as e:
        return subprocess.CompletedProcess(run.proc.args, -9, run.text("out"), run.text("err") +
                                           f"\n[ray launch] not done in {timeout:g}s: a hang ({e})"), run.lines
    return subprocess.CompletedProcess(run.proc.args, code, run.text("out"), run.text("err")), run.lines


def _processes_naming(run_dir: Path) -> List[int]:
    return [p.pid for p in psutil.process_iter() if str(run_dir) in command_line(p)]


def _status(run_dir: Path) -> str:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status", "?")
    except (OSError, ValueError):
        return "no summary"


def _until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.5)


def launch_once(k: int, cancel: bool, root: Path, cluster: RayDevCluster, timeout: float = 240) -> Dict[str, Any]:
    """Launch k (2 nodes x 1 worker) under root/<k>; {launch, kind, ok, code, status, wall_s, hang,
    processes_left, cluster_left, tail (the output, where it failed)}."""
    runs = root / f"{k:03d}"
    runs.mkdir()
    code = root / f"{k:03d}-code"  # the submitting folder Ray ships: not the output folder (that is refused)
    code.mkdir()
    env = ray_env(cluster)
    args = ["--cluster", "ray", "--nodes", "2", "--gpus", "1", f"output_dir={runs}", *QUICK, "wandb.mode=disabled"]
    started = time.monotonic()
    late: List[float] = []
    if not cancel:
        done, stamped = _stamped_launcher([*args, "--wait", "trainer.steps=60"], code, env, timeout)
        run_dir = next(runs.glob("2*"), runs)
        ok = done.returncode == 0 and _status(run_dir) == "completed"
        if ok:  # each of rank 0's lines --wait printed: how long after the node's launcher got it (its log's times)
            arrived = log_line_times(run_dir / "logs" / "rank-0.log")
            late = [at - arrived[text] for at, stream, text in stamped if stream == "out" and text in arrived]
    else:
        done = _launcher([*args, "trainer.steps=1000000"], code, {**env, **SLOW_FROM_10}, timeout)
        run_dir = next(runs.glob("2*"), runs)
        rank0 = run_dir / "logs" / "rank-0.log"
        _until(lambda: rank0.is_file() and "step " in rank0.read_text(errors="replace"), timeout)
        stop = _launcher(["cancel", str(run_dir)], code, env, timeout)
        _until(lambda: _status(run_dir) == "interrupted", 60)
        ok = done.returncode == 0 and stop.returncode == 0 and _status(run_dir) == "interrupted"
        done = subprocess.CompletedProcess(done.args, stop.returncode, done.stdout + stop.stdout, done.stderr + stop.stderr)
    result = {"launch": k, "kind": "cancel" if cancel else "wait", "code": done.returncode, "status": _status(run_dir),
              "late_s": late,
              "wall_s": round(time.monotonic() - started, 2), "hang": done.returncode == -9,
              "processes_left": _processes_naming(run_dir), "cluster_left": cluster.leftovers()}
    result["ok"] = ok and result["cluster_left"] == NOTHING_LEFT and not result["processes_left"]
    result["tail"] = "" if result["ok"] else (done.stdout + done.stderr)[-1500:]
    return result


def line(r: Dict[str, Any]) -> str:
    return (f"{r['launch']:3d} {r['kind']:6s} {'ok' if r['ok'] else 'FAILED'} exit {r['code']} {r['status']} "
            f"{r['wall_s']}s left: {r['cluster_left']} {r['processes_left']}")
