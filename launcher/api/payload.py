"""The files between a launch()/submit() caller and its ranks: the pickled call, and each rank's signed outcome.

The call (function, arguments, the caller's sys.path and a fresh key) goes to a 0700 folder of the caller's own
beside the run directory, as a 0600 file: only the job's user reads the key. Each rank's return value, or its
traceback, comes back as `results/rank-K.result` or `rank-K.error` in the run directory, written to a temporary
name and renamed (a reader never sees half a file), through no symlink (launcher.runtime.safefs), and signed:
HMAC-SHA256 under the key, over the run id, the rank, the kind and the bytes. A run directory may be writable
by others (docs/security.md): a file without this job's MAC is refused before anything of it is unpickled.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import stat
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.errors import LaunchFailed
from launcher.runtime import safefs

MAGIC = b"launcher-api-1\n"
PAYLOAD = "call.pkl"
RESULTS = "results"
KINDS = ("result", "error")


def write_payload(staging: Path, call: Dict[str, Any]) -> Path:
    """call (plain values; the function and its arguments already pickled by launcher.api.submit) into staging."""
    path = staging / PAYLOAD
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pickle.dumps(call))
    return path


def read_payload(path: str) -> Dict[str, Any]:
    """The call, in a rank: only from a folder of this user that nobody else may write (the key is in it)."""
    folder = os.stat(os.path.dirname(os.path.abspath(path)))
    if folder.st_uid != os.getuid() or folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path}: its folder is not this user's own (0700): the call is not loaded")
    with open(path, "rb", opener=lambda p, flags: os.open(p, flags | os.O_NOFOLLOW)) as f:
        call = pickle.load(f)
    assert isinstance(call, dict), type(call)
    return call


def mac(key: bytes, run_id: str, rank: int, kind: str, data: bytes) -> bytes:
    return hmac.new(key, f"{run_id}/{rank}/{kind}\0".encode() + data, hashlib.sha256).digest()


def outcome_path(run_dir: str, rank: int, kind: str) -> str:
    return os.path.join(run_dir, RESULTS, f"rank-{rank}.{kind}")


def write_outcome(call: Dict[str, Any], rank: int, kind: str, data: bytes) -> None:
    """A rank's signed outcome, renamed into place once whole."""
    run_dir, final = call["run_dir"], outcome_path(call["run_dir"], rank, kind)
    temporary = f"{os.path.dirname(final)}/.rank-{rank}.{kind}.{os.getpid()}.tmp"
    signed = MAGIC + mac(call["key"], call["run_id"], rank, kind, data) + data
    fd = safefs.open_fd(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, root=run_dir)
    with os.fdopen(fd, "wb") as f:
        f.write(signed)
        f.flush()
        os.fsync(f.fileno())  # a SLURM or Ray node may die right after: the rename must not publish an empty file
    safefs.replace(temporary, final, root=run_dir)


def read_outcome(key: bytes, run_id: str, run_dir: str, rank: int, kind: str) -> Optional[bytes]:
    """A rank's outcome bytes once their MAC checks out; None where the rank wrote none; LaunchFailed if forged."""
    path = outcome_path(run_dir, rank, kind)
    try:
        signed = safefs.read_bytes(path, root=run_dir)
    except FileNotFoundError:
        return None
    except (OSError, safefs.PlantedLinkError) as e:
        raise LaunchFailed(f"{path} cannot be read ({e}): the rank's {kind} is lost; see the rank's log",
                           rank=rank, run_dir=run_dir) from None
    head = len(MAGIC) + hashlib.sha256().digest_size
    data = signed[head:]
    if not signed.startswith(MAGIC) or not hmac.compare_digest(signed[len(MAGIC):head], mac(key, run_id, rank, kind, data)):
        raise LaunchFailed(f"{path} is not signed by this job (someone else wrote it, or another job's file was put "
                           f"there): refused without loading it (docs/security.md)", rank=rank, run_dir=run_dir)
    return data


def load_result(key: bytes, run_id: str, run_dir: str, rank: int) -> Any:
    data = read_outcome(key, run_id, run_dir, rank, "result")
    if data is None:
        raise LaunchFailed(f"rank {rank} returned no value ({outcome_path(run_dir, rank, 'result')} is missing): "
                           f"see its log, logs/rank-{rank}.log", rank=rank, state="COMPLETED", run_dir=run_dir)
    return pickle.loads(data)  # signed by a rank of this job: its own value
