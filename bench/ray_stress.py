"""Ray launches in a row on a real two-node Ray cluster: every one ends, and leaves nothing on the cluster.

    python bench/ray_stress.py [--launches 50] [--cancel-every 5] [--timeout 240] [--json PATH]

Starts a two-node Ray cluster on this machine (tests/ray_cluster.py: `ray start` processes, stopped at
the end), then launches the built-in trainer (a small model, 2 nodes x 1 worker) --launches times:
most with `--wait`, every --cancel-every-th one submitted then cancelled, each checked as
tests/ray_launches.py says (the suite runs the same check a few times in tests/test_ray.py). Prints
a line per launch and a total; a hang is a launch not done within --timeout s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.ray_cluster import RayDevCluster  # noqa: E402
from tests.ray_launches import NOTHING_LEFT, launch_once, line  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--launches", type=int, default=50)
    p.add_argument("--cancel-every", type=int, default=5)
    p.add_argument("--timeout", type=float, default=240)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="ray-stress-") as tmp:
        (Path(tmp) / "cluster").mkdir()
        cluster = RayDevCluster(Path(tmp) / "cluster", 2)
        try:
            cluster.start()
            for k in range(1, args.launches + 1):
                r = launch_once(k, args.cancel_every > 0 and k % args.cancel_every == 0, Path(tmp), cluster, args.timeout)
                results.append(r)
                print(line(r), flush=True)
                if not r["ok"]:
                    print(r["tail"], flush=True)
        finally:
            cluster.stop()
    walls = [r["wall_s"] for r in results if r["kind"] == "wait" and r["ok"]]
    print(f"{len(results)} launches: {sum(not r['ok'] for r in results)} failed, {sum(r['hang'] for r in results)} hung, "
          f"{sum(bool(r['processes_left']) or r['cluster_left'] != NOTHING_LEFT for r in results)} "
          f"left something; --wait launches median {statistics.median(walls) if walls else 0:.1f}s, max {max(walls or [0]):.1f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
