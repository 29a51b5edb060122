"""Reading back what an offline W&B run holds: its run-<id>.wandb file, record by record (W&B's own LevelDB-style
log of protobuf Records: a 7-byte header, then 32 KiB blocks of records, each with a 7-byte header of its own), as
`wandb sync` reads it. wandb ships no reader of its own for it; tests use this one to check every value sent."""

import json
import struct
from pathlib import Path
from typing import Any, Dict, Iterator, List

HEADER = 7  # b":W&B", magic 0xBEE1, version
BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    """Every Record of the file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, pending = HEADER, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a record header: padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record
        if kind == 0 and length == 0:  # zero padding to the block's end
            pos += BLOCK - pos % BLOCK


def history(run_folder: Path) -> List[Dict[str, Any]]:
    """The run's history rows ({key: value}), in the order logged: what its charts are drawn from."""
    (path,) = run_folder.glob("*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def run_record(run_folder: Path) -> Dict[str, Any]:
    """The run's group, tags and config, as its records set them."""
    (path,) = run_folder.glob("*.wandb")
    found: Dict[str, Any] = {"config": {}, "tags": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["group"], found["tags"] = record.run.run_group, list(record.run.tags)
            items = record.run.config.update
        elif kind == "config":
            items = record.config.update
        else:
            continue
        for item in items:
            found["config"]["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return found


def run_summary(run_folder: Path) -> Dict[str, Any]:
    """The run's summary ({key: value}), the last value set for each key."""
    (path,) = run_folder.glob("*.wandb")
    found: Dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                found["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    return found
