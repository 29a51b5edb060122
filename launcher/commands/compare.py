"""The `compare` command: the same job once per parallelism strategy, side by side.

    python -m launcher compare --gpus 4 [--nodes N] [strategies=ddp,fsdp] [model.name=gpt] [key=value ...]

Each strategy runs as its own launcher process (a crash or hang in one cannot take the others
down) into <compare dir>/runs/<strategy>/; the comparison goes to compare.json, compare.md and
compare.png in the compare directory, and the table to the console.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.config.schema import STRATEGIES, load_config
from launcher.errors import ConfigError
from launcher.plan import new_run_id
from launcher.rundir import create_run_dir, read_json, write_json
from launcher.runtime import formatting
from launcher.runtime.schema import Status
from launcher.usage import build_parser as run_parser, config_overrides
from launcher.commands.children import last_line, launcher_command
from launcher.commands.compare_report import print_table, write_reports

ROW_KEYS = ("samples_per_s", "tokens_per_s", "step_time_s_median", "final_loss", "processes", "world_size",
            "peak_memory_kind", "peak_memory_bytes_per_rank", "param_bytes_per_rank", "grad_bytes_per_rank",
            "optimizer_bytes_per_rank", "comm_share", "strategy_note", "global_batch_size", "device_type")


def split_strategies(argv: List[str]) -> Tuple[List[str], List[str]]:
    """Pull the `strategies=a,b` item out of argv; the rest is an ordinary launcher command line."""
    chosen: List[str] = list(STRATEGIES)
    rest = []
    for item in argv:
        if item.startswith("strategies="):
            chosen = [s.strip() for s in item.split("=", 1)[1].split(",") if s.strip()]
            unknown = [s for s in chosen if s not in STRATEGIES]
            if unknown or not chosen:
                raise ConfigError(f"strategies={item.split('=', 1)[1]}: choose from {','.join(STRATEGIES)}")
        else:
            rest.append(item)
    return chosen, rest


def build_parser() -> argparse.ArgumentParser:
    p = run_parser()  # a comparison takes a run's flags and key=value overrides, applied to every strategy
    p.prog = "python -m launcher compare"
    p.usage = "%(prog)s [--gpus G] [--nodes N] [--config FILE] [other run flags] [strategies=a,b,...] [KEY=VALUE ...]"
    p.description = ("Run the built-in trainer once per parallelism strategy (strategies=" + ",".join(STRATEGIES)
                     + " by default), each in its own launcher process, and show them side by side: throughput, "
                       "step time, final loss, memory per rank.")
    p.epilog = ("examples:\n  python -m launcher compare --gpus 4 strategies=ddp,fsdp\n"
                "  python -m launcher compare --gpus 2 --config quick model.name=gpt trainer.steps=50\n"
                "results: compare.json, compare.md and compare.png in the comparison's folder under output_dir")
    return p


def main(argv: List[str]) -> int:
    strategies, rest = split_strategies(argv)
    parser = build_parser()
    try:
        args = parser.parse_intermixed_args(rest)
    except SystemExit as e:
        return int(e.code or 0)
    if args.module:
        raise ConfigError("compare runs the built-in trainer only: drop -m and the script")
    overrides = config_overrides(args)
    cfg = load_config(args.config, overrides)  # a bad key or value fails here, once, before any run
    compare_id = f"compare-{cfg.run_id or new_run_id()}"
    compare_dir = create_run_dir(cfg.output_dir, compare_id, cfg.launcher.allow_other_owner)
    rows = []
    print(f"compare {compare_id}: {len(strategies)} strategies ({', '.join(strategies)}), one run at a time; "
          f"folder {compare_dir}", file=sys.stderr, flush=True)
    for number, strategy in enumerate(strategies, 1):
        row = run_strategy(strategy, args.config, overrides, compare_dir, f"{number}/{len(strategies)}")
        print(f"compare: {strategy}: {ended_text(row)}", file=sys.stderr, flush=True)
        rows.append(row)
    report = {"compare_id": compare_id, "nodes": cfg.nodes, "gpus_per_node": cfg.gpus, "model": cfg.model.name,
              "batch_size_per_worker": cfg.data.batch_size, "steps": cfg.trainer.steps, "rows": rows}
    write_json(compare_dir / "compare.json", report)
    write_reports(report, compare_dir)
    print_table(report)
    print(f"compare: {sum(r['status'] == 'completed' for r in rows)}/{len(rows)} strategies completed; "
          f"results in {compare_dir}", file=sys.stderr)
    return 0


def ended_text(row: Dict[str, Any]) -> str:
    """'completed in 31s: 5044 samples/s, loss 0.8714', or the status and why: a strategy's end line."""
    took = f" in {formatting.seconds(row['wall_s'])}" if row.get("wall_s") is not None else ""
    if row.get("error"):
        return f"{row['status']}{took} ({row['error']})"
    figures = [f"{formatting.rate(row['samples_per_s'])} samples/s"] if row.get("samples_per_s") else []
    figures += [f"loss {formatting.loss(row['final_loss'])}"] if row.get("final_loss") is not None else []
    return f"{row['status']}{took}" + (f": {', '.join(figures)}" if figures else "")


def run_strategy(strategy: str, config_file: Optional[str], overrides: List[str], compare_dir: Path,
                 which: str = "") -> Dict[str, Any]:
    """Run one strategy to completion in its own launcher process and turn its summary into a row."""
    item = [f"trainer.strategy={strategy}"]
    try:
        load_config(config_file, overrides + item)
    except ConfigError as e:  # not supported for this model or job shape: say why, run nothing
        return {"strategy": strategy, "status": "unsupported", "error": str(e)}
    runs = compare_dir / "runs"
    child = launcher_command((["--config", config_file] if config_file else [])
                             + overrides + item + [f"output_dir={runs}", f"run_id={strategy}"])
    log_path = compare_dir / "logs" / f"{strategy}.log"
    print(f"compare: {strategy}: starting{f' ({which})' if which else ''}; its output in {log_path}", file=sys.stderr,
          flush=True)
    started = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.call(child, stdout=log, stderr=subprocess.STDOUT)
    summary_path = runs / strategy / "summary.json"
    summary: Dict[str, Any] = read_json(summary_path) if summary_path.is_file() else {}
    row: Dict[str, Any] = {"strategy": strategy, "status": summary.get("status") or Status.FAILED, "exit_code": code,
                           "wall_s": time.time() - started, "run_dir": str(runs / strategy), "log": str(log_path)}
    row.update({key: summary.get(key) for key in ROW_KEYS})
    if code != 0:
        row["status"] = Status.FAILED
        row["error"] = summary.get("error") or last_line(log_path) or f"exit code {code}"
    return row

