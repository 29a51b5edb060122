"""Command line -> subcommand or run, under one error contract. Thin on purpose: the run command
is launcher.run, the others live in launcher.commands and launcher.backends.slurm."""

from __future__ import annotations

import importlib
import signal
import sys
from typing import Dict, List, Optional

from launcher.errors import Interrupted
from launcher.run import run
from launcher.usage import config_overrides, parse_args, script_spec, with_error_contract

# Subcommands: `python -m launcher NAME ...` calls MODULE.main(argv) -> exit code.
# Each lives in its own module; keep this table sorted.
COMMANDS: Dict[str, str] = {
    "cancel": "launcher.backends.slurm.cancel",
    "compare": "launcher.commands.compare",
    "doctor": "launcher.commands.doctor",
    "logs": "launcher.backends.slurm.logs",
    "resume": "launcher.commands.resume",
    "scale": "launcher.commands.scale",
    "status": "launcher.backends.slurm.status",
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    catch_termination()
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    try:
        args, script = parse_args(argv)
    except SystemExit as e:  # argparse printed usage and one line already
        return int(e.code or 0)

    def launch() -> int:
        return run(args, config_overrides(args), script_spec(args, script))

    return with_error_contract(launch)


def run_command(name: str, argv: List[str]) -> int:
    """Dispatch a subcommand with the same error contract as a run: one line, exit code."""
    return with_error_contract(lambda: importlib.import_module(COMMANDS[name]).main(argv))


def catch_termination() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so a job stopped at any moment cleans up and says so.

    (While workers run, torch's agent installs its own handlers, which stop the workers first.)
    """
    def interrupt(signum: int, _frame: object) -> None:
        raise Interrupted(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)
