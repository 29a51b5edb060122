"""`python -m launcher resume RUN [KEY=VALUE...]`: continue a run from its newest good checkpoint, or re-run a
sweep folder's unfinished members.

A sweep's side lives in launcher.commands.sweep.

The run keeps its directory and its recorded config.yaml; overrides may change how long and how
it runs (trainer.steps, checkpointing, restarts, W&B), never what the checkpoint holds.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from launcher.backends import dispatch
from launcher.clock import process_start_time
from launcher.commands.sweep import find_sweep, resume_sweep
from launcher.config.schema import Config, load_config
from launcher.errors import ConfigError
from launcher.logs import setup_launcher_logging
from launcher.objectstore import runrecord
from launcher.objectstore.staging import name_left_behind
from launcher.rundir import archive_rank_logs
from launcher.usage import OneLineParser
from launcher.runtime.checkpoints import Location, checkpoint_dir, latest_valid, read_manifest

# Keys a resumed run may change; everything else is fixed by what the checkpoint holds.
CHANGEABLE = ("trainer.steps", "trainer.lr", "trainer.log_every", "checkpoint.", "launcher.", "rdzv.", "wandb.")
# Why the others cannot change, by key prefix (first match wins).
FIXED = (
    ("model.", "the checkpoint holds a model of the recorded shape"),
    ("trainer.strategy", "the checkpoint's parameter and optimizer layout belong to the recorded strategy"),
    ("nodes", "data positions and RNG states are saved per rank for the recorded world size"),
    ("gpus", "data positions and RNG states are saved per rank for the recorded world size"),
    ("data.", "the saved data position counts batches of the recorded dataset and batch size"),
    ("seed", "the data order and random streams follow the recorded seed"),
    ("run_id", "a resumed run stays in its own run directory"),
    ("output_dir", "a resumed run stays in its own run directory"),
    ("script.", "resume continues the built-in trainer of the recorded run"),
)


def build_parser() -> argparse.ArgumentParser:

    p = OneLineParser(
        prog="python -m launcher resume",
        description="Continue a stopped, failed or finished run from its newest good checkpoint, in the same run directory.",
        epilog="examples:\n  python -m launcher resume launcher_runs/20261122-003218-2f88b8\n"
               "  python -m launcher resume 20261122-003218-2f88b8 trainer.steps=2000 --max-restarts 2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", metavar="RUN", help="a run directory, or a run id under output_dir (default launcher_runs/)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=f"changes allowed on resume: {', '.join(k + ('*' if k.endswith('.') else '') for k in CHANGEABLE)}")
    p.add_argument("--max-restarts", type=int, metavar="K", help="restart the workers up to K times when one fails")
    p.add_argument("--output-dir", metavar="DIR", default="launcher_runs", help="where to look up a run id (default launcher_runs)")
    p.add_argument("--dry-run", action="store_true", help="print what would resume and from which checkpoint; start nothing")
    p.add_argument("--parallel", type=int, metavar="N", help="a sweep: members at a time (default: as the sweep ran)")
    return p


def main(argv: List[str]) -> int:
    # usage errors: launcher.usage.with_error_contract turns SystemExit into the exit code
    args = build_parser().parse_intermixed_args(argv)
    sweep_dir = find_sweep(args.run, args.output_dir)
    if sweep_dir is not None:  # a sweep folder: re-run its unfinished members
        if args.max_restarts is not None:
            raise ConfigError("resume of a sweep re-runs its members as recorded: drop --max-restarts")
        return resume_sweep(sweep_dir, list(args.overrides), args.parallel, args.dry_run, checkpoint_step)
    if args.parallel is not None:
        raise ConfigError("--parallel applies to a sweep folder: drop it to resume one run")
    remote = runrecord.run_url(args.run, args.output_dir)  # output_dir=s3://...: the record is read back from there
    if remote:
        name_left_behind(remote)  # a killed launcher's staging folder, with what it had not uploaded
    run_dir = runrecord.fetch_run(remote) if remote else find_run(args.run, args.output_dir)
    overrides = list(args.overrides) + ([f"launcher.max_restarts={args.max_restarts}"] if args.max_restarts is not None else [])
    check_overrides(overrides)
    cfg, checkpoint, step = resolve(run_dir, overrides, remote.rpartition("/")[0] if remote else None)
    if args.dry_run:
        print(f"would resume {remote or run_dir} from {checkpoint} (step {step}) to step {cfg.trainer.steps}")
        return 0
    return launch(cfg, run_dir, checkpoint, step, earlier=run_dir if remote else None)


def checkpoint_step(run_dir: Path) -> Optional[int]:
    """The step a stopped built-in-trainer run would resume from, or None where it cannot resume (a sweep's member)."""
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "plan.json").is_file():
        return None
    try:
        return resolve(run_dir, [])[2]
    except ConfigError:  # a script, no usable checkpoint, or already at its last step: it starts afresh
        return None


