"""Checkpoints on object storage (checkpoint.dir=s3://..., gs://..., any fsspec URL), without torch.

An object store has no rename, so a checkpoint is published in place: every file is written under its final
prefix ``<url>/step-00000042/`` and ``manifest.json`` (an object written in one PUT, whole or absent) last.
A step prefix without its manifest does not exist: listing ignores it and the next save deletes it (a job
killed mid-upload leaves only such a prefix). Deleting goes the other way, manifest first.

Credentials and endpoints come only from the store's own chain (AWS_* variables, AWS_ENDPOINT_URL, profiles,
GOOGLE_APPLICATION_CREDENTIALS): nothing here takes, records or prints them. fsspec (a torch dependency) is
imported when a URL is used; s3fs and gcsfs are the [s3] and [gcs] extras.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any, Dict, List, Optional, Tuple, TypeGuard

from launcher.runtime import store_problems

URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
STEP = re.compile(r"^step-(\d{8})$")
MANIFEST = "manifest.json"


def is_url(location: Any) -> TypeGuard[str]:  # a str where true: the type checker narrows with it
    return isinstance(location, str) and URL.match(location) is not None


def scheme(url: str) -> str:
    return url.split("://", 1)[0].lower()


def options(url: str) -> Dict[str, Any]:
    """Storage options: bounded waits on a store that stops answering, so a save fails instead of hanging."""
    if scheme(url) in ("s3", "s3a"):
        return {"config_kwargs": {"connect_timeout": 5, "read_timeout": 30,
                                  "retries": {"max_attempts": 3, "mode": "standard"}}}
    return {}


def filesystem(url: str) -> Tuple[Any, str]:
    """The fsspec file system for url and the path in it, its listings forgotten: other ranks and processes
    write there. fsspec keeps one instance per process (a forked worker makes its own), whose client takes
    seconds to make."""
    import fsspec

    store_problems.quiet_clients()
    fs, path = fsspec.core.url_to_fs(url, **options(url))
    fs.invalidate_cache()
    return fs, path.rstrip("/")


def unusable(url: str) -> Optional[str]:
    """Why url cannot be used here before any network (launcher.runtime.store_problems), else None."""
    return store_problems.url_problem(url) or store_problems.missing_package(url)


def join(url: str, *names: str) -> str:
    return "/".join([url.rstrip("/"), *names])


def step_url(url: str, step: int) -> str:
    return join(url, f"step-{step:08d}")


def _prefixes(url: str) -> Dict[str, bool]:
    """Every step-N prefix under url -> whether its manifest is there (one listing of every object under url)."""
    fs, root = filesystem(url)
    found: Dict[str, bool] = {}
    try:
        names = fs.find(root)
    except FileNotFoundError:
        return {}
    for name in names:
        rel = name[len(root):].strip("/").split("/")
        if len(rel) > 1 and STEP.match(rel[0]):
            found[rel[0]] = found.get(rel[0], False) or rel[1:] == [MANIFEST]
    return found


def list_checkpoints(url: str) -> List[str]:
    """Published checkpoints (with a manifest), newest first."""
    return [join(url, name) for name, published in sorted(_prefixes(url).items(), reverse=True) if published]


def unpublished(url: str) -> List[str]:
    """Step prefixes without a manifest: saves cut off before publishing."""
    return [join(url, name) for name, published in sorted(_prefixes(url).items()) if not published]


def read_manifest(checkpoint: str) -> Dict[str, Any]:
    fs, path = filesystem(checkpoint)
    data = json.loads(fs.cat_file(f"{path}/{MANIFEST}").decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("manifest is not an object")
    return data


def object_size_and_sha256(fs: Any, path: str) -> Tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with fs.open(path, "rb", block_size=8 << 20) as f:
        for chunk in iter(lambda: f.read(8 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def remove(checkpoint: str) -> None:
    """Delete a checkpoint: its manifest first, so a deletion cut off midway leaves no half checkpoint."""
    fs, path = filesystem(checkpoint)
    for target, recursive in ((f"{path}/{MANIFEST}", False), (path, True)):
        try:
            fs.rm(target, recursive=recursive)
        except FileNotFoundError:
            pass


def set_aside(checkpoint: str) -> None:
    """A damaged checkpoint becomes corrupt-step-N (copied, then removed): kept for a look, never loaded."""
    fs, path = filesystem(checkpoint)
    parent, name = path.rsplit("/", 1)
    fs.copy(path, f"{parent}/corrupt-{name}", recursive=True)
    remove(checkpoint)


def after_failed_save(url: str, error: BaseException) -> str:
    """What a save to url that failed with error left of the checkpoints published before it, and what to do, as the
    store says now: a failed save never touches them, but a bucket deleted meanwhile took them with it. A store that
    did not answer is not asked again (the save's own timeouts were spent on it)."""
    fix = "check that the object store is reachable and writable (AWS_ENDPOINT_URL, credentials), then resume"
    if store_problems.unanswered(error):
        return f"this save did not touch the checkpoints published before it: {fix}"
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    try:
        fs, _ = filesystem(url)
        gone = not fs.exists(bucket)
        published = [] if gone else list_checkpoints(url)
    except Exception as e:  # the store's client errors, whose classes need its imports
        if not store_problems.is_store_error(e):
            raise
        return f"whether the checkpoints published before it are still there could not be checked: {fix}"
    if gone:
        return (f"the bucket {bucket} no longer exists, and the checkpoints published before it went with it: create "
                "the bucket again (or fix checkpoint.dir) and start the run again")
    if not published:
        return f"no published checkpoint is left in {url} (deleted meanwhile): start the run again"
    return f"the checkpoints published before it are there, the newest {published[0].rsplit('/', 1)[-1]}: {fix}"


def preflight(url: str, key: str = "checkpoint.dir") -> Optional[str]:
    """Why url cannot hold checkpoints (or, key output_dir, run records): the store unreachable, no such bucket,
    not writable; else None.

    Writes and deletes one empty probe object: only a write shows that these credentials may write there.
    """
    problem = unusable(url) or store_problems.endpoint_problem(url)
    if problem:
        return problem
    try:
        fs, path = filesystem(url)
        probe = f"{path}/.launcher-probe-{uuid.uuid4().hex}"
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as e:  # botocore's connection errors and the like, whose classes need s3fs's imports
        if not store_problems.is_store_error(e):
            raise
        return store_problems.explain(e, url, key)
    return None
