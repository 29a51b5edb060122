"""Where a worker is: its Python stacks (the faulthandler dump the bootstrap arms), native stacks
(py-spy, where installed) and NCCL's flight recorder, collected into <run_dir>/stacks/ on a hang.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from launcher.runtime import safefs
from launcher.runtime.beats import STACK_SIGNAL, stack_file

log = logging.getLogger("launcher")

DUMP_WAIT_S = 3.0  # how long to wait for the ranks' stack dumps to land
NATIVE_WAIT_S = 15.0  # py-spy --native reads every thread's native stack: seconds per process on a busy box
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})
# A rank whose main thread is inside one of these has not finished setting up its process group.
SETUP_FUNCTIONS = ("init_process_group", "init_device_mesh")
# torch's code where a rank waits for the others: its collectives, backward (DDP's all-reduce), DDP's forward
COLLECTIVE_DIRS = tuple(os.sep + os.path.join("torch", *d) + os.sep for d in (("distributed",), ("autograd",), ("nn", "parallel")))
# torch's DataLoader: a rank blocked in it waits for data, not for a peer (its workers' stacks are their own processes)
DATALOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")
TRAINERS = importlib.util.find_spec("launcher.trainers")  # found, not imported: the built-in trainer is an optional part
TRAINERS_ROOT = str(Path(TRAINERS.origin).resolve().parent.parent) if TRAINERS and TRAINERS.origin else ""  # where trainers/ is
LOADER_WAITS = ("_try_get_data", "_get_data")  # the multi-process loader waiting on its workers' queue
NCCL_PIPE_PREFIX = "nccl-pipe-rank-"  # launcher.plan sets TORCH_NCCL_DEBUG_INFO_PIPE_FILE to stacks/<this>
Frames = List[Tuple[str, int, str]]


class Worker(Protocol):  # read only: the watchdog's RankBeat is frozen
    @property
    def rank(self) -> int: ...
    @property
    def pid(self) -> int: ...
    @property
    def thread(self) -> int: ...


def main_thread_frames(dump: str, thread: int) -> Frames:
    """(file, line, function) of one thread in a faulthandler dump, innermost first."""
    frames: Frames = []
    inside = False
    for line in dump.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if inside:
                break
            inside = int(header.group(2), 16) == thread
            continue
        frame = _FRAME.match(line)
        if inside and frame:
            frames.append((frame["file"], int(frame["line"]), frame["func"]))
    return frames


def where(frames: Frames, worker: Optional[str] = None) -> str:
    """'all_reduce (trainers/train.py:80)': the innermost function, and the innermost line of user code;
    'the data loader, waiting for a batch from its worker processes (select, train.py:22)' inside torch's
    (worker: where the loader's worker process is, when known)."""
    if not frames:
        return "an unknown place (no stack dump)"
    func = next((f for _, _, f in frames if f in SETUP_FUNCTIONS), frames[0][2])  # set-up: name the call the user made
    user = next((f for f in frames if not f[0].startswith(_LIBRARY_DIRS)), frames[0])
    place = f"{func} ({_short(user[0])}:{user[1]})"
    loader = next((f for path, _, f in frames if path.endswith(DATALOADER_FILE)), None)
    if loader is None:
        return place
    waits = "waiting for a batch from its worker processes" if loader in LOADER_WAITS else "loading a batch in the rank itself"
    also = f"; its worker in {worker}" if worker else ""
    return f"the data loader, {waits} ({func}, {_short(user[0])}:{user[1]}{also})"


def in_data_loader(frames: Frames) -> bool:
    return any(path.endswith(DATALOADER_FILE) for path, _, _ in frames)


def in_collective(frames: Frames) -> bool:
    """Whether the main thread waits inside torch's distributed code: a collective, or backward and DDP's all-reduce.
    (A rank whose Python stack ends in its own code is not: its NCCL collectives return at once, so it waits where it
    reads a result, as in .item(), and is told apart by the flight recorder.)"""
    return bool(frames) and any(part in frames[0][0] for part in COLLECTIVE_DIRS)


def in_setup(frames: Frames) -> bool:
    """Whether the main thread is still setting up its process group (init_process_group and below)."""
    return any(func in SETUP_FUNCTIONS for _, _, func in frames)


def _short(path: str) -> str:
    """A path as the user knows it: relative to the working directory or to the import root it came from (the
    built-in trainer's: trainers/x.py, installed or not)."""
    imports = [p for p in sys.path if p and os.path.isabs(p)] + [TRAINERS_ROOT]
    roots = [os.getcwd()] + sorted(imports, key=len, reverse=True)
    for root in roots:
        if root.rstrip(os.sep) and path.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, root)
    return path


