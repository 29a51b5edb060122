"""Elastic membership, many times in a row: the suite's real join and loss tests (tests/test_elastic.py), each run
again and again in a fresh pytest process, counting the rounds that fail or hang.

    python bench/elastic_stress.py [--rounds 50] [--timeout 400] [--json FILE] [-k join] [-k loses]

Each round runs every selected test once (default: a node joining a running job, and a job losing one node of
2 and of 3), through pytest, so each round asserts exactly what the suite asserts (every sample of the epoch
read once, the membership change recorded, no process left behind). A test that has not ended in --timeout s
counts as a hang: its process group is killed and the benchmark goes on. Prints a line per test run and a
summary of passes, failures and durations per test; --json writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
TESTS = {
    "join": "tests/test_elastic.py::test_a_node_that_joins_a_running_job_is_admitted",
    "loses": "tests/test_elastic.py::test_simulated_job_loses_a_node_and_completes_on_the_others",
}


def run_once(node: str, timeout: float) -> Dict[str, object]:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", node], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        outcome = "pass" if proc.returncode == 0 else "fail"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        outcome = "hang"
    tail = "" if outcome == "pass" else "\n".join(out.strip().splitlines()[-15:])
    return {"outcome": outcome, "seconds": round(time.monotonic() - started, 1), "tail": tail}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=400.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("-k", dest="only", action="append", choices=sorted(TESTS), help="run only these tests")
    args = parser.parse_args()
    chosen = args.only or sorted(TESTS)
    results: Dict[str, List[Dict[str, object]]] = {name: [] for name in chosen}
    for round_no in range(1, args.rounds + 1):
        for name in chosen:
            result = run_once(TESTS[name], args.timeout)
            results[name].append(result)
            print(f"round {round_no} {name}: {result['outcome']} in {result['seconds']} s", flush=True)
            if result["tail"]:
                print(result["tail"], flush=True)
    summary = {}
    for name, runs in results.items():
        seconds = [float(r["seconds"]) for r in runs]
        summary[name] = {"runs": len(runs), "passed": sum(r["outcome"] == "pass" for r in runs),
                         "failed": sum(r["outcome"] == "fail" for r in runs),
                         "hung": sum(r["outcome"] == "hang" for r in runs),
                         "median_s": statistics.median(seconds), "max_s": max(seconds)}
        print(f"{name}: {summary[name]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "runs": results}, indent=1))
    return 0 if all(s["passed"] == s["runs"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
