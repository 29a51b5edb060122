"""A child launcher started ahead of its launch (launcher.api.standby starts it). Stdlib only.

`python -u launcher/worker/bootstrap.py standby KIND IDLE_S PARENT FD` runs this file into a namespace never put in
sys.modules (as forkserver.py) and, from its first line, dies with its caller PARENT (ahead()). The bootstrap then
imports torch and forks the zygote, as for a child launcher started cold (`KIND node launcher ARGS`); once the
zygote is forked the standby imports the launcher's own modules (the zygote holds none of them, as always) and
waits for one line on pipe FD, its launch: the launcher's arguments, the environment, working folder and console
file, and when the caller asked. The caller sends it only where the environment, folder, umask and CPUs are
still the ones it started with (launcher.api.standby). From there it is that child launcher, and no longer dies
with its caller. It exits, quietly, with its caller or after IDLE_S seconds with no launch; nothing was made.
"""

import json
import os
import select
import signal

# What a local launch imports besides torch (the run path from launcher.cli to the agent, the config's omegaconf, the
# backends the registry looks at): ahead, not after the call. One left out is imported by the launch, as before.
LAUNCH_MODULES = ("launcher.cli", "launcher.run", "launcher.backends.dispatch", "launcher.backends.local",
                  "launcher.backends.slurm.backend", "launcher.backends.ray.backend", "launcher.agent.launch",
                  "launcher.runlock", "launcher.objectstore.runrecord", "omegaconf", "encodings.idna",
                  # the job's W&B run (on by default, offline): wandb, and what its init imports every time (its
                  # launch-job inputs: wandb's public API and pydantic models, about 1 CPU-s). Imports change no
                  # environment variable; its service starts with the run, as before.
                  "wandb", "wandb.sdk.launch.inputs.internal")


def ahead(idle_s: str, parent: str, fd: str) -> "object":
    """In the standby's first lines: tied to its caller; the function that awaits its launch."""
    _die_with_parent(signal.SIGKILL)
    if os.getppid() != int(parent):
        os._exit(0)  # the caller ended before the line above took effect
    return lambda: take_launch(float(idle_s), int(fd))


def take_launch(idle_s: float, fd: int) -> "tuple":
    """(the launcher's arguments, the caller's start time) once the launch came; never returns without one."""
    for name in LAUNCH_MODULES:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001  (the launch imports it again, and reports what it finds)
            pass
    line = _read_line(fd, idle_s)
    if not line:
        os._exit(0)  # no launch came
    launch = json.loads(line)
    _die_with_parent(0)  # a launcher now: it goes on if its caller ends, as one started cold does
    os.environ.clear()
    os.environ.update(launch["env"])
    os.chdir(launch["cwd"])
    _console(launch["console"])
    return launch["args"], float(launch["started"])


def _die_with_parent(signum: int) -> None:
    """PR_SET_PDEATHSIG (Linux, the only place a standby is started): signum when the parent ends; 0: none."""
    import ctypes  # every worker's bootstrap imports it too (die_with_parent)

    ctypes.CDLL(None, use_errno=True).prctl(1, signum, 0, 0, 0)


def _read_line(fd: int, idle_s: float) -> bytes:
    """fd's first line (then fd is closed); b"" at its end or after idle_s seconds with none."""
    data = b""
    while not data.endswith(b"\n"):
        readable, _, _ = select.select([fd], [], [], idle_s)
        chunk = os.read(fd, 1 << 20) if readable else b""
        if not chunk:
            data = b""
            break
        data += chunk
    os.close(fd)
    return data


def _console(path: str) -> None:
    """stdout and stderr to the launch's console file, what this process printed before it first (its stdin is
    /dev/null already, as a launcher the caller starts cold has it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    os.lseek(1, 0, os.SEEK_SET)  # stdout and stderr: one unnamed file of the caller's until now
    while True:
        chunk = os.read(1, 1 << 16)
        if not chunk:
            break
        os.write(fd, chunk)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
