"""What runs inside each worker process: the built-in trainer, or the user's script via runpy."""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable for the spawn start method."""

    config: Dict[str, Any]
    run_dir: str


def run_worker(spec: WorkerSpec) -> Dict[str, Any]:
    """The elastic agent's entry point in every worker process."""
    _die_with_parent()
    # SLURM's warning signal reaches every process of the step. A forked worker would run the
    # agent's handler (submitit's requeue); the trainer installs its own (trainers.stop), and a
    # user script may too: until then it must not kill the worker.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    _merge_stderr_into_stdout()
    _apply_thread_count()
    try:
        return _run(spec)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()  # torch's process wrapper only queues it; users want it in the log
        sys.stderr.flush()
        raise


def _run(spec: WorkerSpec) -> Dict[str, Any]:
    script = spec.config["script"]
    if script["path"] is not None:
        return run_script(script["path"], bool(script["module"]), list(script["args"]))
    from launcher.config import from_dict
    from trainers.stop import STOP
    from trainers.train import train

    result = train(from_dict(spec.config), spec.run_dir)
    STOP.exit_if_stopped()  # stopped by Ctrl-C/SIGTERM after a checkpoint: the agent is shutting down
    return result


def run_script(path: str, module: bool, args: List[str]) -> Dict[str, Any]:
    """Run a torchrun-style script as `python script.py args` / `python -m module args` would."""
    rank = int(os.environ.get("RANK", "0"))
    if module:
        sys.argv = [path] + args
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        runpy.run_module(path, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(path)
        sys.argv = [path] + args  # as typed, like `python train.py`
        sys.path.insert(0, os.path.dirname(script))
        _exec_as_main(script)
    sys.stdout.flush()
    return {"rank": rank, "exit_code": 0}


def _exec_as_main(script: str) -> None:
    """What `python script.py` does: a fresh __main__ module with __file__ set, the code run in it.

    (runpy.run_path would also rewrite sys.argv[0] to the absolute path.)
    """
    import types

    with open(script, "rb") as f:
        code = compile(f.read(), script, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=script, __builtins__=__builtins__, __spec__=None, __package__=None, __cached__=None)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _die_with_parent() -> None:
    """Linux: if the agent dies (even by SIGKILL), the kernel kills this worker: no orphans."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent already died before prctl took effect
            os._exit(1)
    except OSError:
        pass


def _apply_thread_count() -> None:
    """A forked worker inherits torch already imported, so OMP_NUM_THREADS set afterwards is not read:
    apply it explicitly, as a fresh interpreter under torchrun would."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))


def _merge_stderr_into_stdout() -> None:
    """One ordered log per rank: stderr goes where stdout goes (the rank's log file)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(sys.stdout.fileno(), sys.stderr.fileno())
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    except (OSError, ValueError, AttributeError):
        pass
