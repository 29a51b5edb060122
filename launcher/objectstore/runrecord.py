"""The run record on object storage (output_dir=s3://BUCKET/PREFIX, gs://..., any fsspec URL): the one owner.

A job still writes its run directory on a local file system (rank logs, heartbeats, the watchdog and the locks
need one): a private staging folder (mkdtemp: 0700, new, ours) under the system's temp directory. An Uploader
copies the run record (RECORD_FILES, RECORD_DIRS) to <url>/<run_id>/ as soon as the run's config.yaml and plan.json
are written, each time the built-in trainer publishes a checkpoint, every INTERVAL_S while the job runs (only files
whose size or time changed) and completely when it ends, however it ends: a launcher killed in its first seconds
leaves a run that `ls` lists and `resume` continues. Every node of a multi-node job has its own staging folder
(launcher.objectstore.staging) and removes it once nothing more is needed from it: the head once the whole record
is up, another node once its files reached the head (launcher.backends.mirror). Checkpoints default to
<url>/<run_id>/checkpoints (launcher.runtime.objects).

`ls`, `logs` and `status` read a record back into a private temporary folder and read that as a run directory:
only object names of the record's own shapes are taken, each of bounded size, written below that folder through
launcher.runtime.safefs. Credentials come from the store's own chain; nothing here takes, writes or prints them.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import re
import shlex
import shutil
import stat
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from launcher.errors import ConfigError
from launcher.objectstore.staging import left_behind
from launcher.runtime import safefs, store_problems
from launcher.runtime.formatting import first_line
from launcher.runtime.goodput import kept_steps
from launcher.runtime.objects import filesystem, is_url, join, preflight, unusable
from launcher.runtime.schema import Status

if TYPE_CHECKING:  # `ls` and `logs` import this module and need no config
    from launcher.config.schema import Config

log = logging.getLogger("launcher")
RECORD_FILES = frozenset(("config.yaml", "plan.json", "summary.json", "metrics.jsonl", "job.json"))
RECORD_DIRS = frozenset(("logs", "goodput", "nodes", "steps", "stacks", "env"))  # not locks/, heartbeats/, .tokens
INDEX_FILES = frozenset(("config.yaml", "plan.json", "summary.json", "job.json"))  # what `ls` reads whole
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+=-]{0,199}$")  # one path component: no '..', no leading dot
MAX_DEPTH = 3  # logs/<attempt folder>/rank-0.log at most
INTERVAL_S = 30.0  # while the job runs, how often changed files go up
POLL_S = 1.0  # how often the uploader looks for the run's start and a new checkpoint (a directory listing, no network)
LIVE_S = 3 * INTERVAL_S  # a record without summary.json that changed this recently is a running job's
MAX_INDEX_BYTES = 1 << 20  # summary.json, config.yaml, ... larger than this are not a launcher's: not read
MAX_FILE_BYTES = 64 << 20  # a longer log is read from its last 64 MiB
TAIL_BYTES = 8192  # metrics.jsonl's tail, for `ls` (launcher.runindex reads no more)
Stat = Tuple[int, int]


def check_store(cfg: Config) -> None:
    """An object-store output_dir answers and takes a write, before anything starts: one line, exit 2."""
    if is_url(cfg.output_dir):
        problem = preflight(cfg.output_dir, key="output_dir")
        if problem:
            raise ConfigError(f"output_dir={cfg.output_dir}: {problem}")


def with_store_checkpoints(cfg: Config, run_id: str) -> Config:
    """With an object-store output_dir, checkpoints go to <url>/<run_id>/checkpoints unless checkpoint.dir says where."""
    if not is_url(cfg.output_dir) or cfg.checkpoint.dir or cfg.script.path is not None:
        return cfg
    return replace(cfg, checkpoint=replace(cfg.checkpoint, dir=join(cfg.output_dir, run_id, "checkpoints")))


def record_name(parts: List[str]) -> bool:
    """Whether a path below a run directory belongs to its record (and has a name of the record's shapes)."""
    if not parts or len(parts) > MAX_DEPTH or not all(NAME.match(p) for p in parts):
        return False
    return parts[0] in RECORD_FILES if len(parts) == 1 else parts[0] in RECORD_DIRS


def local_record(run_dir: Path) -> Dict[str, Stat]:
    """Every regular file of the record under run_dir -> (size, mtime_ns); links and odd names left out."""
    found: Dict[str, Stat] = {}

    def walk(folder: Path, parts: List[str]) -> None:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            rel = [*parts, entry.name]
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode) and len(rel) < MAX_DEPTH and (parts or entry.name in RECORD_DIRS):
                walk(Path(entry.path), rel)
            elif stat.S_ISREG(st.st_mode) and record_name(rel):
                found["/".join(rel)] = (st.st_size, st.st_mtime_ns)
    walk(run_dir, [])
    return found


