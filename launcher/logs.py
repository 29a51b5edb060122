"""The launcher's own log: our messages to the console, torch elastic's chatter only to a file."""

from __future__ import annotations

import io
import logging
import sys
from pathlib import Path

from launcher.runtime import safefs


class RunDirFileHandler(logging.FileHandler):
    """logging.FileHandler whose file is opened through launcher.runtime.safefs: a link or a FIFO planted as the log
    (logs/launcher.log) is refused in one line, where open() followed the link or waited forever on the FIFO."""

    def __init__(self, path: Path, root: Path) -> None:
        self.root = str(root)
        super().__init__(path, encoding="utf-8")

    def _open(self) -> io.TextIOWrapper:
        stream = safefs.open_file(self.baseFilename, self.mode, root=self.root, encoding=self.encoding, errors=self.errors)
        assert isinstance(stream, io.TextIOWrapper)  # text mode
        return stream


def setup_launcher_logging(log_file: Path | None, verbose: bool = False) -> logging.Logger:
    """Our messages to the console; torch elastic's chatter only to the launcher's log file."""
    log = logging.getLogger("launcher")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[launcher] %(message)s"))
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.addHandler(console)
    torch_loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    for torch_log in torch_loggers:
        torch_log.propagate = False
        torch_log.setLevel(logging.INFO)
        for handler in list(torch_log.handlers):
            torch_log.removeHandler(handler)
    if log_file is not None:
        file_handler = RunDirFileHandler(log_file, root=log_file.parent.parent)  # <run_dir>/logs/<name>.log
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(file_handler)
        for torch_log in torch_loggers:
            torch_log.addHandler(file_handler)
    return log


def into_log_file(line: str) -> None:
    """A line the launcher printed itself (its last, `error: ...`) into the run's log file too, not the console
    again: logs/launcher.log then holds every line the launcher printed."""
    log = logging.getLogger("launcher")
    for handler in log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(log.makeRecord(log.name, logging.ERROR, __file__, 0, line, (), None))
