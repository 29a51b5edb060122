"""The `sweep` command: one job over a grid of overrides (or a list of them), each member an ordinary run.

    python -m launcher sweep trainer.lr=0.1,0.01 data.batch_size=32,64 [--parallel N] [--name NAME]
        [--list FILE] [--cluster slurm [--wait]] [launcher flags and key=value ...] [script and its args]

Every member's config is checked before anything is made; then the sweep folder
<output_dir>/<sweep_id>/ gets sweep.json (launcher.commands.sweep_plan) and the members run, N at a
time here (launcher.commands.sweep_queue) or as one SLURM job array (launcher.backends.slurm.array).
`python -m launcher resume SWEEP` re-runs the members that did not complete.
"""

from __future__ import annotations

import argparse
import datetime
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from launcher.backends import registry
from launcher.commands.sweep_plan import (SWEEP_FILE, expand, is_grid_item, member_argv, new_sweep, parse_grid,
                                          read_list, read_sweep, varied_keys, write_sweep)
from launcher.commands.sweep_queue import archive_member, hold_sweep, member_result, run_members
from launcher.config.inputs import check_run_id
from launcher.config.schema import Config, load_config
from launcher.errors import ConfigError
from launcher.run import resolve_config
from launcher.runindex import is_run_dir
from launcher.runtime.schema import Status
from launcher.usage import build_parser as run_parser, config_overrides, int_flag, parse_args, script_spec, split_argv

OWN_FLAGS = ("--parallel", "--name", "--list", "--max-members")  # the sweep's; take a value
MAX_MEMBERS = 1000  # a bigger sweep takes --max-members: checking each member's config costs ~15 ms
PROGRESS_S = 2.0  # a check that takes longer says how far it is this often
DROPPED = ("--wait", "--dry-run")  # the sweep's own meaning; not passed to members


def build_parser() -> argparse.ArgumentParser:
    p = run_parser()  # every flag of a run applies to each member
    p.prog = "python -m launcher sweep"
    p.description = "Run the job once per combination of the swept keys (key=a,b,c), each member an ordinary run."
    p.epilog = ("examples:\n  python -m launcher sweep --config quick trainer.lr=0.1,0.01 seed=1,2 --parallel 2\n"
                "  python -m launcher sweep --list members.txt --gpus 2 train.py --epochs 3\n"
                "  python -m launcher sweep --cluster slurm trainer.lr=0.1,0.01 --parallel 4 --wait\n"
                "  python -m launcher resume launcher_runs/SWEEP_ID     re-run the members that did not complete")
    p.add_argument("--parallel", type=int_flag("--parallel"), default=1, metavar="N",
                   help="members at a time (here: processes; on SLURM: the job array's concurrency limit)")
    p.add_argument("--name", metavar="NAME", help="the sweep's folder name under output_dir (default sweep-DATE-TIME)")
    p.add_argument("--list", dest="list_file", metavar="FILE",
                   help="members from a file, one `key=value ...` set per line, instead of (or crossed with) a grid")
    p.add_argument("--max-members", type=int_flag("--max-members"), default=MAX_MEMBERS, metavar="N",
                   help=f"refuse a sweep of more members than this (default {MAX_MEMBERS}); raise it to run a bigger one")
    return p


@dataclass
class SweepRequest:
    """The command line, taken apart: the sweep's options, the members, what they share."""

    args: argparse.Namespace
    members: List[Dict[str, str]]
    keys: List[str]
    base_args: List[str]


def parse_request(argv: List[str]) -> SweepRequest:
    parser = build_parser()
    ours, script = split_argv(argv, parser)
    args = parser.parse_intermixed_args(ours)  # a usage error exits 2 in one line (OneLineParser)
    if args.show_config:
        raise ConfigError("sweep: --show-config shows one run's config: run `python -m launcher --show-config KEY=VALUE ...`")
    if args.parallel < 1:
        raise ConfigError(f"sweep: --parallel {args.parallel}: run at least one member at a time, e.g. --parallel 2")
    takes_value = {s for a in parser._actions if a.nargs != 0 and a.option_strings for s in a.option_strings}
    base: List[str] = []
    grid_items: List[str] = []
    i = 0
    while i < len(ours):
        token = ours[i]
        flag = token.split("=", 1)[0]
        width = 2 if token in takes_value else 1
        if flag in OWN_FLAGS or token in DROPPED:
            pass
        elif width == 1 and is_grid_item(token):
            grid_items.append(token)
        else:
            base += ours[i:i + width]
        i += width
    if script and not args.module:
        script = ["--", *script]  # whatever the script's name looks like, it stays the script
    listed = read_list(args.list_file) if args.list_file else None
    grid = parse_grid(grid_items)
    check_size(math.prod(len(values) for _, values in grid) * len(listed or [{}]), args.max_members)
    members = expand(grid, listed)
    return SweepRequest(args, members, varied_keys(members), base + script)