class Uploader:
    """Copies a run directory's record to <url>/<run_id>/: once the run has its config and plan, then changed files at
    each checkpoint the launch that started at `started` publishes and every INTERVAL_S, all of them at close()."""

    def __init__(self, url: str, run_dir: Path, started: float) -> None:
        self.url, self.run_dir, self.started = join(url, run_dir.name), run_dir, started
        self.sent: Dict[str, Stat] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-record-upload", daemon=True)
        self._warned = False

    def start(self) -> "Uploader":
        self._thread.start()
        return self

    def _loop(self) -> None:
        synced, kept = None, kept_steps(self.run_dir, self.started)  # when it last synced (monotonic); checkpoints
        while not self._stop.wait(POLL_S):
            now, published = time.monotonic(), kept_steps(self.run_dir, self.started)
            if synced is None and not all((self.run_dir / name).is_file() for name in ("config.yaml", "plan.json")):
                continue  # not started yet: the first upload is the run's config and plan
            if synced is not None and published == kept and now - synced < INTERVAL_S:
                continue
            synced, kept = now, published
            problem = self.sync()
            if problem and not self._warned:  # the job goes on; the next sync and the final upload try again
                self._warned = True
                log.info(f"run record not uploaded to {self.url} yet ({problem}); trying again")

    def sync(self) -> Optional[str]:
        """Upload what changed since the last sync (summary.json last: a reader that finds it finds the rest);
        None, or why not."""
        try:
            fs, root = filesystem(self.url)
            changed = sorted((name for name, st in local_record(self.run_dir).items() if self.sent.get(name) != st),
                             key=lambda name: (name == "summary.json", name))
            for name in changed:
                st = os.stat(self.run_dir / name, follow_symlinks=False)
                data = safefs.read_bytes(str(self.run_dir / name), root=str(self.run_dir))
                fs.pipe_file(f"{root}/{name}", data)
                self.sent[name] = (st.st_size, st.st_mtime_ns)
        except Exception as e:  # a store gone away, a file replaced as it was read: never the job's failure
            return f"{e.__class__.__name__}: {first_line(e)}"
        return None

    def close(self) -> bool:
        """The whole record, now: the job has ended. True once it is all up (Staging then removes the folder)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=120)
        self.sent.clear()  # everything again: a file rewritten within its mtime's resolution is not missed
        problem = self.sync()
        if problem:
            log.error(f"the run record could not be uploaded to {self.url} ({problem}): it is kept in {self.run_dir}")
            print(f"run record NOT uploaded to {self.url} ({problem}); kept in {self.run_dir}")
            return False
        print(f"run record: {self.url}")
        return True


def uploader(cfg: Config, run_dir: Path, head: bool, started: float) -> Optional[Uploader]:
    """The run's uploader where output_dir is a URL and this node reports the job (the others' files reach it)."""
    return Uploader(cfg.output_dir, run_dir, started) if is_url(cfg.output_dir) and head else None


def _modified(info: Dict[str, Any]) -> Optional[float]:
    """An object's last-modified time from its listing (s3fs: LastModified; gcsfs: updated), else None."""
    value = info.get("LastModified") or info.get("updated") or info.get("mtime")
    try:
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        return float(value) if isinstance(value, (int, float)) else None
    except (ValueError, OverflowError, OSError):
        return None


def _listing(url: str, only: Optional[str]) -> Tuple[Any, str, Dict[str, Dict[str, Dict[str, Any]]], Dict[str, float], set]:
    """One listing of everything under url (or its run `only`): run id -> {record name: object info}, run id ->
    newest object time, and the runs that have checkpoints. Names not of the record's shapes are left out."""
    fs, root = filesystem(url)
    try:
        found = fs.find(f"{root}/{only}" if only else root, detail=True)
    except FileNotFoundError:
        found = {}
    runs: Dict[str, Dict[str, Dict[str, Any]]] = {}
    newest: Dict[str, float] = {}
    checkpoints = set()
    for path, info in found.items():
        parts = path[len(root):].strip("/").split("/")
        if len(parts) < 2 or not NAME.match(parts[0]) or not isinstance(info, dict):
            continue
        when = _modified(info)
        if when is not None:
            newest[parts[0]] = max(newest.get(parts[0], 0.0), when)
        if parts[1] == "checkpoints":
            checkpoints.add(parts[0])
        elif record_name(parts[1:]):
            runs.setdefault(parts[0], {})["/".join(parts[1:])] = info
    return fs, root, runs, newest, checkpoints


def _download(fs: Any, remote: str, info: Dict[str, Any], local: Path, top: Path, limit: int) -> None:
    """One object into local (below top, nothing followed), at most its last `limit` bytes, with its time."""
    size = info.get("size")
    size = size if isinstance(size, int) and size >= 0 else 0
    data = fs.cat_file(remote, start=max(0, size - limit)) if size > limit else fs.cat_file(remote)
    safefs.make_dirs(str(local.parent), root=str(top))
    fd = safefs.open_fd(str(local), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, root=str(top))
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(data[-limit:]))
    when = _modified(info)
    if when is not None:
        os.utime(local, (when, when))


