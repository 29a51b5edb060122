"""The `scale` command: run the same job at several sizes and report how well it scales.

    python -m launcher scale --gpus 1,2,4 [--nodes 1,2] [--mode strong|weak] [--rounds 2] [--max-rounds 5]
                             [--spread 0.1] [KEY=VALUE ...] [train.py ARGS | -m MODULE ARGS]

Each size is an ordinary run (its own run directory under <sweep>/runs/); this module only
chooses the sizes and batches, then turns the runs' summary.json files into scale.json,
scale.md, scale.png, a console table and one W&B run holding the table and charts. A user's
script is parsed as the run command parses it (launcher.usage) and runs unchanged at every size:
its figures are launcher.commands.scale_script's.

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
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.config.schema import Config, to_dict
from launcher.config.secrets import redact
from launcher.errors import ConfigError, LaunchError, WorkerFailedError
from launcher.plan import build_plan, detect_hardware
from launcher.rundir import read_json, write_atomic, write_json
from launcher.run import resolve_config
from launcher.commands.children import launcher_command
from launcher.commands.scale_report import (COLUMNS, HEADERS, TRAINER_FOOTNOTE, notes, print_table, render_markdown,
                                            render_plot, scaling_rows, spread, spread_text, throughputs,
                                            widest_spread)
from launcher.commands.scale_script import SCRIPT_COLUMNS, batch_check, efficiency_basis, footnote, script_rows
from launcher.runtime import formatting
from launcher.runtime.schema import SUMMARY
from launcher.usage import OneLineParser, script_spec, split_argv
from launcher.runtime.wandb_logger import log_table

Script = Tuple[str, bool, List[str]]  # launcher.usage.script_spec: (path or module, is_module, its arguments)


@dataclass(frozen=True)
class SweepPoint:
    nodes: int
    gpus: int
    batch_size: Optional[int]  # per worker; None for a script, whose batch is its own

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus

    @property
    def name(self) -> str:
        return f"n{self.nodes}-g{self.gpus}"


def parse_sizes(text: str, flag: str) -> List[int]:
    parts = text.split(",")
    if len(parts) > 1 and not all(part.strip() for part in parts):
        raise ConfigError(f"{flag} {text}: an empty size between commas: write them like {flag} 1,2,4")
    try:
        sizes = [int(part) for part in parts if part.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text}: expected comma-separated whole numbers, e.g. {flag} 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{flag} {text}: every size must be at least 1, e.g. {flag} 1,2,4")
    return sorted(set(sizes))


def build_points(gpus: List[int], nodes: List[int], mode: str, batch_size: Optional[int]) -> List[SweepPoint]:
    """Strong: the global batch stays batch_size x the smallest size; weak: batch_size per worker (None: a script's)."""
    # --nodes above 1 runs simulated nodes on this machine (launcher.backends.simulated), like `--nodes N` does
    sizes = [(n, g) for n in nodes for g in gpus]
    smallest = min(n * g for n, g in sizes)
    points = []
    for n, g in sizes:
        per_worker = batch_size
        if mode == "strong" and batch_size is not None:
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
                      description="Run the job (the built-in trainer, or your script unchanged) at each size and "
                                  "report throughput and scaling efficiency.",
                      epilog="examples:\n  python -m launcher scale --gpus 1,2,4 --mode weak trainer.steps=300\n"
                             "  python -m launcher scale --gpus 1,2,4 train.py --lr 0.1     a script: weak scaling\n"
                             "  python -m launcher scale --nodes 1,2 --gpus 1 -m mypkg.train --epochs 1",
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", required=True, metavar="LIST", help="workers per node to try, e.g. 1,2,4")
    p.add_argument("--nodes", default="1", metavar="LIST", help="node counts to try (default 1)")
    p.add_argument("--mode", choices=("strong", "weak"),
                   help="strong (the built-in trainer's default): fixed global batch (data.batch_size x the smallest "
                        "size); weak: fixed per-worker batch (a script's sweep is weak: its batch is its own)")
    p.add_argument("--config", metavar="FILE", help="a YAML config, as for a run")
    p.add_argument("--output-dir", metavar="DIR", help="where the sweep folder goes (default: output_dir)")
    p.add_argument("--rounds", type=int, default=2, metavar="N", help="runs of every size at least (default 2)")
    p.add_argument("--max-rounds", type=int, default=5, metavar="N", help="runs of every size at most (default 5)")
    p.add_argument("--spread", type=float, default=0.10, metavar="FRACTION",
                   help="stop adding rounds once every size's throughput spread is within this (default 0.10)")
    p.add_argument("-m", dest="module", metavar="MODULE", help="sweep a module as the script, like python -m MODULE")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="config overrides for every run, before the script; then the script and its own arguments")
    return p


