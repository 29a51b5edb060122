"""Opening, making and replacing files in a run directory without following a symlink planted there.

A run directory can live in a folder other users write to (docs/security.md), so nothing below
its root is trusted to be what the launcher made: every directory on the way is opened relative to
its parent with O_NOFOLLOW (no check-then-use window) and so is the last component. A symlink
anywhere below the root, or the root itself being one, raises PlantedLinkError and nothing is
written. The root's own parents are the user's choice and are followed (output_dir is resolved
once, when the launch is planned). Standard library only: the worker bootstrap and trainers use it.

Only regular files are opened: a FIFO, a socket, a device or a folder where a file belongs (anyone who could
write the folder can plant one, and an open of a FIFO waits for a peer forever, deaf to SIGTERM) is refused
as a link is, without blocking (O_NONBLOCK for the open itself, then a check of what was opened).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import stat
from typing import IO, Any, Dict, List, Optional, Tuple

WHY = "a symlink the launcher did not make"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"),
          (stat.S_ISDIR, "a folder"))


class PlantedLinkError(OSError):
    """A path in a run directory is a symlink: refused, never followed, never removed."""

    def __init__(self, path: str, what: str = WHY, code: int = errno.ELOOP) -> None:
        super().__init__(code, f"{path} is {what}: remove it, or run with another run_id=ID")
        self.path = path

    def __str__(self) -> str:
        return str(self.strerror)


class PlantedFileError(PlantedLinkError):
    """A path in a run directory where a file belongs is a FIFO, socket, device or folder: refused, never opened
    for good (an open of a FIFO would wait for a peer), never removed."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(path, f"{kind}, not a regular file the launcher made", errno.EINVAL)


def odd_kind(mode: int) -> Optional[str]:
    """What a file of this mode is where a regular file belongs ("a FIFO", ...), or None for a regular file."""
    return None if stat.S_ISREG(mode) else next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def refuse_link(path: str) -> None:
    """Raise PlantedLinkError when path itself is a symlink (a run directory planted as a link)."""
    if os.path.islink(path):
        raise PlantedLinkError(str(path))


