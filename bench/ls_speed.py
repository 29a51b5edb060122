"""How long `ls` takes over many runs: N synthetic run directories with the files real runs leave
(config.yaml, plan.json, summary.json, a metrics.jsonl of M lines, a lock file, logs, goodput/,
checkpoints/), a mix of completed, failed, interrupted and dead runs, plus one sweep of 20.

    python bench/ls_speed.py [--runs 1000] [--metric-lines 2000] [--rounds 5]

Prints the median time of launcher.runindex.list_runs in-process, and of `python -m launcher ls`
(table and --json) end to end, against the 1 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.runindex import list_runs  # noqa: E402

CONFIG = """nodes: 1
gpus: 2
seed: 0
output_dir: {out}
run_id: {run_id}
model:
  name: mlp
  hidden: 128
  depth: 2
data:
  batch_size: 32
  dataset_size: 2048
trainer:
  strategy: ddp
  steps: {steps}
  lr: 0.001
  log_every: 5
  pipeline:
    stages: 0
rdzv:
  timeout_s: 60
checkpoint:
  every_steps: 0
script:
  path: null
  module: false
  args: []
cluster: local
"""


def metric_line(step: int) -> str:
    return json.dumps({"step": step, "epoch": 0, "loss": 2.3 - step * 1e-4, "samples_per_s": 1500.0 + step % 7,
                       "step_time_s": 0.021, "data_wait_s": 0.0005, "grad_norm": 0.66, "rss_bytes": 322228224,
                       "time_data_s": 0.0009, "time_forward_s": 0.0012, "time_backward_s": 0.0106,
                       "time_optimizer_s": 0.008, "time_comm_s": 0.0, "comm_share": 0.0, "rss_peak_mb": 307.3,
                       "cpu_percent": 100.0, "step_time_spread": 0.0, "slowest_rank": 0, "straggler_rank": None})


def make_run(run_dir: Path, index: int, metric_lines: int) -> None:
    kind = ("completed", "completed", "completed", "completed", "completed", "completed", "failed",
            "interrupted", "dead", "completed")[index % 10]
    steps = metric_lines * 5
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "locks").mkdir()
    (run_dir / "goodput").mkdir()
    (run_dir / "checkpoints" / f"step-{steps:08d}").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(CONFIG.format(out=run_dir.parent, run_id=run_dir.name, steps=steps))
    (run_dir / "plan.json").write_text(json.dumps({"run_id": run_dir.name, "run_dir": str(run_dir), "nodes": 1,
                                                   "workers_per_node": 2, "world_size": 2, "mode": "single"}, indent=2))
    (run_dir / "locks" / "node-0.lock").write_text(json.dumps({"host": "vm", "pid": 1, "job": "single", "run_id": run_dir.name}))
    done = metric_lines if kind in ("completed",) else metric_lines // 2
    (run_dir / "metrics.jsonl").write_text("".join(metric_line(5 * (i + 1)) + "\n" for i in range(done)))
    for rank in range(2):
        (run_dir / "logs" / f"rank-{rank}.log").write_text("step 5/100 loss 2.3 1500 samples/s\n" * 50)
    (run_dir / "goodput" / "1795462071710-attempt-0.json").write_text(json.dumps({"first_step_at": 1.0, "step": done * 5}))
    if kind == "dead":
        return  # started, never wrote how it ended
    summary: Dict[str, Any] = {"run_id": run_dir.name, "status": kind, "world_size": 2, "nodes": 1, "model": "mlp",
                               "steps": steps, "samples_per_s": 1500.0, "goodput": 0.8, "restarts": index % 3,
                               "badput_s": {"startup": 10.0}, "param_bytes_per_rank": [202792] * 2}
    if kind != "completed":
        summary["error"] = "rank 1 failed: ValueError: boom"
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))


def build(root: Path, runs: int, metric_lines: int) -> None:
    for i in range(runs - 20):
        make_run(root / f"20261123-{i:06d}", i, metric_lines)
    sweep = root / "sweep-bench"
    members = []
    for i in range(20):
        make_run(sweep / f"m{i:03d}", i, metric_lines)
        members.append({"index": i, "overrides": {"trainer.lr": str(0.001 * (i + 1))}, "run_dir": f"m{i:03d}",
                        "status": "completed"})
    (sweep / "sweep.json").write_text(json.dumps({"kind": "sweep", "sweep_id": "sweep-bench", "created": time.time(),
                                                  "cluster": "local", "keys": ["trainer.lr"], "base_args": [],
                                                  "members": members}))


def timed(fn: Any, rounds: int) -> Tuple[float, float]:
    """Median wall time and median CPU time (this process's plus its children's): on a shared, loaded
    machine the wall time includes waiting for a core; the CPU time is what ls itself costs."""
    walls, cpus = [], []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), cpu_seconds()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(cpu_seconds() - c0)
    return statistics.median(walls), statistics.median(cpus)


def cpu_seconds() -> float:
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--metric-lines", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with tempfile.TemporaryDirectory(prefix="ls-speed-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        build(root, args.runs, args.metric_lines)
        print(f"built {args.runs} run directories ({args.metric_lines} metric lines each) in {time.perf_counter() - t0:.1f}s")
        rows = list_runs(root)
        assert sum(1 + len(r.get("members", [])) for r in rows) == args.runs + 1, len(rows)
        in_process = timed(lambda: list_runs(root), args.rounds)
        table = timed(lambda: subprocess.run([sys.executable, "-m", "launcher", "ls", str(root)], env=env,
                                             stdout=subprocess.DEVNULL, check=True), args.rounds)
        as_json = timed(lambda: subprocess.run([sys.executable, "-m", "launcher", "ls", str(root), "--json"], env=env,
                                               stdout=subprocess.DEVNULL, check=True), args.rounds)
        bare = timed(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.rounds)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; medians of {args.rounds}, wall (cpu)")
    for name, (wall, cpu) in (("list_runs, in-process", in_process), ("`python -m launcher ls`", table),
                              ("`python -m launcher ls --json`", as_json), ("`python -c pass`", bare)):
        verdict = "" if name.startswith("`python -c") else f"; target < 1 s: {'met' if wall < 1 else 'MISSED'}"
        print(f"{name:32} {wall * 1000:6.0f} ms ({cpu * 1000:.0f} ms cpu){verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
