"""From a lost node to the job's next step: the launcher with a hot spare, without one, and torchrun the same ways.

    python bench/spare_recovery.py [--rounds 20] [--case ours-spare ...] [--timeout 180] [--json FILE]

Each round runs every case once, in turn, on 2 nodes of one worker each (bench/scripts/first_steps.py: a small DDP
job), and when the ranks have stepped for 3 s SIGKILLs one node that runs a rank, with everything it started (its
machine is gone). The figure is the seconds from the kill to the first step of a rank started after it (the job
re-formed and stepped again); then the job is stopped. The cases:
- ours-spare: `python -m launcher --nodes 2 --spares 1` (simulated nodes: the launcher holds the store, any node may
  be lost; the spare takes the lost node's place: world size 2 after);
- ours-elastic: `python -m launcher --nodes 1:2` (no spare: the job shrinks to 1 node);
- ours-elastic-3: `python -m launcher --nodes 2:3` (3 nodes, no spare: it shrinks to 2);
- torchrun-spare: three `torchrun --nnodes 2:2` agents on loopback, c10d (torch keeps the third in its redundancy list);
- torchrun-elastic: two `torchrun --nnodes 1:2` agents.
torchrun's store lives in the agent that started first, so the node lost there is never that one. Both run torch's
c10d rendezvous. The launcher sets keep-alives of 1 s x 3 (torch's default: 5 s x 3) where no second job could form
(2 x MIN > MAX + spares: ours-spare, ours-elastic-3; ours-elastic keeps torch's), and a round after the first waits
2 s for more nodes, not last_call_timeout (30 s); torchrun runs with torch's defaults, as a user gets them.
Prints the median and worst of each case and each against torchrun's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import psutil

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "scripts" / "first_steps.py"
CASES = ("ours-spare", "ours-elastic", "ours-elastic-3", "torchrun-spare", "torchrun-elastic")
SHAPES = {"ours-spare": ["--nodes", "2", "--spares", "1"], "ours-elastic": ["--nodes", "1:2"],
          "ours-elastic-3": ["--nodes", "2:3"]}
RANKS = {"ours-elastic-3": 3}  # the ranks that step before the loss (2 elsewhere)
STEP_FOR_S = 3.0  # the ranks step this long before the loss


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(case: str, out: Path) -> List[subprocess.Popen]:
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    script = [str(SCRIPT), str(out)]
    if case.startswith("ours"):
        cmd = [sys.executable, "-m", "launcher", *SHAPES[case], "--gpus", "1", "--max-restarts", "3",
               f"output_dir={out / 'runs'}", "watchdog.timeout_s=0", *script]
        return [subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)]
    nnodes, agents = ("2:2", 3) if case == "torchrun-spare" else ("1:2", 2)
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=bench-{port}", "--max-restarts=3",
           *script]
    procs = []
    for _ in range(agents):
        log = open(out / f"agent-{len(procs)}.log", "w")
        procs.append(subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        time.sleep(1.0)  # the first binds the store
    return procs


def first_steps(out: Path) -> Dict[int, float]:
    """{pid: the unix time of its first step} of every rank so far."""
    found = {}
    for path in out.glob("first-*"):
        try:
            found[int(path.name.split("-", 1)[1])] = float(path.read_text())
        except (ValueError, OSError):
            pass
    return found


def victim(case: str, procs: List[subprocess.Popen], ranks: Dict[int, float]) -> Optional[psutil.Process]:
    """A node that runs a rank (not a waiting spare), and for torchrun not the agent that holds the store."""
    if case.startswith("ours"):
        agents = [p for p in psutil.Process(procs[0].pid).children()
                  if "launcher.backends.node" in " ".join(p.cmdline())]
    else:
        agents = [psutil.Process(p.pid) for p in procs[1:]]
    for agent in agents:
        if {c.pid for c in agent.children(recursive=True)} & set(ranks):
            return agent
    return None


def lose(node: psutil.Process) -> None:
    """The machine is gone: the agent and everything it started, at once."""
    family = [node, *node.children(recursive=True)]
    for p in family:
        try:
            p.kill()
        except psutil.Error:
            pass


def stop(procs: List[subprocess.Popen]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def one(case: str, timeout: float) -> Dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"spare-recovery-{case}-"))
    procs = start(case, out)
    deadline, row = time.monotonic() + timeout, {"case": case, "loss_to_next_step_s": None}
    try:
        killed_at, before = None, {}
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            ranks = first_steps(out)
            if killed_at is None and len(ranks) >= RANKS.get(case, 2) and time.time() - max(ranks.values()) > STEP_FOR_S:
                node = victim(case, procs, ranks)
                if node is not None:
                    before, killed_at = dict(ranks), time.time()
                    lose(node)
            elif killed_at is not None:
                after = [t for pid, t in ranks.items() if pid not in before]
                if after:
                    row["loss_to_next_step_s"] = round(min(after) - killed_at, 2)
                    return row
            time.sleep(0.05)
        row["error"] = "no loss" if killed_at is None else "no step after the loss"
        return row
    finally:
        stop(procs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--case", action="append", choices=CASES, help="these cases only (default: all)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds a case may take")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cases = args.case or list(CASES)
    rows: List[Dict[str, Any]] = []
    load_before = os.getloadavg()
    for _ in range(args.rounds):
        for case in cases:
            rows.append(one(case, args.timeout))
            print(json.dumps(rows[-1]), flush=True)
    figures: Dict[str, Dict[str, Any]] = {}
    for case in cases:
        times = [r["loss_to_next_step_s"] for r in rows if r["case"] == case and r["loss_to_next_step_s"] is not None]
        figures[case] = {"median_s": statistics.median(times) if times else None, "worst_s": max(times, default=None),
                         "recovered": len(times), "of": sum(r["case"] == case for r in rows)}
    print(f"{'case':<18} {'median':>8} {'worst':>8} {'recovered':>10}  vs torchrun (median)")
    for case in cases:
        f = figures[case]
        theirs = figures.get(case.replace("ours", "torchrun"), {}).get("median_s") if case.startswith("ours") else None
        ratio = f"{f['median_s'] / theirs:.2f}x" if f["median_s"] and theirs else ""
        median = f"{f['median_s']:.1f}s" if f["median_s"] is not None else "-"
        worst = f"{f['worst_s']:.1f}s" if f["worst_s"] is not None else "-"
        print(f"{case:<18} {median:>8} {worst:>8} {f['recovered']:>5}/{f['of']:<4}  {ratio}")
    result = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "load_before": load_before,
              "load_after": os.getloadavg(), "figures": figures, "runs": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(f["recovered"] == f["of"] for f in figures.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
