"""The Ray path's cost: the same job (2 nodes x 1 worker, a plain torchrun-style DDP script) run as
`--cluster ray --wait` on a real two-node Ray cluster started here, and as a local simulated
`--nodes 2 --gpus 1` run; rounds alternate. Prints medians of submit-to-first-step and wall time,
and the ratios ray/local.

    python bench/ray_overhead.py [--rounds N]

Both clocks start just before the command is executed; the first step is the script's own
FIRST_STEP_AT (rank 0, after its first optimizer step). The Ray cluster's own start is not counted
(a cluster is up before jobs are submitted to it); it is printed separately.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.ray_cluster import RayDevCluster  # noqa: E402  (the tests' dev cluster: one way to start Ray here)

SCRIPT = REPO / "bench" / "scripts" / "ddp_mlp.py"
STEPS = 20


def one_run(kind: str, address: str) -> Tuple[float, float]:
    """(seconds to rank 0's first step, wall seconds) of one launch."""
    with tempfile.TemporaryDirectory() as out:
        head = [sys.executable, "-m", "launcher", "--nodes", "2", "--gpus", "1", f"output_dir={out}"]
        if kind == "ray":
            head += ["--cluster", "ray", "--wait", f"ray.address={address}"]
        env = dict(os.environ, PYTHONPATH=str(REPO), WANDB_MODE="disabled", BENCH_STEPS=str(STEPS),
                   RAY_USAGE_STATS_ENABLED="0")
        t0 = time.time()
        proc = subprocess.run(head + [str(SCRIPT)], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
        wall = time.time() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} run failed:\n{proc.stderr[-3000:]}")
        logs = "".join(p.read_text(errors="replace") for p in Path(out).glob("*/logs/rank-0.log"))
        first = re.search(r"FIRST_STEP_AT=([\d.]+)", proc.stdout + logs)
        assert first is not None, "rank 0 printed no FIRST_STEP_AT"
        return float(first.group(1)) - t0, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    started = time.time()
    cluster = RayDevCluster(Path(tempfile.mkdtemp(prefix="raybench")), 2)
    cluster.start()
    up = time.time() - started
    samples: Dict[str, Dict[str, List[float]]] = {k: {"first": [], "wall": []} for k in ("ray", "local")}
    try:
        for r in range(args.rounds):
            for kind in (("ray", "local") if r % 2 == 0 else ("local", "ray")):
                first, wall = one_run(kind, cluster.address)
                samples[kind]["first"].append(first)
                samples[kind]["wall"].append(wall)
                print(f"round {r}: {kind:<5} first step {first:6.2f}s  wall {wall:6.2f}s", flush=True)
    finally:
        cluster.stop()
    med = {k: {m: statistics.median(v) for m, v in s.items()} for k, s in samples.items()}
    result = {"ray_cluster_start_s": up, "rounds": args.rounds,
              "ray_first_step_s": med["ray"]["first"], "local_first_step_s": med["local"]["first"],
              "ratio_first_step": med["ray"]["first"] / med["local"]["first"],
              "ray_wall_s": med["ray"]["wall"], "local_wall_s": med["local"]["wall"],
              "ratio_wall": med["ray"]["wall"] / med["local"]["wall"]}
    print(f"Ray dev cluster (2 nodes) up in {up:.1f}s (not counted below)")
    print(f"{'':<8}{'first step':>12}{'wall':>10}")
    for k in ("ray", "local"):
        print(f"{k:<8}{med[k]['first']:>11.2f}s{med[k]['wall']:>9.2f}s")
    print(f"{'ratio':<8}{result['ratio_first_step']:>12.2f}{result['ratio_wall']:>10.2f}   (ray / local, medians of {args.rounds})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
