"""Command line -> subcommand or run, under one error contract. Thin on purpose: the run command
is launcher.run, the others live in launcher.commands."""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional

from launcher import interrupts, prestart
from launcher.commands import catalog
from launcher.config import torchrun_flags
from launcher.errors import ConfigError
from launcher.run import go_on, run
from launcher.usage import config_overrides, parse_args, script_spec, value_flags, with_error_contract

# Subcommands: `python -m launcher NAME ...` calls MODULE.main(argv) -> exit code.
# Each lives in its own module; keep this table sorted.
COMMANDS: Dict[str, str] = {
    "board": "launcher.commands.board",
    "cancel": "launcher.commands.cancel",
    "compare": "launcher.commands.compare",
    "doctor": "launcher.commands.doctor",
    "logs": "launcher.commands.logs",
    "ls": "launcher.commands.ls",
    "resume": "launcher.commands.resume",
    "scale": "launcher.commands.scale",
    "status": "launcher.commands.status",
    "sweep": "launcher.commands.sweep",
}


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    interrupts.hold()  # (already, under python -m launcher) Ctrl-C, SIGTERM, SIGHUP: launcher.interrupts
    handover = prestart.handed_over()
    if handover is not None:  # this process was exec'd by its launch on its way (launcher.prestart): it goes on
        return with_error_contract(lambda: go_on(handover))
    if argv and argv[0] in COMMANDS:
        return run_command(argv[0], argv[1:])
    near = catalog.mistyped(argv[0], COMMANDS) if argv else None
    if near:
        print(f"error: no command or script '{argv[0]}': did you mean {near}? "
              f"(`python -m launcher --help` lists the commands)", file=sys.stderr)
        return 2
    try:  # torchrun's flags become the launcher's first (launcher.config.torchrun_flags)
        argv = torchrun_flags.launcher_argv(argv, value_flags(), note=lambda line: print(line, file=sys.stderr))
        args, script = parse_args(argv, lambda: catalog.command_list(COMMANDS))
    except SystemExit as e:  # argparse printed usage and one line already
        return int(e.code or 0)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code

    def launch() -> int:
        return run(args, config_overrides(args), script_spec(args, script))

    return with_error_contract(launch)


def run_command(name: str, argv: List[str]) -> int:
    """Dispatch a subcommand with the same error contract as a run: one line, exit code."""
    def call() -> int:
        command = importlib.import_module(COMMANDS[name])  # its imports still under the hold
        interrupts.release()  # subcommands wait on runs and on schedulers: Ctrl-C must reach them at once
        return int(command.main(argv))

    return with_error_contract(call)