def _reading_folder() -> Path:
    """A private folder for records read back, removed when this process ends."""
    folder = Path(tempfile.mkdtemp(prefix="launcher-record-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _fetch(url: str, whole: bool, only: Optional[str] = None) -> Tuple[Path, Dict[str, float], set]:
    """The records under url (or one run's, `only`) read into a private folder: for `ls` the index files and
    metrics.jsonl's tail; whole, every file of the record."""
    fs, root, runs, newest, checkpoints = _listing(url, only)
    top = _reading_folder()
    for run_id, files in runs.items():
        if only is not None and run_id != only:
            continue
        for name, info in files.items():
            if not whole and name not in INDEX_FILES and name != "metrics.jsonl" and not name.startswith("nodes/"):
                continue
            limit = MAX_FILE_BYTES if whole else TAIL_BYTES if name == "metrics.jsonl" else MAX_INDEX_BYTES
            if name in INDEX_FILES and int(info.get("size") or 0) > MAX_INDEX_BYTES:
                continue  # not a launcher's: the run shows as damaged or unknown rather than filling memory
            _download(fs, f"{root}/{run_id}/{name}", info, top / run_id / name, top, limit)
        if run_id in checkpoints:
            (top / run_id / "checkpoints").mkdir(exist_ok=True)  # `ls` then offers `resume`
    return top, newest, checkpoints


def _fetched(url: str, whole: bool, only: Optional[str] = None) -> Tuple[Path, Dict[str, float], set]:
    """_fetch, or why the store cannot be read, in one line (launcher.runtime.store_problems)."""
    problem = unusable(url) or store_problems.endpoint_problem(url)
    if problem:
        raise ConfigError(f"{url}: {problem}")
    try:
        return _fetch(url, whole, only)
    except Exception as e:  # the store client's errors, whose classes need its imports
        if not store_problems.is_store_error(e):
            raise
        raise ConfigError(f"{url}: {store_problems.explain(e, url, 'the URL')}") from e


def list_runs(url: str, ended: Optional[Dict[str, Path]] = None) -> List[Dict[str, Any]]:
    """`ls URL`: one row per run recorded under url, as launcher.runindex makes them, named by their URLs. ended: the
    runs whose launcher is known gone (launcher.objectstore.staging.left_behind, by default looked up here)."""
    from launcher.runindex import list_runs as index  # rows from files, as for a local output_dir

    top, newest, _ = _fetched(url, whole=False)
    now, ended = time.time(), left_behind(url) if ended is None else ended
    rows = index(top, now)
    for row in rows:
        local, remote = row["path"], join(url, row["run_id"])
        row["command"] = row["command"].replace(shlex.quote(local), shlex.quote(remote))
        row["path"] = remote
        if row["run_id"] in ended:  # its launcher's staging folder is here, the launcher gone: not running
            continue
        if row["status"] in (Status.DEAD, Status.UNKNOWN) and now - newest.get(row["run_id"], 0.0) < LIVE_S:
            row["status"] = Status.RUNNING  # its uploader wrote lately: no summary yet because it has not ended
            row["command"] = f"python -m launcher logs {shlex.quote(remote)}"
    return rows


def fetch_run(url: str) -> Path:
    """`logs URL/RUN`, `status URL/RUN`: that run's whole record, read into a private folder; its path."""
    parent, _, run_id = url.rstrip("/").rpartition("/")
    if not NAME.match(run_id) or "://" not in parent:
        raise ConfigError(f"{url} names no run: pass URL/RUN_ID (`python -m launcher ls URL` lists them)")
    top, _, _ = _fetched(parent, whole=True, only=run_id)
    run_dir = top / run_id
    if not any((run_dir / name).is_file() for name in ("plan.json", "config.yaml")):
        raise ConfigError(f"no run recorded at {url}: `python -m launcher ls {parent}` lists the runs there")
    return run_dir


def run_url(run: str, output_dir: str) -> Optional[str]:
    """RUN (or RUN under --output-dir) as a run's URL where either is one; None for a local run."""
    if is_url(run):
        return run.rstrip("/")
    return join(output_dir, run) if is_url(output_dir) else None


def restore(earlier: Path, run_dir: Path) -> None:
    """A resumed run's staging folder gets its record as read back (metrics, goodput, logs go on from there)."""
    for name in local_record(earlier):
        target = run_dir / name
        safefs.make_dirs(str(target.parent), root=str(run_dir))
        fd = safefs.open_fd(str(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666, root=str(run_dir))
        with os.fdopen(fd, "wb") as f:
            f.write((earlier / name).read_bytes())
