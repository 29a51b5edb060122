"""The `scale` command: run the same job at several sizes and report how well it scales.

    python -m launcher scale --gpus 1,2,4 [--nodes 1,2] [--mode strong|weak] [--rounds 2] [--max-rounds 5]
                             [--spread 0.1] [KEY=VALUE ...]

Each size is an ordinary run (its own run directory under <sweep>/runs/); this module only
chooses the sizes and batches, then turns the runs' summary.json files into scale.json,
scale.md, scale.png, a console table and one W&B run holding the table and charts.

A single run per size is not a measurement on a shared machine (4.6x efficiency in one sweep,
0.16 in the next): every size runs --rounds times, round by round so that the machine's drift
reaches every size alike, and more rounds follow, up to --max-rounds, until each size's
throughput spread ((largest - smallest) / median) is within --spread. The figures are the
medians; the spread is printed beside each, and a sweep that never got there says so.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.config.schema import Config, load_config, to_dict
from launcher.config.secrets import redact
from launcher.errors import ConfigError, WorkerFailedError
from launcher.rundir import read_json, write_atomic, write_json
from launcher.commands.children import launcher_command
from launcher.commands.scale_report import (COLUMNS, print_table, render_markdown, render_plot, scaling_rows, spread,
                                            throughputs)
from launcher.usage import OneLineParser
from launcher.trainers.wandb_logger import log_table


@dataclass(frozen=True)
class SweepPoint:
    nodes: int
    gpus: int
    batch_size: int  # per worker

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus

    @property
    def name(self) -> str:
        return f"n{self.nodes}-g{self.gpus}"


def parse_sizes(text: str, flag: str) -> List[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text}: expected comma-separated whole numbers, e.g. {flag} 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{flag} {text}: every size must be at least 1, e.g. {flag} 1,2,4")
    return sorted(set(sizes))


def build_points(gpus: List[int], nodes: List[int], mode: str, batch_size: int) -> List[SweepPoint]:
    """Strong: the global batch stays batch_size x the smallest size; weak: batch_size per worker."""
    # --nodes above 1 runs simulated nodes on this machine (launcher.backends.simulated), like `--nodes N` does
    sizes = [(n, g) for n in nodes for g in gpus]
    smallest = min(n * g for n, g in sizes)
    points = []
    for n, g in sizes:
        per_worker = batch_size
        if mode == "strong":
            global_batch = batch_size * smallest
            if global_batch % (n * g):
                raise ConfigError(
                    f"strong scaling keeps the global batch at {global_batch} ({batch_size} x {smallest} workers), "
                    f"which {n * g} workers cannot split evenly: pick sizes that divide it or change data.batch_size"
                )
            per_worker = global_batch // (n * g)
        points.append(SweepPoint(n, g, per_worker))
    return points


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m launcher scale",
                      description="Run the job at each size and report throughput and scaling efficiency.")
    p.add_argument("--gpus", required=True, metavar="LIST", help="workers per node to try, e.g. 1,2,4")
    p.add_argument("--nodes", default="1", metavar="LIST", help="node counts to try (default 1)")
    p.add_argument("--mode", choices=("strong", "weak"), default="strong",
                   help="strong: fixed global batch (data.batch_size x the smallest size); weak: fixed per-worker batch")
    p.add_argument("--config", metavar="FILE", help="a YAML config, as for a run")
    p.add_argument("--output-dir", metavar="DIR", help="where the sweep folder goes (default: output_dir)")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="runs of every size at least (default 2)")
    p.add_argument("--max-rounds", type=int, default=5, metavar="N", help="runs of every size at most (default 5)")
    p.add_argument("--spread", type=float, default=0.10, metavar="FRACTION",
                   help="stop adding rounds once every size's throughput spread is within this (default 0.10)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides for every run")
    return p


def main(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)  # usage errors: launcher.usage.with_error_contract turns SystemExit into the exit code
    gpus, nodes = parse_sizes(args.gpus, "--gpus"), parse_sizes(args.nodes, "--nodes")
    if not 1 <= args.rounds <= args.max_rounds:
        raise ConfigError(f"--rounds {args.rounds} --max-rounds {args.max_rounds}: need 1 <= rounds <= max-rounds, "
                          "e.g. --rounds 2 --max-rounds 5")
    if not args.spread > 0:
        raise ConfigError(f"--spread {args.spread:g}: must be a positive fraction, e.g. --spread 0.1 (10%)")
    overrides = list(args.overrides) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
    cfg = load_config(args.config, overrides)
    points = build_points(gpus, nodes, args.mode, cfg.data.batch_size)
    sweep_id = f"scale-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    sweep_dir = Path(cfg.output_dir).resolve() / sweep_id
    sweep_dir.mkdir(parents=True, exist_ok=True)
    group = cfg.wandb.group or sweep_id
    notice = capacity_notice(max(p.world_size for p in points))
    if notice:
        print(notice, flush=True)
    rounds: List[List[Dict[str, Any]]] = [[] for _ in points]
    noisy = None
    for round_ in range(1, args.max_rounds + 1):
        for point, done in zip(points, rounds):
            done.append(run_point(point, args, overrides, sweep_dir, group, round_))
        spreads = [spread(throughputs(done)) for done in rounds]
        if round_ >= args.rounds and max(spreads) <= args.spread:
            break
        if round_ >= args.rounds and round_ < args.max_rounds:
            print(f"scale: throughput spread {100 * max(spreads):.0f}% after {round_} rounds, above --spread "
                  f"{100 * args.spread:.0f}%: another round", flush=True)
    else:
        noisy = (f"noisy: throughput spread up to {100 * max(spreads):.0f}% after {args.max_rounds} rounds (target "
                 f"{100 * args.spread:.0f}%, --spread): read the efficiencies with their ranges in scale.json")
    return report(cfg, args.mode, points, rounds, sweep_dir, group, notice, noisy)


def run_point(point: SweepPoint, args: argparse.Namespace, overrides: List[str], sweep_dir: Path, group: str,
              round_: int = 1) -> Dict[str, Any]:
    """One ordinary launcher run at this size; its summary.json is the measurement."""
    run_id = point.name if round_ == 1 else f"{point.name}-r{round_}"
    cmd = launcher_command(["--nodes", str(point.nodes), "--gpus", str(point.gpus)])
    cmd += ["--config", args.config] if args.config else []
    cmd += [*overrides, f"output_dir={sweep_dir / 'runs'}", f"run_id={run_id}",
            f"data.batch_size={point.batch_size}", f"wandb.group={group}", "metrics.progress=lines"]
    print(f"scale: {point.world_size} worker(s) ({point.nodes} node x {point.gpus}), batch {point.batch_size} per worker, "
          f"round {round_} ...", flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = sweep_dir / "runs" / run_id
    write_atomic(sweep_dir / "logs" / f"{run_id}.log", done.stdout)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise WorkerFailedError(f"the {point.world_size}-worker run failed ({last}); see {sweep_dir / 'logs' / (run_id + '.log')}")
    return read_json(run_dir / "summary.json")


def capacity_notice(max_workers: int, cores: Optional[int] = None, cuda_devices: Optional[int] = None) -> Optional[str]:
    """Say plainly when this machine cannot show scaling."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cuda_devices:
        return None
    if max_workers > cores:
        return (f"note: this machine has {cores} CPU cores and no GPU: with up to {max_workers} workers they share "
                "cores, so these figures show contention and overhead, not how the job scales on real hardware")
    return (f"note: no GPU: CPU workers share this machine's {cores} cores (threads = cores / workers), so the "
            "total compute is the same at every size; efficiency here measures overhead, not scaling")