def dump_stacks(run_dir: Path, ranks: Sequence[Worker]) -> Dict[int, Frames]:
    """Signal every rank to dump its Python stacks into stacks/rank-<k>.txt; {rank: its main thread's frames}."""
    for r in ranks:
        safefs.open_file(str(stack_file(run_dir, r.rank)), "w", root=str(run_dir)).close()  # only this dump, not an older one
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, STACK_SIGNAL)
    deadline = time.monotonic() + DUMP_WAIT_S
    frames: Dict[int, Frames] = {}
    while time.monotonic() < deadline and len(frames) < len(ranks):
        time.sleep(0.1)
        for r in ranks:
            found = main_thread_frames(_read(stack_file(run_dir, r.rank)), r.thread)
            if found:
                frames[r.rank] = found
    return {r.rank: frames.get(r.rank, []) for r in ranks}


def py_spy() -> Optional[str]:
    """py-spy's executable: on PATH, or beside this interpreter (a venv's bin/ that is not on PATH)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def dump_native(run_dir: Path, ranks: Sequence[Worker]) -> Optional[str]:
    """Native and Python stacks by py-spy into stacks/rank-<k>.native.txt; a line to say when it could not."""
    exe = py_spy()
    if exe is None:
        return "py-spy is not installed: no native stacks (pip install py-spy)"
    procs = []
    for r in ranks:
        out = safefs.open_file(str(run_dir / "stacks" / f"rank-{r.rank}.native.txt"), "w", root=str(run_dir))
        procs.append((r, out, subprocess.Popen([exe, "dump", "--native", "--pid", str(r.pid)], stdout=out,
                                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)))
    deadline = time.monotonic() + NATIVE_WAIT_S
    failed = []
    for r, out, proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.close()
        if proc.returncode != 0:
            failed.append(r.rank)
    return f"py-spy could not read ranks {failed} (see stacks/rank-<k>.native.txt)" if failed else None


def dump_loader_workers(run_dir: Path, ranks: Sequence[Worker]) -> List[Path]:
    """py-spy's Python stacks of these ranks' child processes (their data loader workers, where the stuck read
    is) into stacks/rank-<k>.loader-<pid>.txt; the files written."""
    import psutil

    exe, written = py_spy(), list[Path]()
    if exe is None:
        return written
    for r in ranks:
        try:
            children = psutil.Process(r.pid).children()
        except psutil.Error:
            continue
        for child in children:
            path = run_dir / "stacks" / f"rank-{r.rank}.loader-{child.pid}.txt"
            with safefs.open_file(str(path), "w", root=str(run_dir)) as out, contextlib.suppress(subprocess.TimeoutExpired):
                subprocess.run([exe, "dump", "--pid", str(child.pid)], stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=NATIVE_WAIT_S)
            written.append(path)
    return written


def innermost_frame(py_spy_dump: str) -> Optional[str]:
    """'Slow.__getitem__ (data.py:14)': the first frame of the first thread in a `py-spy dump`."""
    lines = py_spy_dump.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Thread ") and i + 1 < len(lines) and lines[i + 1].startswith("    "):
            return lines[i + 1].strip()
    return None


def trigger_nccl_dumps(run_dir: Path) -> None:
    """Ask NCCL's flight recorder in every rank that has one for its trace (a write to its debug pipe)."""
    for pipe in (run_dir / "stacks").glob(f"{NCCL_PIPE_PREFIX}*.pipe"):
        with contextlib.suppress(OSError):
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(fd, b"1\n")
            finally:
                os.close(fd)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
