"""Benchmarks, each a ratio against a baseline run in the same invocation (alternating runs, medians).

    python bench/run.py [--quick]

- trainer_vs_handwritten: steady-state samples/s of our DDP trainer (launcher, metrics, W&B
  offline) / a minimal hand-written DDP loop under torchrun; same model, data, batch (target >= 0.97)
- metrics_overhead_in_run: the trainer's own accounting (summary.json metrics_overhead_share): time
  inside metrics and logging code over the steady wall time (target < 2%)
- metrics_and_logging_overhead: step time with metrics + W&B offline / with neither, minus 1, over
  whole runs (target < 2%; run_to_run_iqr is how far single runs scatter, its resolution);
  metrics_overhead_no_wandb the same with metrics only
- ddp_allreduce_*: gloo bandwidth of DDP's gradient all-reduce with our communication timing / without
  it (a raw dist.all_reduce of the same bytes beside them)
- startup rows from bench/startup.py when it exists (time to first step vs torchrun)
Writes bench/results.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, List

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))  # `python bench/run.py` from anywhere finds launcher/ and trainers/
WORKERS = 2


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("WANDB_MODE", "offline")
    return env


def _launcher_run(out: Path, steps: int, batch: int, extra: List[str]) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "launcher", "--gpus", str(WORKERS), f"output_dir={out}", f"trainer.steps={steps}",
           f"data.batch_size={batch}", "trainer.log_every=10", *extra]
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"launcher run failed: {done.stderr[-2000:]}")
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    return summary


def _handwritten_run(steps: int, batch: int) -> Dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORKERS), "--log-dir", tempfile.mkdtemp(),
           str(BENCH / "ddp_baseline.py"), str(steps), str(batch)]
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun baseline failed: {done.stderr[-2000:]}")
    return json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])


def alternate(rounds: int, runners: Dict[str, Callable[[], float]]) -> Dict[str, List[float]]:
    """Run every variant once per round, rotating the order each round, and collect step times."""
    names = list(runners)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            times[name].append(runners[name]())
    return times


def bench_trainer_and_overhead(tmp: Path, rounds: int, steps: int) -> List[Dict[str, Any]]:
    """Our trainer (defaults: metrics on, W&B offline), metrics only, nothing, and the hand-written loop."""
    counter = iter(range(10_000))
    shares: List[float] = []  # metrics_overhead_share of the full runs: the trainer's own accounting

    def ours(*extra: str) -> Callable[[], float]:
        def one() -> float:
            summary = _launcher_run(tmp / f"r{next(counter)}", steps, 32, list(extra))
            if not extra:
                shares.append(float(summary["metrics_overhead_share"]))
            return float(summary["step_time_s_wall"])
        return one

    times = alternate(rounds, {
        "full": ours(),
        "handwritten": lambda: float(_handwritten_run(steps, 32)["step_time_s_wall"]),
        "metrics_only": ours("wandb.mode=disabled"),
        "bare": ours("metrics.detailed=false", "wandb.mode=disabled"),
    })
    med = {name: statistics.median(values) for name, values in times.items()}
    vs_hand = med["handwritten"] / med["full"]  # samples/s ours / samples/s hand-written
    full_cost = med["full"] / med["bare"] - 1.0
    metrics_cost = med["metrics_only"] / med["bare"] - 1.0
    sps = {name: 32 * WORKERS / value for name, value in med.items()}
    spread = statistics.quantiles(times["bare"], n=4) if len(times["bare"]) >= 2 else [med["bare"]] * 3
    noise = (spread[2] - spread[0]) / med["bare"]  # run-to-run spread of one variant: the A/B rows' resolution
    in_run = statistics.median(shares)
    return [
        {"name": "metrics_overhead_in_run", "ratio": in_run, "target": "< 0.02", "ok": in_run < 0.02,
         "what": "time inside metrics and logging code / steady wall time, slowest rank, median of the full runs"},
        {"name": "trainer_vs_handwritten_ddp", "ratio": vs_hand, "target": ">= 0.97", "ok": vs_hand >= 0.97,
         "ours_samples_per_s": sps["full"], "base_samples_per_s": sps["handwritten"]},
        {"name": "metrics_and_logging_overhead", "ratio": full_cost, "target": "< 0.02", "ok": full_cost < 0.02,
         "with_samples_per_s": sps["full"], "without_samples_per_s": sps["bare"], "run_to_run_iqr": noise},
        {"name": "metrics_overhead_no_wandb", "ratio": metrics_cost, "target": "< 0.02", "ok": metrics_cost < 0.02,
         "with_samples_per_s": sps["metrics_only"]},
        {"name": "step_times_s", "ratio": None, "runs": times},
    ]


def bench_meter_in_process(blocks: int, steps: int) -> Dict[str, Any]:
    """The step meter's own cost, in one process on the same model and batch: blocks of steps with
    the meter on and off, alternating, median per-step time. Less exposed to machine load than
    whole runs, and it isolates the per-step instrumentation from W&B and start-up."""
    import time

    import torch
    import torch.nn.functional as F

    from launcher.trainers.metrics.steps import StepMeter
    from launcher.trainers.models import MLP

    torch.manual_seed(0)
    model, x, y = MLP(256, 512, 4, 10), torch.randn(32, 256), torch.randint(0, 10, (32,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def block(detailed: bool) -> float:
        meter = StepMeter(torch.device("cpu"), 1, detailed)
        times = []
        for i in range(steps):
            t0 = time.perf_counter()
            meter.start(x, 32)
            loss = F.cross_entropy(model(x), y)
            meter.phase("forward")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            meter.phase("backward")
            opt.step()
            meter.phase("optimizer")
            meter.end(counted=i > 2)
            if (i + 1) % 10 == 0:
                meter.gather()  # a log step's sampling (RSS, CPU), as in training
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def calls_only(n: int = 2000) -> float:
        """The meter's calls with no training between them: its own cost per step."""
        meter = StepMeter(torch.device("cpu"), 1, True)
        t0 = time.perf_counter()
        for i in range(n):
            meter.start(x, 32)
            for name in ("forward", "backward", "optimizer"):
                meter.phase(name)
            meter.end(counted=i > 2)
            if (i + 1) % 10 == 0:
                meter.gather()
        return (time.perf_counter() - t0) / n

    torch.set_num_threads(1)  # steadier on a shared machine
    block(False)  # warm up
    times = alternate(blocks, {"on": lambda: block(True), "off": lambda: block(False)})
    off = statistics.median(times["off"])
    own = statistics.median([calls_only() for _ in range(3)])
    cost = statistics.median(times["on"]) / off - 1.0
    return {"name": "step_meter_overhead_in_process", "ratio": cost, "target": "< 0.02", "ok": cost < 0.02,
            "step_ms_on": 1000 * statistics.median(times["on"]), "step_ms_off": 1000 * off,
            "meter_us_per_step": 1e6 * own, "meter_share_of_step": own / off}


