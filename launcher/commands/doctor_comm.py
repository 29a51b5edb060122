"""`doctor --comm`: an all-reduce bandwidth job (launcher.trainers.allreduce_bench) launched like any other run,
through the same agent, rendezvous and workers, then its results printed in nccl-tests' style."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher import prestart
from launcher.config.schema import Config
from launcher.errors import ConfigError
from launcher.plan import new_run_id
from launcher.run import run
from launcher.usage import config_overrides, parse_args, script_spec, with_error_contract

BENCH_MODULE = "launcher.trainers.allreduce_bench"


def default_workers() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def check_sizes(args: argparse.Namespace) -> None:
    if (args.gpus is not None and args.gpus < 1) or args.nodes < 1:
        raise ConfigError(f"doctor --comm needs at least 1 node and 1 worker (got --nodes {args.nodes} --gpus {args.gpus}): e.g. --gpus 2")


def run_comm_test(args: argparse.Namespace, cfg: Config) -> int:
    """Launch the bandwidth job; print its table. Returns the launcher's exit code (0 = measured)."""
    gpus = default_workers() if args.gpus is None else args.gpus
    run_id = cfg.run_id or f"doctor-comm-{new_run_id()}"  # nodes of one test must share it: pass run_id=ID
    run_dir = Path(cfg.output_dir).resolve() / run_id
    out = run_dir / "allreduce.json"
    print(f"\nall-reduce bandwidth: {args.nodes} node(s) x {gpus} workers; run directory {run_dir}", flush=True)
    argv = ["--gpus", str(gpus), "--nodes", str(args.nodes), *args.overrides, f"run_id={run_id}",
            "-m", BENCH_MODULE, "--max-bytes", str(args.max_bytes), "--out", str(out)]
    if args.config:
        argv = ["--config", args.config, *argv]
    code = with_error_contract(lambda: launch(argv))
    if code != 0:
        print(f"FAIL  comm  the all-reduce job failed (exit {code}): see {run_dir / 'logs'}")
        return code or 1
    results = json.loads(out.read_text())
    print(format_table(results))
    return 0


def launch(argv: List[str]) -> int:
    """`python -m launcher ARGV`, as a run from the command line (launcher.usage, launcher.run), but in this process:
    an exec into the warm bootstrap would never come back to print the table."""
    prestart.stay()
    args, script = parse_args(argv)
    return run(args, config_overrides(args), script_spec(args, script))


def format_table(results: Dict[str, Any]) -> str:
    """nccl-tests' all_reduce_perf columns: size, count, time, algbw, busbw; then the average busbw."""
    rows: List[Dict[str, Any]] = results["rows"]
    lines = [f"# all_reduce sum float32, {results['world_size']} ranks, {results['backend']} on {results['device']}",
             f"# {'size (B)':>12} {'count':>10} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"]
    for r in rows:
        lines.append(f"  {r['bytes']:>12} {r['count']:>10} {r['time_us']:>11.1f} {r['algbw_gbps']:>13.3f} {r['busbw_gbps']:>13.3f}")
    average: Optional[float] = sum(r["busbw_gbps"] for r in rows) / len(rows) if rows else None
    lines.append(f"# average bus bandwidth: {average:.3f} GB/s" if average is not None else "# no sizes measured")
    return "\n".join(lines)