def find_run(run: str, output_dir: str) -> Path:
    """RUN as a directory, else as a run id under output_dir; it must be one of our run directories."""
    candidates = [Path(run), Path(output_dir) / run]
    run_dir = next((p for p in candidates if p.is_dir()), None)
    if run_dir is None:
        raise ConfigError(f"no run '{run}': pass a run directory or a run id under {output_dir}/ (see `ls {output_dir}`)")
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "plan.json").is_file():
        raise ConfigError(f"{run_dir} is not a launcher run directory (no config.yaml and plan.json): "
                          f"pass <output_dir>/<run_id>, as printed at the end of a run")
    return run_dir.resolve()


def check_overrides(overrides: List[str]) -> None:
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not key=value: write it like trainer.steps=500")
        key = item.split("=", 1)[0]
        if any(key == k or (k.endswith(".") and key.startswith(k)) for k in CHANGEABLE):
            continue
        reason = next((why for prefix, why in FIXED if key == prefix or key.startswith(prefix)), None)
        allowed = ", ".join(k + ("*" if k.endswith(".") else "") for k in CHANGEABLE)
        raise ConfigError(f"{key} cannot change on resume ({reason or 'not a key a resumed run may change'}): "
                          f"start a new run for that; resume accepts {allowed}")


def resolve(run_dir: Path, overrides: List[str], output_dir: Optional[str] = None) -> Tuple[Config, Location, int]:
    """The recorded config with the overrides, the checkpoint to start from, and its step. output_dir: where the run
    is recorded when that is not run_dir's folder (an object-store URL, its record read back into run_dir)."""

    cfg = load_config(str(run_dir / "config.yaml"),
                      overrides + [f"output_dir={output_dir or run_dir.parent}", f"run_id={run_dir.name}"],
                      label="the run's recorded config")
    if cfg.script.path is not None:
        raise ConfigError(f"run {run_dir.name} ran your script {cfg.script.path}: resume continues the built-in "
                          "trainer; start your script again with its own resume logic")
    ckpt_dir = checkpoint_dir(cfg, str(run_dir))
    assert ckpt_dir is not None
    checkpoint = latest_valid(ckpt_dir, warn=lambda message: print(f"warning: {message}", file=sys.stderr))
    if checkpoint is None:
        raise ConfigError(f"run {run_dir.name} has no usable checkpoint in {ckpt_dir}: "
                          "start a new run (checkpoint.every_steps sets how often runs save)")
    step = int(read_manifest(checkpoint)["step"])
    if step >= cfg.trainer.steps:
        raise ConfigError(f"run {run_dir.name} is already at step {step} of trainer.steps={cfg.trainer.steps}: "
                          f"to train longer, resume with trainer.steps={2 * step}")
    return cfg, checkpoint, step


def launch(cfg: Config, run_dir: Path, checkpoint: Location, step: int, earlier: Optional[Path] = None) -> int:
    """The recorded run's backend (a simulated multi-node run gets its nodes again), in its own directory (for a
    record on object storage, a new staging folder that gets the record read back, `earlier`, first)."""

    def take_over(locked: Path) -> None:
        if earlier is not None:
            runrecord.restore(earlier, locked)
        log = setup_launcher_logging(locked / "logs" / "launcher.log")
        kept = archive_rank_logs(locked, f"before-resume-{len(list((locked / 'logs').glob('before-resume-*'))) + 1}")
        log.info(f"resuming run {run_dir.name} from {os.path.basename(str(checkpoint))} (step {step}) to step {cfg.trainer.steps}"
                 + (f"; the earlier rank logs are in {kept}" if kept else ""))

    return dispatch.launch(cfg, process_start_time(), continuing=take_over)