def check_size(count: int, cap: int) -> None:
    """A sweep of more members than --max-members is refused before any is expanded or checked (5,000 members'
    configs took 75 s to check, with nothing printed)."""
    if count > cap:
        raise ConfigError(f"sweep: {count:,} members is more than --max-members {cap:,}: sweep fewer values, or pass "
                          f"--max-members {count} to run them all")


def main(argv: List[str]) -> int:
    request = parse_request(argv)
    args = request.args
    sweep_id = args.name or f"sweep-{datetime.datetime.now():%Y%m%d-%H%M%S}"
    check_run_id(sweep_id)
    sweep_dir = Path(first_member_config(request).output_dir).resolve() / sweep_id
    if sweep_dir.exists():
        raise ConfigError(f"sweep: {sweep_dir} already exists: pick another --name, or re-run its unfinished "
                          f"members with `python -m launcher resume {sweep_dir}`")
    sweep = new_sweep(sweep_id, time.time(), "local", request.keys, request.base_args, request.members)
    sweep["parallel"] = args.parallel
    configs = check_members(sweep, sweep_dir)  # every member's config, before anything exists
    clusters = {cfg.cluster for cfg in configs}
    if len(clusters) > 1:
        raise ConfigError("sweep: cluster cannot vary within one sweep: run one sweep per cluster")
    sweep["cluster"] = clusters.pop()
    if args.wait and sweep["cluster"] != "slurm":
        raise ConfigError("sweep: --wait follows a SLURM job array: add --cluster slurm (a local sweep always waits)")
    if args.dry_run:
        return show_plan(sweep, sweep_dir)
    sweep_dir.mkdir(parents=True)
    write_sweep(sweep_dir, sweep)
    print(f"sweep {sweep_id}: {len(sweep['members'])} members over {', '.join(sweep['keys'])}; folder {sweep_dir}",
          file=sys.stderr, flush=True)
    with hold_sweep(sweep_dir):
        return start(sweep, sweep_dir, configs, [m["index"] for m in sweep["members"]], args.parallel, args.wait)


def start(sweep: Dict[str, Any], sweep_dir: Path, configs: List[Config], todo: List[int], parallel: int,
          wait: bool) -> int:
    """Run the members in todo: here as a queue, or on SLURM as one job array. The caller holds the sweep."""
    if sweep["cluster"] == "slurm":
        from launcher.commands.sweep_slurm import run_array  # submitit, only for SLURM sweeps

        return run_array(sweep, sweep_dir, [(sweep["members"][i], configs[i]) for i in todo], parallel, wait)
    return run_members(sweep, sweep_dir, todo, parallel)


def first_member_config(request: SweepRequest) -> Config:
    """The first member's config as the user wrote it (no sweep folder yet): where the sweep folder goes."""
    args, _ = parse_args(request.base_args + [f"{k}={v}" for k, v in request.members[0].items()])
    return load_config(args.config, config_overrides(args))


def check_members(sweep: Dict[str, Any], sweep_dir: Path) -> List[Config]:
    """Each member's resolved config, exactly as its own launcher will resolve it; the first bad one is the error."""
    split = split_argv(sweep["base_args"], run_parser())
    configs: List[Config] = []
    said = time.monotonic()
    for member in sweep["members"]:
        if time.monotonic() - said >= PROGRESS_S:
            print(f"sweep: checking the members' configs: {len(configs)}/{len(sweep['members'])}", file=sys.stderr,
                  flush=True)
            said = time.monotonic()
        try:
            args, script = parse_args(member_argv(split, member, sweep_dir))
        except SystemExit:  # argparse printed its one line
            raise ConfigError(f"sweep: member {member['run_dir']}: its command line is not valid (see above)") from None
        try:
            configs.append(resolve_config(args, config_overrides(args), script_spec(args, script)))
        except ConfigError as e:
            raise ConfigError(f"sweep: member {member['run_dir']}: {e}") from e
    return configs


