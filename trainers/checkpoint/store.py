"""Checkpoints of the built-in trainer: atomic on disk, verified on load, never unpickling arbitrary objects.

Layout of one checkpoint, ``<dir>/step-00000042/``:
  .metadata, __<r>_0.distcp   model and optimizer through torch.distributed.checkpoint (DCP), so
                              sharded strategies (FSDP, tensor, pipeline) save and load their shards
  rank-<r>.pt                 what belongs to one rank: data position, RNG states (weights-only)
  manifest.json               written last: size and sha256 of every file above, step, world size

Saving writes everything into ``.tmp-step-N``, fsyncs, then renames it: a job killed mid-save
leaves at most a temporary directory, which loading ignores. Loading takes the newest checkpoint
whose files match its manifest and sets aside (``corrupt-step-N``) any newer one that does not.

API (collective calls: every rank calls them at the same step):
  save(ckpt_dir, model, optimizer, position, keep)  -> the checkpoint directory
  write(ckpt_dir, state, payload, position, keep)   the same from a copy (trainers.checkpoint.background)
  load_latest(ckpt_dir, model, optimizer)          -> Resume (position, this rank's RNG) or None
and, for the launcher (no process group, no torch): launcher.runtime.checkpoints.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import pickle
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

import torch
import torch.distributed as dist

from launcher.runtime import safefs, torch_private
from launcher.runtime import objects
from launcher.runtime.checkpoints import FORMAT, MANIFEST, TMP_PREFIX, file_sha256, latest_valid, list_checkpoints, step_dir
from launcher.runtime.diskspace import DiskFullError, disk_full, free_space, nearly_full
from ..faults.inject import maybe_delay_save

log = logging.getLogger("launcher.checkpoint")


class CheckpointError(RuntimeError):
    """A checkpoint that verifies but cannot be loaded: refused content, or another job's layout."""


@dataclass(frozen=True)
class Position:
    """Where training stands: the same on every rank at a step boundary."""

    step: int  # optimizer steps done
    epoch: int  # the sampler epoch in progress
    batch: int  # batches of that epoch already consumed
    loss: float = 0.0  # the last step's mean loss, so a run resumed at its end still reports it
    wandb_run_id: Optional[str] = None  # so a resumed run logs into the same W&B run
    # the epoch's samples consumed by all ranks together: where a job of another world size (elastic
    # membership) picks the epoch up, none dropped or repeated; None in checkpoints from before it was kept
    samples: Optional[int] = None
    world_size: Optional[int] = None  # the job's ranks when it was saved: the RNG states are per rank


@dataclass(frozen=True)
class Resume:
    position: Position
    rng: Optional[Dict[str, Any]]  # this rank's RNG states, for restore_rng at the resumed data position (None: the
    # checkpoint is of another world size)
    path: Union[Path, str]  # a folder, or a URL (launcher.runtime.objects)


# --- saving -----------------------------------------------------------------------------------

def save(ckpt_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: Position, keep: int) -> Path:
    """Write a checkpoint of `position` atomically; keep the newest `keep`. Collective."""
    return write(ckpt_dir, state_dict(model, optimizer), rank_payload(position), position, keep)


