"""How the launcher's own cost grows with nodes: 2, 4, 8 and 16 simulated nodes with one small worker each.

    python bench/node_growth.py [--nodes 2 4 8 16] [--steps 200] [--loss] [--timeout 600] [--json FILE]

Each size runs bench/scripts/elastic_steps.py under `python -m launcher --nodes N --gpus 1` (simulated nodes: one
`launcher.backends.node` process a node, all on this machine, the coordinator holding the rendezvous store) and
measures, from outside:
- time to the first step: summary.json's time_to_first_step_s (from the command to rank 0's first step);
- the head's own CPU seconds and its peak RSS (the coordinator process alone, sampled every 0.1 s);
- the whole job's CPU seconds (the head with every process it reaped: nodes, agents, workers; wait4's rusage);
- the job's wall time.
With --loss, each size runs again elastic (`--nodes 1:N --max-restarts 1`): once rank 0 has stepped for 3 s,
one node's agent (the newest node process) is SIGKILLed, and the figure is the seconds from that kill to rank 0's
first step of the next attempt (the script writes each attempt's first-step time).
Not measured here: bytes mirrored (simulated nodes share the run directory, so nothing is shipped:
launcher.backends.mirror) and store operations per step (torch's TCPStore keeps no count).
On a 2-core machine every size shares the same 2 CPUs: the figures say what grows, not a cluster's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "scripts" / "elastic_steps.py"


def node_processes(head: psutil.Process) -> List[psutil.Process]:
    """The node agents: the head's own children (a node's forked workers carry the same command line)."""
    found = []
    for p in head.children():
        try:
            if "launcher.backends.node" in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            pass
    return sorted(found, key=lambda p: p.create_time())


def one_run(nodes: int, steps: int, loss: bool, timeout: float) -> Dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"node-growth-{nodes}-"))
    shape = ["--nodes", f"1:{nodes}", "--max-restarts", "1"] if loss else ["--nodes", str(nodes)]
    cmd = [sys.executable, "-m", "launcher", *shape, "--gpus", "1", f"output_dir={out / 'runs'}", "wandb.mode=disabled",
           "watchdog.timeout_s=0", str(SCRIPT), str(out), str(steps)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=out, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    head = psutil.Process(proc.pid)
    peak_rss, own_cpu, killed_at = 0, 0.0, None
    status = None
    while status is None:
        try:
            peak_rss = max(peak_rss, head.memory_info().rss)
            times = head.cpu_times()
            own_cpu = times.user + times.system
        except psutil.Error:
            pass
        first = out / "first-step-0"
        if loss and killed_at is None and first.exists() and time.time() - float(first.read_text() or "inf") > 3:
            victims = node_processes(head)
            if len(victims) > 1:
                os.kill(victims[-1].pid, signal.SIGKILL)
                killed_at = time.time()
        if time.monotonic() - started > timeout:
            os.killpg(proc.pid, signal.SIGKILL)
        pid, status_word, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            status = os.waitstatus_to_exitcode(status_word)
        else:
            time.sleep(0.1)
    wall = time.monotonic() - started
    stderr = proc.stderr.read() if proc.stderr else ""
    runs = [p for p in (out / "runs").iterdir() if not p.name.startswith(".")] if (out / "runs").exists() else []
    summary = json.loads((runs[0] / "summary.json").read_text()) if runs and (runs[0] / "summary.json").exists() else {}
    row: Dict[str, Any] = {"nodes": nodes, "loss": loss, "exit": status, "status": summary.get("status"),
                           "wall_s": round(wall, 2), "first_step_s": summary.get("time_to_first_step_s"),
                           "head_cpu_s": round(own_cpu, 2), "head_peak_rss_mb": round(peak_rss / 2**20, 1),
                           "job_cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}
    if loss:
        after = out / "first-step-1"
        row["killed"] = killed_at is not None
        row["loss_to_next_step_s"] = (round(float(after.read_text()) - killed_at, 2)
                                      if killed_at is not None and after.exists() else None)
        row["world_size_after"] = summary.get("world_size")
    if status != 0:
        row["stderr_tail"] = stderr[-600:]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--steps", type=int, default=200, help="steps of each run (of the first attempt with --loss)")
    parser.add_argument("--loss", action="store_true", help="also time a lost node's re-forming at each size")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows: List[Dict[str, Any]] = []
    load_before = os.getloadavg()
    for nodes in args.nodes:
        for loss in ([False, True] if args.loss else [False]):
            rows.append(one_run(nodes, args.steps if not loss else 100000, loss, args.timeout))
            print(json.dumps(rows[-1]), flush=True)
    base: Optional[Dict[str, Any]] = next((r for r in rows if not r["loss"] and r["exit"] == 0), None)
    print(f"{'nodes':>5} {'first step':>10} {'head CPU':>9} {'head RSS':>9} {'job CPU':>8} {'wall':>7}"
          + ("  loss -> next step" if args.loss else ""))
    for nodes in args.nodes:
        plain = next(r for r in rows if r["nodes"] == nodes and not r["loss"])
        lost = next((r for r in rows if r["nodes"] == nodes and r["loss"]), None)
        ratio = (f" ({plain['head_cpu_s'] / base['head_cpu_s']:.1f}x)"
                 if base and base["head_cpu_s"] and plain["exit"] == 0 else "")
        print(f"{nodes:>5} {plain['first_step_s'] or float('nan'):>9.1f}s {plain['head_cpu_s']:>8.1f}s{ratio}"
              f" {plain['head_peak_rss_mb']:>7.0f}MB {plain['job_cpu_s']:>7.0f}s {plain['wall_s']:>6.1f}s"
              + (f"  {lost['loss_to_next_step_s']}s (world {lost['world_size_after']})" if lost else ""))
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "load_before": load_before,
              "load_after": os.getloadavg(), "runs": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