def show_plan(sweep: Dict[str, Any], sweep_dir: Path) -> int:
    split = split_argv(sweep["base_args"], run_parser())
    print(f"# sweep {sweep['sweep_id']} in {sweep_dir} ({sweep['cluster']}, {sweep['parallel']} at a time); nothing started")
    for member in sweep["members"]:
        print(" ".join(["python -m launcher", *map(shlex.quote, member_argv(split, member, sweep_dir))]))
    return 0


def find_sweep(run: str, output_dir: str) -> Optional[Path]:
    """RUN as a sweep folder (one holding sweep.json), else None."""
    for candidate in (Path(run), Path(output_dir) / run):
        if (candidate / SWEEP_FILE).is_file():
            return candidate.resolve()
    return None


def resume_sweep(sweep_dir: Path, overrides: List[str], parallel: Optional[int], dry_run: bool,
                 checkpoint_step: Callable[[Path], Optional[int]]) -> int:
    """Re-run the members that did not complete. Here, a member stopped with a usable checkpoint continues
    from it (`resume MEMBER`, checkpoint_step says from which step); any other starts afresh, its earlier
    attempt kept under previous/. On SLURM every unfinished member starts afresh in a new array."""
    if overrides:
        raise ConfigError("resume of a sweep takes no key=value: it re-runs the unfinished members as recorded; "
                          "start a new sweep to change them")
    if parallel is not None and parallel < 1:
        raise ConfigError(f"--parallel {parallel}: run at least one member at a time, e.g. --parallel 2")
    sweep = read_sweep(sweep_dir)
    with hold_sweep(sweep_dir):  # not while the sweep that made it still runs
        todo = unfinished(sweep, sweep_dir)
        if not todo:
            print(f"sweep {sweep['sweep_id']}: no member to re-run ({len(sweep['members'])} completed or still queued)")
            return 0
        steps = {} if sweep["cluster"] == "slurm" else {
            i: checkpoint_step(sweep_dir / sweep["members"][i]["run_dir"]) for i in todo}
        continuing = {i: step for i, step in steps.items() if step is not None}
        names = ", ".join(sweep["members"][i]["run_dir"] + (f" (from step {continuing[i]})" if i in continuing else "")
                          for i in todo)
        if dry_run:
            print(f"would re-run {len(todo)} of {len(sweep['members'])} members of {sweep_dir}: {names}")
            return 0
        configs = check_members(sweep, sweep_dir)
        for i in todo:
            if i not in continuing:
                archive_member(sweep_dir, sweep["members"][i])
        write_sweep(sweep_dir, sweep)
        print(f"sweep {sweep['sweep_id']}: re-running {len(todo)} of {len(sweep['members'])} members: {names}",
              file=sys.stderr, flush=True)
        if sweep["cluster"] == "slurm":
            return start(sweep, sweep_dir, configs, todo, parallel or int(sweep.get("parallel") or 1), wait=False)
        return run_members(sweep, sweep_dir, todo, parallel or int(sweep.get("parallel") or 1), set(continuing))


def unfinished(sweep: Dict[str, Any], sweep_dir: Path) -> List[int]:
    """Members whose run did not complete; not those whose submitted job (a SLURM array task) may still run."""
    queued = [m["index"] for m in sweep["members"] if still_submitted(sweep_dir / m["run_dir"])]
    todo = []
    for member in sweep["members"]:  # the member's own run directory is the truth; sweep.json is bookkeeping
        done = member_result(sweep_dir, member).get("status") == Status.COMPLETED
        member["status"] = Status.COMPLETED if done else Status.RUNNING if member["index"] in queued else Status.PENDING
        if member["status"] == Status.PENDING:
            todo.append(member["index"])
    return todo


def still_submitted(run_dir: Path) -> bool:
    """A member's job that its backend (the run's recorded kind) may still run: queued, running or requeued."""
    if not is_run_dir(run_dir):
        return False
    backend = registry.backend_of_run(run_dir)
    return backend.submits and backend.running(run_dir)