def report(cfg: Config, mode: str, points: List[SweepPoint], rounds: List[List[Dict[str, Any]]], sweep_dir: Path,
           group: str, notice: Optional[str], noisy: Optional[str] = None) -> int:
    rows = scaling_rows(points, rounds)
    result = {"mode": mode, "group": group, "device_type": rounds[0][0].get("device_type"), "notice": notice,
              "noisy": noisy, "rounds": len(rounds[0]), "sizes": rows}
    write_json(sweep_dir / "scale.json", result)
    write_atomic(sweep_dir / "scale.md", render_markdown(result))
    render_plot(rows, sweep_dir / "scale.png", mode)
    print_table(result)
    table = [[row.get(c) for c in COLUMNS] for row in rows]
    charts = {"throughput_chart": ("world_size", "samples_per_s", "samples/s by workers"),
              "efficiency_chart": ("world_size", "scaling_efficiency", "scaling efficiency by workers")}
    warning = log_table(cfg.wandb, f"{group}-summary", list(COLUMNS), table, redact(to_dict(cfg)), sweep_dir, charts,
                        {"scale_plot": sweep_dir / "scale.png"})
    if warning:
        print(warning, file=sys.stderr)
    print(f"scale: wrote {sweep_dir / 'scale.json'}, scale.md and scale.png", flush=True)
    return 0

