"""Saving a checkpoint to object storage (checkpoint.dir=s3://...): the same checkpoint as
trainers.checkpoint.store writes, through DCP's fsspec writer, published without a rename.

Every rank writes its DCP shard and rank-<r>.pt under the step's final prefix; once all have, rank 0 reads
them back for their sha256 (which also proves the upload whole) and writes manifest.json, the one object
whose presence makes the checkpoint exist (launcher.runtime.objects). A job killed before that leaves a
prefix without a manifest: ignored by loading and listing, deleted by the next save.
"""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist

from launcher.runtime import objects, torch_private
from launcher.runtime.checkpoints import FORMAT, MANIFEST
from ..faults.inject import maybe_delay_save
from .store import Position, barrier, rank_payload, root_error, root_message, state_dict, this_rank


class ObjectStoreError(RuntimeError):
    """A save to object storage failed (the store unreachable, refused, ...): the previous checkpoint stands."""


def save(ckpt_dir: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer, position: Position, keep: int) -> str:
    """Write a checkpoint of `position` under ckpt_dir (a URL); keep the newest `keep`. Collective."""
    return write(ckpt_dir, state_dict(model, optimizer), rank_payload(position), position, keep)


def write(ckpt_dir: str, state: Dict[str, Any], payload: Dict[str, Any], position: Position, keep: int,
          group: Optional[Any] = None) -> str:
    """trainers.checkpoint.store.write for a URL. Collective over group (None = the default group)."""
    import torch.distributed.checkpoint as dcp
    FsspecWriter = torch_private.fsspec_checkpoint_classes()[1]

    rank, final = this_rank(), objects.step_url(ckpt_dir, position.step)
    try:
        if rank == 0:
            for leftover in objects.unpublished(ckpt_dir):  # uploads cut off by a killed job
                objects.remove(leftover)
            objects.remove(final)  # the same step saved again (a repeated attempt): unpublished first, never merged
        barrier(group)
        writer = FsspecWriter(final, sync_files=False, **objects.options(ckpt_dir))
        dcp.save(state, storage_writer=writer, process_group=group)
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        fs, path = objects.filesystem(final)
        fs.pipe_file(f"{path}/rank-{rank}.pt", buffer.getvalue())
        maybe_delay_save(rank, position.step)
        barrier(group)
        if rank == 0:
            _publish(final, position)
            for old in objects.list_checkpoints(ckpt_dir)[keep:]:
                objects.remove(old)
    except (Exception, dcp.api.CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise ObjectStoreError(f"saving checkpoint step {position.step} to {ckpt_dir} failed ({root_message(e)}); "
                               f"{objects.after_failed_save(ckpt_dir, root_error(e))}") from e
    barrier(group)
    return final


def _publish(final: str, position: Position) -> None:
    """The manifest, last: the size and sha256 of every object under the step's prefix, read back."""
    fs, path = objects.filesystem(final)
    files = {}
    for name in sorted(fs.find(path)):
        base = name.rsplit("/", 1)[-1]
        size, digest = objects.object_size_and_sha256(fs, name)
        files[base] = {"size": size, "sha256": digest}
    manifest = {
        "format": FORMAT,
        "step": position.step,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "position": asdict(position),
        "files": files,
    }
    fs.pipe_file(f"{path}/{MANIFEST}", json.dumps(manifest, indent=2).encode("utf-8"))