def parse_request(argv: List[str]) -> Tuple[argparse.Namespace, Optional[Script]]:
    """The sweep's flags and overrides, and the script with its arguments untouched, as the run command splits them."""
    parser = build_parser()
    ours, script = split_argv(argv, parser)
    args = parser.parse_intermixed_args(ours)  # a usage error exits 2 in one line (OneLineParser)
    spec = script_spec(args, script)
    if spec is not None and args.mode == "strong":
        raise ConfigError("scale --mode strong: the launcher cannot set a script's batch, so it cannot hold the "
                          "global batch fixed: drop --mode (a script's sweep is weak scaling, and a script that "
                          "divides its global batch by WORLD_SIZE itself is reported as strong scaling)")
    args.mode = args.mode or ("weak" if spec is not None else "strong")
    return args, spec


def main(argv: List[str]) -> int:
    args, script = parse_request(argv)
    gpus, nodes = parse_sizes(args.gpus, "--gpus"), parse_sizes(args.nodes, "--nodes")
    if not 1 <= args.rounds <= args.max_rounds:
        raise ConfigError(f"--rounds {args.rounds} --max-rounds {args.max_rounds}: need 1 <= rounds <= max-rounds, "
                          "e.g. --rounds 2 --max-rounds 5")
    if not args.spread > 0:
        raise ConfigError(f"--spread {args.spread:g}: must be a positive fraction, e.g. --spread 0.1 (10%)")
    overrides = list(args.overrides) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
    cfg = resolve_config(args, overrides, script)  # a bad key, value or script path: before anything exists
    batch = cfg.data.batch_size if script is None else None  # a script's batch is its own
    if isinstance(batch, str):
        raise ConfigError("scale sets data.batch_size at every size from the one given: give a number, "
                          "e.g. data.batch_size=32 (auto would pick another per size)")
    points = build_points(gpus, nodes, args.mode, batch)
    check_points(points, args, overrides, script)
    sweep_id = f"scale-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    sweep_dir = Path(cfg.output_dir).resolve() / sweep_id
    sweep_dir.mkdir(parents=True, exist_ok=True)
    group = cfg.wandb.group or sweep_id
    notice = capacity_notice(max(p.world_size for p in points))
    if notice:
        print(notice, flush=True)
    rounds, noisy = measure(points, args, overrides, script, sweep_dir, group)
    return report(cfg, args.mode, points, rounds, sweep_dir, group, notice, args.spread if noisy else None, script)


def point_overrides(point: SweepPoint, overrides: List[str], script: Optional[Script]) -> List[str]:
    """What a size's run gets on top of the sweep's overrides: its size and, for the built-in trainer, its batch."""
    batch = [] if script is not None else [f"data.batch_size={point.batch_size}"]
    return [*overrides, f"nodes={point.nodes}", f"gpus={point.gpus}", *batch]


def check_points(points: List[SweepPoint], args: argparse.Namespace, overrides: List[str],
                 script: Optional[Script]) -> None:
    """Every size's config and launch plan, as its own run will make them, before the sweep folder exists:
    a size this machine cannot run (too many workers, more GPUs than it has) is refused by the run's own checks."""
    hardware = detect_hardware()
    for point in points:
        try:
            cfg = resolve_config(args, point_overrides(point, overrides, script), script)
            build_plan(cfg, hardware, point.name, str(Path(cfg.output_dir).resolve() / point.name))
        except ConfigError as e:
            raise ConfigError(f"scale: at {point.world_size} worker(s) ({point.nodes} node(s) x {point.gpus}): {e}") from e


def measure(points: List[SweepPoint], args: argparse.Namespace, overrides: List[str], script: Optional[Script],
            sweep_dir: Path, group: str) -> Tuple[List[List[Dict[str, Any]]], bool]:
    """Every size's run summaries, round by round, until the spread is small; and whether it never got there.

    The spread is printed once, in the report (scale_report.spread_text): a figure of the rounds so far, beside
    the final one, would be a second figure of the same thing."""
    rounds: List[List[Dict[str, Any]]] = [[] for _ in points]
    for round_ in range(1, args.max_rounds + 1):
        for point, done in zip(points, rounds):
            done.append(run_point(point, args, overrides, sweep_dir, group, round_, script))
        key = "samples_per_s" if script is None else efficiency_basis(rounds)
        if round_ >= args.rounds and max(spread(throughputs(done, key)) for done in rounds) <= args.spread:
            return rounds, False
        if round_ >= args.rounds and round_ < args.max_rounds:
            print(f"scale: the rounds of a size still differ by more than --spread {spread_text(args.spread)} after "
                  f"{round_} rounds: another round", flush=True)
    return rounds, True


def noisy_line(rows: List[Dict[str, Any]], key: str, rounds: int, target: float) -> str:
    """Why a sweep that never got within --spread is not to be read as scaling, in the table's own figure."""
    return (f"noisy: {widest_spread(rows, key)} after {rounds} rounds, above the {spread_text(target)} target "
            "(--spread): the machine's load changed between rounds, and moved these figures more than the sizes "
            "did; read each efficiency with its range (scale.json's efficiency_range) or rerun on a quieter machine")


def script_argv(script: Optional[Script]) -> List[str]:
    """The script and its arguments as a child's command line ends: after `--`, so no name of it is taken for ours."""
    if script is None:
        return []
    path, module, script_args = script
    return ["-m", path, *script_args] if module else ["--", path, *script_args]


