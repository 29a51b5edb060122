"""What runs inside each worker process: the built-in trainer, or the user's script via runpy."""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.util
import os
import runpy
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Dict, List, NoReturn

from launcher import beats

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable for the spawn start method."""

    config: Dict[str, Any]
    run_dir: str


def run_worker(spec: WorkerSpec) -> Dict[str, Any]:
    """The elastic agent's entry point in every worker process."""
    _die_with_parent()
    _restore_signal_defaults()
    _reset_start_method()
    if "SLURM_JOB_ID" in os.environ:
        # SLURM's warning signal reaches every process of the step: until the trainer (trainers.stop)
        # or a user script installs a handler, it must not kill the worker (SIG_DFL would).
        # Elsewhere a script sees what it would under torchrun.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    _merge_stderr_into_stdout()
    _apply_thread_count()
    _register_heartbeat(spec)
    try:
        return _run(spec)
    except SystemExit as e:
        if e.code in (0, None):
            raise  # torch's wrapper treats a clean exit as success
        _exit_now(e.code if isinstance(e.code, int) else 1)
    except KeyboardInterrupt:
        _exit_now(128 + signal.SIGINT)
    except BaseException as e:
        traceback.print_exc()  # torch's process wrapper only queues it; users want it in the log
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(e)  # the agent reads this to name the error
        _exit_now(1)
    finally:
        beats.disarm()  # teardown after the last step is not a hang


def _run(spec: WorkerSpec) -> Dict[str, Any]:
    script = spec.config["script"]
    if script["path"] is not None:
        return run_script(script["path"], bool(script["module"]), list(script["args"]))
    from launcher.config import from_dict
    from trainers.stop import STOP
    from trainers.train import train

    result = train(from_dict(spec.config), spec.run_dir)
    if STOP.signum is not None:  # stopped by Ctrl-C/SIGTERM after a checkpoint: the agent is shutting down
        _exit_now(128 + STOP.signum)
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


def _register_heartbeat(spec: WorkerSpec) -> None:
    """Arm the node watchdog's view of this rank (heartbeat file, stack dump on signal) when it is on."""
    timeout_s = float(spec.config.get("watchdog", {}).get("timeout_s", 0))
    os.environ[beats.TIMEOUT_ENV] = f"{timeout_s:g}"  # so scripts can set a process-group timeout above it
    if timeout_s > 0:
        beats.register(spec.run_dir, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")))


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


def _exit_now(code: int) -> "NoReturn":
    """Leave without running destructors: a process group whose peer is gone can block forever in
    its destructor, which would keep a failed or interrupted worker alive (and the job hung)."""
    beats.disarm()
    _release_multiprocessing_resources()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _release_multiprocessing_resources() -> None:
    """What a normal exit does first, minus anything that can block: unlink this process's named
    semaphores (a DataLoader's queues under the spawn or forkserver method) and stop its daemonic
    children (DataLoader workers). Skipped, the launcher's resource tracker printed 'leaked
    semaphore objects' after the job's one-line error."""
    try:
        multiprocessing.util._run_finalizers(0)  # priority >= 0: closes and unlinks, never joins
        for child in multiprocessing.active_children():
            if child.daemon:
                child.terminate()
    except Exception:  # best effort on the way out; the exit code matters more
        pass


def _reset_start_method() -> None:
    """A spawned worker inherits the agent's 'spawn' as its default start method; under torchrun a
    script starts with none chosen (the platform's default), and so do its DataLoader workers."""
    multiprocessing.set_start_method(None, force=True)


def _restore_signal_defaults() -> None:
    """A forked worker inherits the agent's handlers (torch raises SignalException from them, which
    never runs while a rank blocks in a collective): give it a fresh interpreter's dispositions."""
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
