"""RUN as the `logs`, `status` and `cancel` commands take it: a run directory, a run id under --output-dir,
or a scheduler's job id that a run recorded in its job.json; and the run's backend (its recorded kind)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable, List, Optional, Tuple, Union

from launcher.backends import registry
from launcher.backends.base import Backend, read_record
from launcher.errors import ConfigError
from launcher.objectstore.runrecord import fetch_run, run_url
from launcher.runindex import is_run_dir
from launcher.usage import OneLineParser

RUN_HELP = "run directory, run id under --output-dir, or SLURM job id"
OUTPUT_DIR_HELP = "where run ids and job ids are looked up (default launcher_runs)"


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument("--output-dir", default="launcher_runs", metavar="DIR", help=OUTPUT_DIR_HELP)


def parse_run_args(command: str, description: str, argv: List[str],
                   more: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> Union[argparse.Namespace, int]:
    """`python -m launcher COMMAND RUN [--output-dir DIR] ...`: the arguments, or argparse's exit code."""
    p = OneLineParser(prog=f"python -m launcher {command}", description=description)
    add_run_arguments(p)
    if more is not None:
        more(p)
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)


def locate_run(run: str, output_dir: str) -> Path:
    """RUN is a run directory, a run id under output_dir, or a job id one of them recorded (job.json); or a run on
    object storage (URL/RUN_ID, or RUN_ID under an --output-dir URL), its record read back into a private folder."""
    remote = run_url(run, output_dir)
    if remote:
        return fetch_run(remote)
    for candidate in (Path(run), Path(output_dir) / run):
        if candidate.is_dir() and is_run_dir(candidate):
            return candidate.resolve()
        if (candidate / "sweep.json").is_file() or (candidate / "runs").is_dir():
            raise ConfigError(f"{candidate} holds several runs (a sweep, compare or scale): pass one of them; "
                              f"`python -m launcher ls {candidate}` lists them")
    if run.isdigit():
        for job_file in sorted(Path(output_dir).glob("*/job.json")):
            if str(read_record(job_file).get("job_id")) == run:
                return job_file.parent.resolve()
    raise ConfigError(f"no run '{run}': pass a run directory, a run id under {output_dir}/ or a SLURM job id "
                      f"(`python -m launcher ls {output_dir}` lists them); --output-dir DIR if the runs are elsewhere")


def locate_backend(run: str, output_dir: str) -> Tuple[Path, Backend]:
    run_dir = locate_run(run, output_dir)
    return run_dir, registry.backend_of_run(run_dir)