def bench_allreduce(tmp: Path, repeats: int) -> List[Dict[str, Any]]:
    out = tmp / "allreduce.json"
    cmd = [sys.executable, "-m", "launcher", "--gpus", str(WORKERS), f"output_dir={tmp / 'ar'}", "wandb.mode=disabled",
           str(BENCH / "allreduce_job.py"), str(out), str(repeats)]
    done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"all-reduce job failed: {done.stderr[-2000:]}")
    sizes = json.loads(out.read_text())["sizes"]
    return [{"name": f"ddp_allreduce_{size}_bandwidth", "ratio": row["ours_gbps"] / row["ddp_gbps"], "target": ">= 0.95",
             "ok": row["ours_gbps"] / row["ddp_gbps"] >= 0.95, **row} for size, row in sizes.items()]


def bench_startup(quick: bool) -> List[Dict[str, Any]]:
    """Rows from bench/startup.py (time to first step, ours vs torchrun) when it is there."""
    if not (BENCH / "startup.py").is_file():
        return []
    import inspect

    sys.path.insert(0, str(BENCH))
    import startup  # type: ignore[import-not-found]

    # --quick must stay under 3 minutes: one interleaved round of startup runs where run() allows it
    kwargs = {"rounds": 1} if quick and "rounds" in inspect.signature(startup.run).parameters else {}
    result = startup.run(quick, **kwargs)
    rows = []
    for name, figures in result.items():
        ratio = figures.get("ratio_first_step")
        rows.append({"name": name, "ratio": ratio, "target": "<= 1.0 (ours / torchrun)",
                     "ok": ratio is not None and ratio <= 1.0,
                     **{k: v for k, v in figures.items() if k != "ratio_first_step"}})
    return rows


def machine() -> str:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{platform.node()}: {os.cpu_count()} cores, {gpu}, torch {torch.__version__}, Python {platform.python_version()}"


def print_table(rows: List[Dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bench (ratios against a baseline run in the same invocation)")
    for column in ("benchmark", "ratio", "target", "ok", "detail"):
        table.add_column(column)
    for row in rows:
        if row.get("ratio") is None and "runs" in row:
            continue
        detail = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                           if k not in ("name", "ratio", "target", "ok", "runs"))
        ratio = row.get("ratio")
        table.add_row(row["name"], f"{ratio:.4f}" if isinstance(ratio, float) else str(ratio), str(row.get("target", "")),
                      str(row.get("ok", "")), detail)
    Console(width=200).print(table)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter runs (under 3 minutes)")
    args = parser.parse_args(argv)
    rounds, steps, repeats = (2, 150, 10) if args.quick else (6, 400, 30)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        rows = bench_trainer_and_overhead(Path(tmp), rounds, steps)
        rows.append(bench_meter_in_process(6 if args.quick else 12, 100))
        rows += bench_allreduce(Path(tmp), repeats)
    rows += bench_startup(args.quick)
    result = {"machine": machine(), "quick": args.quick, "workers": WORKERS, "rows": rows}
    (BENCH / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(result["machine"])
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
