"""The launcher's own log: our messages to the console, torch elastic's chatter only to a file."""

from __future__ import annotations

import logging
import sys
from pathlib import Path


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
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(file_handler)
        for torch_log in torch_loggers:
            torch_log.addHandler(file_handler)
    return log
