"""How fast the board answers over many runs: the synthetic output directory of bench/ls_speed.py (N runs
with M metric lines each, a sweep of 20), a real `python -m launcher board` on it, and Debian's chromium.

    python bench/board_speed.py [--runs 1000] [--metric-lines 2000] [--rounds 5]

Prints the median time of GET /api/runs against launcher.runindex.list_runs in-process (their ratio is
what the web layer adds), of GET /api/run for one run (M metric lines), and, when chromium and
playwright are here, of the page from navigation to every run's row on screen.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Callable, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ls_speed import build, timed  # noqa: E402
from launcher.runindex import list_runs  # noqa: E402


def median_s(fn: Callable[[], Any], rounds: int) -> float:
    return timed(fn, rounds)[0]  # the median wall time (bench/ls_speed.py)


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def page_seconds(url: str, rows: int, rounds: int) -> float:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page()

        def load() -> None:
            page.goto(url + "/")
            page.wait_for_function(f"document.querySelectorAll('#runs tbody tr').length >= {rows}", timeout=120_000)

        try:
            return median_s(load, rounds)
        finally:
            browser.close()


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--metric-lines", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="board-bench-") as tmp:
        root = Path(tmp)
        build(root, args.runs, args.metric_lines)
        index_s = median_s(lambda: list_runs(root), args.rounds)
        server = subprocess.Popen([sys.executable, "-m", "launcher", "board", str(root), "--port", "0"], cwd=REPO,
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert server.stdout is not None
            url = re.search(r"(http://\S+?)/? ", server.stdout.readline()).group(1)  # type: ignore[union-attr]
            api_s = median_s(lambda: fetch(f"{url}/api/runs"), args.rounds)
            run_s = median_s(lambda: fetch(f"{url}/api/run?path=20261123-000000"), args.rounds)
            print(f"{args.runs} runs, {args.metric_lines} metric lines each:")
            print(f"  list_runs in-process   {index_s * 1000:7.0f} ms")
            print(f"  GET /api/runs          {api_s * 1000:7.0f} ms  ({api_s / index_s:.2f}x list_runs)")
            print(f"  GET /api/run (1 run)   {run_s * 1000:7.0f} ms")
            if shutil.which("chromium"):
                rows = args.runs  # every run, the sweep's members under its row
                print(f"  page: all rows shown   {page_seconds(url, rows, min(3, args.rounds)) * 1000:7.0f} ms (chromium)")
        finally:
            server.terminate()
            server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