def refuse_planted(root: str, clears: Tuple[str, ...] = (), others: Tuple[str, ...] = (),
                   fifos: Tuple[str, ...] = ()) -> None:
    """Raise PlantedLinkError for the first symlink in the tree under root (root itself included), walked without
    following any, and PlantedFileError for the first FIFO, socket or device; names starting with one of clears are
    leftovers the launcher replaces itself, link or not; folders named in others, right under root, are another
    program's (W&B makes links of its own in wandb/, submitit in slurm/): refused when a link, never walked; paths
    (relative to root) starting with one of fifos are FIFOs torch makes itself (NCCL's debug pipes)."""
    refuse_link(root)
    for folder, dirs, files in os.walk(root, onerror=None, followlinks=False):
        if folder == root:
            dirs[:] = [d for d in dirs if d not in others or os.path.islink(os.path.join(folder, d))]
        for name in sorted(dirs + files):
            path = os.path.join(folder, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:  # gone since the listing
                continue
            if stat.S_ISLNK(mode) and not name.startswith(clears or ("\0",)):
                raise PlantedLinkError(path)
            kind = None if stat.S_ISLNK(mode) or stat.S_ISDIR(mode) else odd_kind(mode)
            if kind and not (stat.S_ISFIFO(mode) and os.path.relpath(path, root).startswith(fifos or ("\0",))):
                raise PlantedFileError(path, kind)


def _parts(root: str, path: str) -> List[str]:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel == os.curdir:
        return []
    parts = rel.split(os.sep)
    if parts[0] == os.pardir:
        raise ValueError(f"{path} is not under {root}")
    return parts


def _open_dir(name: str, dir_fd: Optional[int], shown: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link_at(name, dir_fd):
            raise PlantedLinkError(shown) from None
        raise


def _is_link_at(name: str, dir_fd: Optional[int]) -> bool:
    return stat.S_ISLNK(_mode_at(name, dir_fd) or 0)


def _mode_at(name: str, dir_fd: Optional[int]) -> Optional[int]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def open_dir(path: str, *, root: str, make: bool = False) -> int:
    """A descriptor of the directory path (root or below it), made where missing when make is set."""
    shown = os.path.abspath(root)
    fd = _open_dir(shown, None, shown)
    try:
        for name in _parts(root, path):
            shown = os.path.join(shown, name)
            if make:
                try:
                    os.mkdir(name, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass  # made by another rank or node, or a link: the open below tells which
            inner = _open_dir(name, fd, shown)
            fd, outer = inner, fd  # one step, then the close: a signal raised after it never closes fd twice
            os.close(outer)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(path: str, *, root: str) -> None:
    """os.makedirs(path, exist_ok=True) for a path under root, through no symlink."""
    os.close(open_dir(path, root=root, make=True))


def open_fd(path: str, flags: int, mode: int = 0o666, *, root: str) -> int:
    """os.open(path, flags, mode) for a path under root: no symlink on the way or at the end, and a regular file.

    With O_CREAT, missing directories between root and the file are made (the launcher's own)."""
    path = os.path.abspath(path)
    parent = open_dir(os.path.dirname(path), root=root, make=bool(flags & os.O_CREAT))
    try:
        return _open_regular(os.path.basename(path), flags, mode, parent, path)
    finally:
        os.close(parent)


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """os.open(path, flags) of a regular file, its last component not followed, never waiting on a FIFO: for readers
    of run directories that walk no root (`ls`, the board, a command's record)."""
    return _open_regular(path, flags, 0o666, None, path)


def _open_regular(name: str, flags: int, mode: int, dir_fd: Optional[int], shown: str) -> int:
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP or (e.errno == errno.EEXIST and _is_link_at(name, dir_fd)):
            raise PlantedLinkError(shown) from None
        kind = odd_kind(_mode_at(name, dir_fd) or stat.S_IFREG) if e.errno in (errno.ENXIO, errno.EISDIR) else None
        if kind:  # ENXIO: a FIFO opened for writing with no reader
            raise PlantedFileError(shown, kind) from None
        raise
    try:
        kind = odd_kind(os.fstat(fd).st_mode)
        if kind:
            raise PlantedFileError(shown, kind)
        if not flags & os.O_NONBLOCK:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


_FLAGS = {"r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "x": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def open_file(path: str, mode: str = "r", *, root: str, **kwargs: Any) -> IO[Any]:
    """open(path, mode, ...) for a path under root ("r", "w", "a", "x", each with "b" or not), through no symlink."""
    def opener(_path: str, _flags: int) -> int:
        return open_fd(path, _FLAGS[mode.replace("b", "")], root=root)

    # The file object owns the descriptor from its creation on. A close of our own after os.fdopen failed closed
    # it twice where a stop signal was raised just after the file object was made (its deallocation closed it
    # first): OSError EBADF replaced the signal's exception (a Ctrl-C as the workers started ended in exit 1 and a
    # traceback), or a descriptor another thread had opened meanwhile was closed.
    return open(path, mode, opener=opener, **kwargs)


def read_bytes(path: str, *, root: str) -> bytes:
    with open_file(path, "rb", root=root) as f:
        return f.read()


def json_rows(lines: List[bytes]) -> List[Dict[str, Any]]:
    """The JSON objects among lines (JSONL); a line that is not one is left out."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_new_rows(path: str, offset: int, *, root: str, most: int = 1 << 20) -> Tuple[List[Dict[str, Any]], int]:
    """The whole JSONL lines of path after offset (at most `most` bytes), and the offset after them: a line being
    written is left for the next read. No rows (offset kept) where the file is missing or not a regular file."""
    try:
        fd = open_fd(path, os.O_RDONLY, root=root)
    except OSError:
        return [], offset
    try:
        data = os.pread(fd, most, offset)
    except OSError:
        return [], offset
    finally:
        os.close(fd)
    whole = data[:data.rfind(b"\n") + 1]
    return json_rows(whole.split(b"\n")[:-1]), offset + len(whole)


def replace(src: str, dst: str, *, root: str) -> None:
    """os.replace(src, dst) for two paths under root, whose folders are reached through no symlink.

    A link at dst is replaced itself (rename never follows its last component), never written through."""
    src_dir = open_dir(os.path.dirname(os.path.abspath(src)), root=root)
    try:
        dst_dir = open_dir(os.path.dirname(os.path.abspath(dst)), root=root)
        try:
            os.replace(os.path.basename(src), os.path.basename(dst), src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        finally:
            os.close(dst_dir)
    finally:
        os.close(src_dir)


def remove_own(path: str) -> None:
    """Clear a leftover of the launcher's own (the temporary folder of a killed save) before making it afresh.

    A symlink planted in its place is removed itself, never what it points to."""
    if os.path.islink(path):
        os.unlink(path)
    else:
        shutil.rmtree(path, ignore_errors=True)  # which itself never follows a link inside the folder
