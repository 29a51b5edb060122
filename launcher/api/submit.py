"""launcher.launch and launcher.submit: a Python function run on every rank by the launcher's own command.

The function and its arguments are pickled by value (cloudpickle) into a call file (launcher.api.payload), and
the job is `python -m launcher KEY=VALUE... -m launcher.api.worker CALL_FILE` in a process of its own session:
the command line's parser, config, backend registry and launch path, unchanged, for every cluster. A local job
runs in that process (a Ctrl-C in the caller's terminal or notebook does not reach it); a SLURM or Ray one is
submitted by it. The settings are validated here first (launcher.api.settings), so a wrong one is a ValueError
before anything starts.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from launcher.api import calls, standby
from launcher.api.job import LAUNCHER_OUTPUT, RELEASED, Job
from launcher.api.payload import write_payload
from launcher.api.pickling import dumps_call
from launcher.api.settings import overrides_for, resolve
from launcher.backends import registry
from launcher.backends.children import launcher_module_command, workers_kind
from launcher.config.paths import URL_SCHEME
from launcher.config.schema import ScriptConfig
from launcher.errors import SettingError
from launcher.plan import new_run_id
from launcher.runtime import env

WORKER = "launcher.api.worker"


def launch(fn: Callable[..., Any], *args: Any, **settings: Any) -> List[Any]:
    """Run fn(*args) on every rank, with torchrun's environment; the ranks' return values in rank order.

    settings: config keys with '.' as '_' (gpus=2, nodes=1, trainer_steps=10, cluster="slurm"). The launcher's
    console (the ranks' output) is copied to sys.stdout while it runs. A rank that raised, or a job that did not
    complete, is one launcher.LaunchFailed naming the rank that failed first, with its traceback. Ctrl-C cancels
    the job."""
    job = submit(fn, *args, **settings)
    try:
        job.wait(echo=True, completed=True)  # a completed job's values, not its W&B run's end (its launcher's to finish)
    except KeyboardInterrupt:
        job.cancel()
        raise
    finally:
        if job.kind == "local":
            standby.prepare()  # the next launch's launcher, warm (interactive Python only), now that this one's CPUs are free
    return job.result()


def submit(fn: Callable[..., Any], *args: Any, **settings: Any) -> Job:
    """Start fn(*args) on every rank (here, or submitted with cluster="slurm"/"ray") and return its Job at once."""
    if not callable(fn):
        raise TypeError(f"launcher.submit takes a function to run on every rank, not {type(fn).__name__}")
    started = time.time()  # the run's start, for its start-up figures (a standby was started before the call)
    overrides = overrides_for(settings)
    cfg = resolve(overrides, ScriptConfig(path=WORKER, module=True, args=["CALL_FILE"]))
    call, sources = dumps_call(fn, args)  # before anything is made: an unpicklable function fails here
    run_id = cfg.run_id or new_run_id()
    if URL_SCHEME.match(str(cfg.output_dir)):  # the call's payload and result files need a folder (launcher.api.payload)
        raise SettingError(f"output_dir={cfg.output_dir}: launcher.launch and launcher.submit keep a run in a local "
                          f"folder: give one, and checkpoint_dir=\"{str(cfg.output_dir).rstrip('/')}/...\" for the checkpoints")
    output_dir = Path(cfg.output_dir).resolve()
    run_dir = output_dir / run_id
    if os.path.lexists(run_dir):  # the child launcher would refuse it, and the Job would be the other run's
        raise SettingError(existing_run(run_id, run_dir))
    output_dir.mkdir(parents=True, exist_ok=True)
    calls.remove_abandoned(output_dir)  # those of callers killed before they could remove theirs
    staging = calls.make_folder(output_dir, run_id)
    key = secrets.token_bytes(32)
    try:
        call_file = write_payload(staging, {"key": key, "run_id": run_id, "run_dir": str(run_dir),
                                            "sys_path": list(sys.path), "call": call, "sources": sources})
        kind = registry.for_config(cfg).name
        command = [*overrides, f"run_id={run_id}", f"output_dir={output_dir}", "-m", WORKER, str(call_file)]
        release = staging / RELEASED if kind == "local" else None  # the job completed: the launcher makes it
        process = start_launcher(command, staging / LAUNCHER_OUTPUT, started, kind == "local" and workers_kind(cfg) == "script",
                                 {env.RELEASE: str(release)} if release is not None else {})
        calls.record_owners(staging, process.pid)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Job(run_dir, kind, key, cfg.nodes * cfg.gpus, staging, process, release)


def start_launcher(args: List[str], console: Path, started: float, warm: bool, extra_env: Dict[str, str]) -> subprocess.Popen:
    """`python -m launcher ARGS` in a session of its own (this environment and extra_env), its console to the file
    `console`. warm: a job here whose workers fork from a zygote, which the standby launcher (launcher.api.standby)
    runs where there is one."""
    with open(console, "wb") as out:
        spare = standby.take() if warm else None
        process = spare.start(args, str(console), started, extra_env) if spare is not None else None
        if process is None:
            process = subprocess.Popen(launcher_module_command("launcher", *args), stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, cwd=os.getcwd(), start_new_session=True,
                                       env={**os.environ, **extra_env})
    return process


def existing_run(run_id: str, run_dir: Path) -> str:
    """The refusal of run_id= naming a run that exists (running or ended): submit starts new runs only."""
    return (f"run_id={run_id} already names a run ({run_dir}): launcher.launch and launcher.submit start a new run; "
            f"leave run_id out (a new id is made) or give another; `python -m launcher status {run_dir}` shows that one")