def script_name(script: Script) -> str:
    return f"-m {script[0]}" if script[1] else script[0]


def run_point(point: SweepPoint, args: argparse.Namespace, overrides: List[str], sweep_dir: Path, group: str,
              round_: int = 1, script: Optional[Script] = None) -> Dict[str, Any]:
    """One ordinary launcher run at this size; its summary.json is the measurement."""
    run_id = point.name if round_ == 1 else f"{point.name}-r{round_}"
    cmd = launcher_command(["--nodes", str(point.nodes), "--gpus", str(point.gpus)])
    cmd += ["--config", args.config] if args.config else []
    cmd += [*overrides, f"output_dir={sweep_dir / 'runs'}", f"run_id={run_id}"]
    cmd += [f"data.batch_size={point.batch_size}"] if script is None else []
    cmd += [f"wandb.group={group}", "metrics.progress=lines", *script_argv(script)]
    batch = f"batch {point.batch_size} per worker" if script is None else f"{script_name(script)} with its own batch"
    size = f"{point.world_size} worker(s) ({point.nodes} node x {point.gpus})"
    print(f"scale: {size}, {batch}, round {round_} ...", flush=True)
    started = time.monotonic()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run_dir = sweep_dir / "runs" / run_id
    log = sweep_dir / "logs" / f"{run_id}.log"
    write_atomic(log, done.stdout)
    if done.returncode != 0:
        last = (done.stdout.strip().splitlines() or ["no output"])[-1]
        raise WorkerFailedError(f"the {point.world_size}-worker run failed ({last}); see {log}")
    summary = SUMMARY.read(read_json(run_dir / "summary.json"))  # its fields as launcher.runtime.schema declares them
    if script is not None and summary.get("steps_per_s") is None:
        why = summary.get("metrics_note") or "no timed optimizer step"
        raise LaunchError(f"the {point.world_size}-worker run of {script_name(script)} measured no steps/s ({why}): "
                          f"scale times torch.optim optimizer steps (and needs metrics.scripts=true); see {log}")
    figure = (f"{formatting.rate(summary['samples_per_s'])} samples/s" if summary.get("samples_per_s")
              else f"{summary['steps_per_s']:.1f} steps/s" if summary.get("steps_per_s") else "no throughput measured")
    print(f"scale: {size}, round {round_}: {summary.get('status')} in "
          f"{formatting.seconds(time.monotonic() - started)}: {figure}", flush=True)
    return summary


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
           group: str, notice: Optional[str], noisy: Optional[float] = None, script: Optional[Script] = None) -> int:
    """noisy: the --spread target the sweep never got within (None: it did)."""
    result, columns, key = write_report(mode, points, rounds, sweep_dir, group, notice, noisy, script)
    print_table(result, columns)
    table = [[row.get(c) for c in columns] for row in result["sizes"]]
    charts = {"throughput_chart": ("world_size", key, f"{HEADERS[key]} by workers"),
              "efficiency_chart": ("world_size", "scaling_efficiency", "scaling efficiency by workers")}
    warning = log_table(cfg.wandb, f"{group}-summary", list(columns), table, redact(to_dict(cfg)), sweep_dir, charts,
                        {"scale_plot": sweep_dir / "scale.png"})
    if warning:
        print(warning, file=sys.stderr)
    print(f"scale: wrote {sweep_dir / 'scale.json'}, scale.md and scale.png", flush=True)
    return 0


def write_report(mode: str, points: List[SweepPoint], rounds: List[List[Dict[str, Any]]], sweep_dir: Path, group: str,
                 notice: Optional[str], noisy: Optional[float] = None,
                 script: Optional[Script] = None) -> Tuple[Dict[str, Any], Sequence[str], str]:
    """scale.json, scale.md and scale.png from every size's round summaries: (scale.json's content, the table's
    columns, the figure efficiency comes from)."""
    result: Dict[str, Any] = {"mode": mode, "group": group, "device_type": rounds[0][0].get("device_type"),
                              "notice": notice, "noisy": None, "rounds": len(rounds[0])}
    columns: Sequence[str] = COLUMNS
    if script is None:
        key, note = "samples_per_s", TRAINER_FOOTNOTE
        result["sizes"] = scaling_rows(points, rounds)
    else:
        columns, key = SCRIPT_COLUMNS, efficiency_basis(rounds)
        result["sizes"] = script_rows(points, rounds)
        result["mode"], batch_note = batch_check(result["sizes"])  # what the script did, measured
        result.update(script=script_name(script), efficiency_from=key, batch_note=batch_note)
        note = footnote(key)
    if noisy is not None:
        result["noisy"] = noisy_line(result["sizes"], key, len(rounds[0]), noisy)
    result["notes"] = notes(result)  # the lines under the table, as the board shows them too
    write_json(sweep_dir / "scale.json", result)
    write_atomic(sweep_dir / "scale.md", render_markdown(result, columns, note))
    render_plot(result["sizes"], sweep_dir / "scale.png", result["mode"], key)
    return result, columns, key
