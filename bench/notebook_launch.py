"""The Python API at notebook speed: launcher.launch against Accelerate's notebook_launcher, in a Jupyter kernel.

    python bench/notebook_launch.py [--rounds 5] [--gpus 2] [--steps 5] [--pause S] [--settings KEY=VALUE ...] [--json FILE]

Each round starts a fresh Jupyter kernel (nbclient) per launcher, in alternating order, and runs the same
cells in both: `import time, torch` and the launcher's import (timed apart), the same 5-step DDP function
(bench/api_stress.py's: a Linear model, gloo, then an all_reduce of the rank), then twice `time.sleep(--pause)`
(a user's other cells; 0: run all at once) and a cell that launches it on --gpus processes and checks what came
back. The figures are those cells' times, measured in the kernel: what a notebook user waits for.
Prints each round, the medians, their ratios ours/Accelerate, the load average before and after, and writes
bench/notebook_launch.json. Our launch runs with the default settings (W&B offline, as a user
gets it) unless --settings says otherwise (wandb_mode=disabled).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from api_stress import train  # noqa: E402  (the same small DDP function as the Python API's stress bench)

# the cell: the function's own source, as a user would type it
FUNCTION = "from typing import Any, Dict\n\n" + inspect.getsource(train)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cells(who: str, gpus: int, steps: int, out: str, settings: Dict[str, Any], pause: float) -> List[str]:
    """The notebook: imports, the function, then twice a pause (a user's other cells) and the launch."""
    if who == "ours":
        load = "import launcher"
        call = lambda: f"launcher.launch(train, {steps}, gpus={gpus}, output_dir={out!r}, **{settings!r})"  # noqa: E731
        check = f"assert [v['sum'] for v in value] == [{float(sum(range(gpus)))}] * {gpus}, value"
    else:
        load = "from accelerate import notebook_launcher"
        call = lambda: f"notebook_launcher(train, ({steps},), num_processes={gpus}, use_port='{free_port()}')"  # noqa: E731
        check = "assert value is None, value"
    timed = [f"started = time.perf_counter()\nvalue = {call()}\nprint('{tag}', time.perf_counter() - started)\n{check}"
             for tag in ("FIRST_S", "AGAIN_S")]
    think = f"time.sleep({pause})"
    return [f"import time\nstarted = time.perf_counter()\nimport torch\n{load}\n"
            f"print('IMPORT_S', time.perf_counter() - started)", FUNCTION, think, timed[0], think, timed[1]]


def one_round(who: str, gpus: int, steps: int, settings: Dict[str, Any], pause: float) -> Dict[str, float]:
    import nbclient
    import nbformat

    with tempfile.TemporaryDirectory(prefix="nb-bench-") as out:
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c)
                                                   for c in cells(who, gpus, steps, out, settings, pause)])
        client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": out}})
        client.execute()
        printed = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", [])
                          if o.get("name") == "stdout")
    figures = {}
    for line in printed.splitlines():
        key, _, value = line.partition(" ")
        if key in ("IMPORT_S", "FIRST_S", "AGAIN_S"):
            figures[key.lower()[:-2]] = round(float(value), 2)
    if "again" not in figures:
        raise RuntimeError(f"{who}: a launch cell printed no time:\n{printed[-3000:]}")
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--pause", type=float, default=0.0, help="seconds before each launch cell (0: run all)")
    parser.add_argument("--settings", nargs="*", default=[], help="launch() settings for ours, KEY=VALUE (JSON values)")
    parser.add_argument("--json", default=str(REPO / "bench" / "notebook_launch.json"))
    args = parser.parse_args()
    settings = {k: json.loads(v) if v[:1] in "0123456789[{tfn\"-" else v
                for k, v in (item.split("=", 1) for item in args.settings)}
    load_before = os.getloadavg()
    rows: List[Dict[str, Any]] = []
    for r in range(args.rounds):
        for who in (("ours", "accelerate") if r % 2 == 0 else ("accelerate", "ours")):
            figures = one_round(who, args.gpus, args.steps, settings, args.pause)
            rows.append({"round": r, "who": who, **figures, "load1": round(os.getloadavg()[0], 2)})
            print(json.dumps(rows[-1]), flush=True)
    median = {(who, key): statistics.median(row[key] for row in rows if row["who"] == who)
              for who in ("ours", "accelerate") for key in ("import", "first", "again")}
    result: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "rounds": args.rounds, "gpus": args.gpus, "steps": args.steps,
        "pause_s": args.pause, "settings": settings, "cpus": os.cpu_count(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        **{f"{who}_{key}_s": round(value, 2) for (who, key), value in median.items()},
        **{f"ratio_{key}": round(median["ours", key] / median["accelerate", key], 3) for key in ("first", "again")},
        "runs": rows}
    print(f"median of {args.rounds} rounds, ours / Accelerate: first launch in the kernel {median['ours', 'first']:.2f} s / "
          f"{median['accelerate', 'first']:.2f} s = {result['ratio_first']:.2f}; the same launch again "
          f"{median['ours', 'again']:.2f} s / {median['accelerate', 'again']:.2f} s = {result['ratio_again']:.2f} "
          f"(import cell {median['ours', 'import']:.2f} s / {median['accelerate', 'import']:.2f} s; load "
          f"{result['load_before'][0]} -> {result['load_after'][0]} on {os.cpu_count()} CPUs)")
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
