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
import tempfile
from pathlib import Path
from typing import Any, Callable, List

from launcher.api.job import LAUNCHER_OUTPUT, Job
from launcher.api.payload import write_payload
from launcher.api.settings import overrides_for, resolve
from launcher.backends import registry
from launcher.backends.children import launcher_module_command
from launcher.config.paths import URL_SCHEME
from launcher.config.schema import ScriptConfig
from launcher.errors import SettingError
from launcher.plan import new_run_id

WORKER = "launcher.api.worker"


def launch(fn: Callable[..., Any], *args: Any, **settings: Any) -> List[Any]:
    """Run fn(*args) on every rank, with torchrun's environment; the ranks' return values in rank order.

    settings: config keys with '.' as '_' (gpus=2, nodes=1, trainer_steps=10, cluster="slurm"). The launcher's
    console (the ranks' output) is copied to sys.stdout while it runs. A rank that raised, or a job that did not
    complete, is one launcher.LaunchFailed naming the rank that failed first, with its traceback. Ctrl-C cancels
    the job."""
    job = submit(fn, *args, **settings)
    try:
        job.wait(echo=True)
    except KeyboardInterrupt:
        job.cancel()
        raise
    return job.result()


def submit(fn: Callable[..., Any], *args: Any, **settings: Any) -> Job:
    """Start fn(*args) on every rank (here, or submitted with cluster="slurm"/"ray") and return its Job at once."""
    if not callable(fn):
        raise TypeError(f"launcher.submit takes a function to run on every rank, not {type(fn).__name__}")
    import cloudpickle

    overrides = overrides_for(settings)
    cfg = resolve(overrides, ScriptConfig(path=WORKER, module=True, args=["CALL_FILE"]))
    call = cloudpickle.dumps((fn, args))  # before anything is made: an unpicklable function fails here
    run_id = cfg.run_id or new_run_id()
    if URL_SCHEME.match(str(cfg.output_dir)):  # the call's payload and result files need a folder (launcher.api.payload)
        raise SettingError(f"output_dir={cfg.output_dir}: launcher.launch and launcher.submit keep a run in a local "
                          f"folder: give one, and checkpoint_dir=\"{str(cfg.output_dir).rstrip('/')}/...\" for the checkpoints")
    output_dir = Path(cfg.output_dir).resolve()
    run_dir = output_dir / run_id
    output_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".call-{run_id}-", dir=output_dir))  # 0700, ours; `ls` skips dot folders
    key = secrets.token_bytes(32)
    try:
        call_file = write_payload(staging, {"key": key, "run_id": run_id, "run_dir": str(run_dir),
                                            "sys_path": list(sys.path), "call": call})
        argv = launcher_module_command("launcher", *overrides, f"run_id={run_id}", f"output_dir={output_dir}",
                                       "-m", WORKER, str(call_file))
        with open(staging / LAUNCHER_OUTPUT, "wb") as out:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       cwd=os.getcwd(), start_new_session=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    kind = registry.for_config(cfg).name
    return Job(run_dir, kind, key, cfg.nodes * cfg.gpus, staging, process)
