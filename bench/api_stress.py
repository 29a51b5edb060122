"""Python API stress: launcher.launch called many times in a row from ONE interpreter, as a notebook does
cell after cell, counting the launches that fail, hang or leave something behind.

    python bench/api_stress.py [--launches 50] [--gpus 2] [--load] [--timeout 120] [--json FILE]

Each launch runs a small DDP function (a few steps of a Linear model, then an all_reduce of the rank) on
--gpus workers and checks its return values (rank order, the sum every rank saw). After each launch: the
interpreter's child processes (none may remain), its open file descriptors and threads (must not grow
launch after launch: a leak there ends a long notebook session). --load runs one busy-loop CPU burner per
core alongside (started and killed here). A launch that has not returned in --timeout s counts as a hang
and ends the benchmark (its process group is the job's; the launcher's own cleanup is what is under test).
Prints one line per launch and a summary; --json writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, List

import psutil


def train(steps: int) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # torchrun's environment is there; the function sets up its group, as a script does
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    seen = {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": total.item()}
    dist.destroy_process_group()
    return seen


def burners(on: bool) -> List[subprocess.Popen]:
    if not on:
        return []
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(os.cpu_count() or 1)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=50)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--load", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import launcher

    me = psutil.Process()
    out = tempfile.mkdtemp(prefix="api-stress-")
    load = burners(args.load)
    burning = {p.pid for p in load}
    rows: List[Dict[str, Any]] = []
    try:
        for i in range(args.launches):
            done: Dict[str, Any] = {}

            def one(done: Dict[str, Any]) -> None:
                try:
                    done["result"] = launcher.launch(train, 3, gpus=args.gpus, output_dir=out, wandb_mode="disabled")
                except BaseException as e:  # noqa: BLE001 -- counted, not raised: the loop goes on
                    done["error"] = repr(e)[:300]

            started = time.monotonic()
            thread = threading.Thread(target=one, args=(done,), daemon=True)
            thread.start()
            thread.join(args.timeout)
            wall = time.monotonic() - started
            expected = [{"rank": r, "world": args.gpus, "sum": float(sum(range(args.gpus)))} for r in range(args.gpus)]
            row = {"launch": i, "wall_s": round(wall, 2), "hung": thread.is_alive(),
                   "ok": done.get("result") == expected, "error": done.get("error"),
                   "children": len([c for c in me.children(recursive=True) if c.pid not in burning]),  # not --load's
                   "fds": me.num_fds(), "threads": me.num_threads()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if row["hung"]:
                break
    finally:
        for p in load:
            p.kill()
            p.wait()
    finished = [r["wall_s"] for r in rows if not r["hung"]]
    summary = {"launches": len(rows), "ok": sum(r["ok"] for r in rows), "hangs": sum(r["hung"] for r in rows),
               "failures": sum(not r["ok"] and not r["hung"] for r in rows),
               "with_children_left": sum(r["children"] > 0 for r in rows),
               "fds_first_last": [rows[0]["fds"], rows[-1]["fds"]] if rows else None,
               "threads_first_last": [rows[0]["threads"], rows[-1]["threads"]] if rows else None,
               "median_s": round(statistics.median(finished), 2) if finished else None,
               "max_s": max(finished) if finished else None, "gpus": args.gpus, "load": args.load}
    print("summary:", json.dumps(summary), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": summary, "launches": rows}, f, indent=1)
    return 0 if summary["ok"] == summary["launches"] else 1


if __name__ == "__main__":
    sys.exit(main())
