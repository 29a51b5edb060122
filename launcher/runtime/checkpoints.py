"""Checkpoints on disk, without torch: where they are, which verify against their manifest.

The launcher reads these (resume, the hint after a stopped run) and must not pay for importing
torch.distributed.checkpoint (1.4 s of start-up) to list a directory; the built-in trainer
(launcher.trainers.checkpoint.store) writes and loads them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from launcher.runtime import objects, safefs

FORMAT = 1
MANIFEST = objects.MANIFEST
TMP_PREFIX = ".tmp-step-"  # a save in progress; one left by a killed job (or a link planted as one) is cleared
STEP_DIR = objects.STEP
log = logging.getLogger("launcher.checkpoint")
Location = Union[Path, str]  # a local folder, or an object-store URL (launcher.runtime.objects)


def checkpoint_dir(cfg: Any, run_dir: Optional[str]) -> Optional[Location]:
    """checkpoint.dir, else <run_dir>/checkpoints; None when there is nowhere to write."""
    if objects.is_url(cfg.checkpoint.dir):
        return str(cfg.checkpoint.dir).rstrip("/")
    if cfg.checkpoint.dir:
        return Path(cfg.checkpoint.dir).resolve()  # the user's choice, resolved once (as output_dir is)
    return Path(run_dir) / "checkpoints" if run_dir else None


def step_dir(ckpt_dir: Path, step: int) -> Path:
    return ckpt_dir / f"step-{step:08d}"


def list_checkpoints(ckpt_dir: Location) -> List[Any]:
    """Checkpoint directories, newest first (temporary and set-aside ones excluded; on object storage,
    those without a manifest)."""
    if isinstance(ckpt_dir, str):
        return objects.list_checkpoints(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [p for p in ckpt_dir.iterdir() if p.is_dir() and STEP_DIR.match(p.name)]
    return sorted(found, key=lambda p: p.name, reverse=True)


def verify(path: Location) -> Optional[str]:
    """None when every file matches the manifest (size, then sha256), else why not. A folder or an object-store URL."""
    try:
        manifest = read_manifest(path)
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({e.__class__.__name__})"
    if manifest.get("format") != FORMAT:
        return f"format {manifest.get('format')!r}, expected {FORMAT}"
    fs, base = objects.filesystem(path) if isinstance(path, str) else (None, "")
    for name, want in manifest.get("files", {}).items():
        try:
            size, digest = objects.object_size_and_sha256(fs, f"{base}/{name}") if fs is not None \
                else _local_size_and_sha256(path / name, want["size"])
        except FileNotFoundError:
            return f"{name} is missing"
        if size != want["size"]:
            return f"{name} has {size} bytes, expected {want['size']}"
        if digest != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _local_size_and_sha256(file: Path, expected_size: int) -> tuple:
    """A file's size and sha256; the hash only when the size is right (a short file needs no read)."""
    if not file.is_file():
        raise FileNotFoundError(file)
    size = file.stat().st_size
    return size, file_sha256(file) if size == expected_size else ""


def read_manifest(path: Location) -> Dict[str, Any]:
    if isinstance(path, str):
        return objects.read_manifest(path)
    with os.fdopen(safefs.open_regular(str(path / MANIFEST)), encoding="utf-8") as f:  # a FIFO there: refused, not waited on
        data = json.loads(f.read())
    if not isinstance(data, dict):
        raise ValueError("manifest is not an object")
    return data


def latest_valid(ckpt_dir: Location, warn: Callable[[str], None] = log.warning, set_aside: bool = False) -> Optional[Any]:
    """The newest checkpoint that verifies; each bad one newer than it is reported (and set aside)."""
    for path in list_checkpoints(ckpt_dir):
        problem = verify(path)
        if problem is None:
            return path
        warn(f"checkpoint {path} is damaged ({problem}); skipping it and trying the one before")
        if set_aside and isinstance(path, str):
            objects.set_aside(path)
        elif set_aside:
            os.rename(path, path.with_name(f"corrupt-{path.name}"))
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with os.fdopen(safefs.open_regular(str(path)), "rb") as f:  # a FIFO planted there: damaged, not a wait
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