def state_dict(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, Any]:
    """What DCP saves: the model's and the optimizer's state (live tensors: copy them to write later)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def rank_payload(position: Position) -> Dict[str, Any]:
    """What belongs to this rank alone, captured now: the data position and every RNG state."""
    return {"position": asdict(position), "rng": capture_rng()}


_MADE: Set[str] = set()  # checkpoint folders this process has saved into


def write(ckpt_dir: Path, state: Dict[str, Any], payload: Dict[str, Any], position: Position, keep: int,
          group: Optional[Any] = None) -> Path:
    """Write state and this rank's payload as the checkpoint of `position`, atomically. Collective over group.

    group: the process group to meet on (a background writer has its own, so its collectives never
    interleave with the training loop's); None = the default group.
    """
    import torch.distributed.checkpoint as dcp

    rank = this_rank()
    final, tmp = step_dir(ckpt_dir, position.step), ckpt_dir / f"{TMP_PREFIX}{position.step:08d}"
    if rank == 0:
        if str(ckpt_dir) in _MADE and not ckpt_dir.is_dir():  # never re-made: a run directory deleted mid-run stays gone
            raise FileNotFoundError(f"the checkpoint folder {ckpt_dir} is gone (deleted or moved while the job ran)")
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        _MADE.add(str(ckpt_dir))
        safefs.remove_own(str(tmp))  # left by a job killed mid-save, or a link planted in its place
        safefs.make_dirs(str(tmp), root=str(ckpt_dir))  # checkpoints/ itself a planted link: refused
    barrier(group)
    try:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(tmp), sync_files=True), process_group=group)
        _save_rank_file(tmp / f"rank-{rank}.pt", payload)
        maybe_delay_save(rank, position.step)
        barrier(group)
        if rank == 0:
            _publish(tmp, final, position)
    except BaseException as e:  # DCP's CheckpointException is a BaseException
        # torch's writer reports ENOSPC as a RuntimeError: judged by the space left, before anyone cleans up
        full, free = disk_full(e) is not None or nearly_full(ckpt_dir), free_space(ckpt_dir)
        if getattr(e, "failures", None) is not None:  # DCP's failures reach every rank together: decide alike
            barrier(group)
        if not full:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # any rank: the others stop with this one (the agent's doing)
        kept = "the previous checkpoint is intact" if list_checkpoints(ckpt_dir) else "no earlier checkpoint was saved"
        raise DiskFullError(errno.ENOSPC, f"disk full while saving checkpoint step {position.step} to {ckpt_dir} "
                            f"({free} free there); {kept}: free space, "
                            f"lower checkpoint.keep or point checkpoint.dir elsewhere") from e
    if rank == 0:
        prune(ckpt_dir, keep)
    barrier(group)
    return final


def _save_rank_file(path: Path, payload: Dict[str, Any]) -> None:
    with open(path, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())


def _publish(tmp: Path, final: Path, position: Position) -> None:
    """Manifest last, then one rename: a checkpoint directory is complete or absent."""
    files = sorted(p for p in tmp.iterdir() if p.is_file())
    manifest = {
        "format": FORMAT,
        "step": position.step,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "position": asdict(position),
        "files": {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in files},
    }
    with open(tmp / MANIFEST, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a repeated attempt): swap, never merge
        old = final.with_name(f".old-{final.name}")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)


def prune(ckpt_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints."""
    for path in list_checkpoints(ckpt_dir)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


# --- finding and verifying --------------------------------------------------------------------

# --- loading ----------------------------------------------------------------------------------

def load_latest(ckpt_dir: Union[Path, str], model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Optional[Resume]:
    """Load the newest good checkpoint into model and optimizer; None when there is none. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    chosen: List[Optional[str]] = [None]
    if this_rank() == 0:
        path = latest_valid(ckpt_dir, warn=_warn_everywhere, set_aside=True)
        chosen[0] = str(path) if path else None
    if dist.is_initialized():
        dist.broadcast_object_list(chosen, src=0)  # between our own ranks: they agree on one checkpoint
    if chosen[0] is None:
        return None
    path, rank_file, read_rank, reader = _open_checkpoint(chosen[0])
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: Dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    try:
        dcp.load(state, storage_reader=reader, planner=WeightsOnlyLoadPlanner())
        payload = torch.load(read_rank(), map_location="cpu", weights_only=True)
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(f"cannot load {path}: {root_message(e)}") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    position = Position(**payload["position"])
    world = dist.get_world_size() if dist.is_initialized() else 1
    same_world = position.world_size in (None, world) and rank_file == f"rank-{this_rank()}.pt"
    # another world size: these RNG states were another rank's (the data order needs none: it is seeded per epoch)
    return Resume(position=position, rng=payload["rng"] if same_world else None, path=path)


def _open_checkpoint(location: str) -> Tuple[Union[Path, str], str, Callable[[], Any], Any]:
    """The checkpoint, the rank file this rank loads, how to open it, and DCP's reader (a folder or a URL)."""
    names = [f"rank-{this_rank()}.pt", "rank-0.pt"]  # a job grown since (elastic): the position is every rank's
    if objects.is_url(location):
        fs, root = objects.filesystem(location)
        name = next((n for n in names if fs.exists(f"{root}/{n}")), None)
        path: Union[Path, str] = location
        read: Callable[[], Any] = lambda: io.BytesIO(fs.cat_file(f"{root}/{name}"))  # noqa: E731
        reader = SafeFsspecReader(location, **objects.options(location))
    else:
        path = Path(location)
        name = next((n for n in names if (path / n).is_file()), None)
        read = lambda: path / str(name)  # noqa: E731
        reader = SafeFileSystemReader(str(path))
    if name is None:
        raise CheckpointError(f"{path} has no rank-0.pt: it is incomplete or not a checkpoint of this trainer")
    return path, name, read, reader


def root_error(error: BaseException) -> BaseException:
    """DCP wraps each rank's exception: the innermost one, which says what happened."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        error = next(iter(failures.values()))
        if isinstance(error, tuple):  # (exception, traceback) in some torch versions
            error = error[0]
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def root_message(error: BaseException) -> str:
    """The first line of the innermost exception, with its class."""
    error = root_error(error)
    text = str(error).strip().splitlines()
    return f"{error.__class__.__name__}: {text[0] if text else ''}"


def _warn_everywhere(message: str) -> None:
    """Rank 0's stdout is its log and the console: a skipped checkpoint must be seen."""
    print(f"warning: {message}", flush=True)


def _safe_dcp_classes() -> Dict[tuple, Any]:
    """What a DCP .metadata file may contain; anything else is refused, not constructed."""
    import collections
    import pathlib

    import torch.distributed.checkpoint.metadata as md

    allowed: Dict[tuple, Any] = {}
    for module in (md,):
        for name in dir(module):
            obj = getattr(module, name)
            if isinstance(obj, type) and obj.__module__ == module.__name__:
                allowed[(module.__name__, name)] = obj
    storage_info = torch_private.checkpoint_storage_info_class()
    allowed[(storage_info.__module__, storage_info.__name__)] = storage_info
    allowed[("torch", "Size")] = torch.Size
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    allowed[("pathlib", "PosixPath")] = pathlib.PosixPath  # the checkpoint id DCP records
    allowed[("pathlib", "PurePosixPath")] = pathlib.PurePosixPath
    layout_name, layout = torch_private.serialization_layout_global()
    allowed[layout_name] = layout
    for name in dir(torch):
        if isinstance(getattr(torch, name), torch.dtype):
            allowed[("torch", name)] = getattr(torch, name)
    return allowed


class _RestrictedUnpickler(pickle.Unpickler):
    _allowed: Optional[Dict[tuple, Any]] = None

    def find_class(self, module: str, name: str) -> Any:
        if _RestrictedUnpickler._allowed is None:
            _RestrictedUnpickler._allowed = _safe_dcp_classes()
        if (module, name) in _RestrictedUnpickler._allowed:
            return _RestrictedUnpickler._allowed[(module, name)]
        raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}, which is not allowed")


def _make_reader_class() -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        """DCP's reader, but .metadata is unpickled with an allow-list of DCP's own classes."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            path = torch_private.checkpoint_metadata_path(self, kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                metadata = _RestrictedUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
        """Non-tensor values (optimizer hyper-parameters) with torch.load(weights_only=True)."""

        def load_bytes(self, read_item: Any, value: Any) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                torch_private.checkpoint_set_element()(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeFileSystemReader, WeightsOnlyLoadPlanner


SafeFileSystemReader, WeightsOnlyLoadPlanner = _make_reader_class()


def _make_fsspec_reader_class() -> Any:
    FsspecReader: Any = torch_private.fsspec_checkpoint_classes()[0]

    class SafeFsspecReader(FsspecReader):
        """DCP's fsspec reader (checkpoint.dir on object storage), .metadata allow-listed as above."""

        read_metadata = SafeFileSystemReader.read_metadata

    return SafeFsspecReader


SafeFsspecReader = _make_fsspec_reader_class()


# --- RNG states ---------------------------------------------------------------------------------

def capture_rng() -> Dict[str, Any]:
    """Every RNG the loop may draw from, as tensors and plain values (loadable weights-only)."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": _to_plain(random.getstate())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        legacy = np.random.get_state()  # numpy's own default: the legacy tuple, not the dict
        assert isinstance(legacy, tuple)
        kind, keys, pos, has_gauss, gauss = legacy
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(gauss)]
    except ImportError:
        pass
    return state


def restore_rng(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss))


def _to_plain(value: Any) -> Any:
    return [_to_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _to_tuples(value: Any) -> Any:
    return tuple(_to_tuples(v) for v in value) if isinstance(value, list) else value


# --- small helpers ------------------------------------------------------------------------------

def this_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def barrier(group: Optional[Any] = None) -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier(group=group)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
