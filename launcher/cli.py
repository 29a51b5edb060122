"""Command line -> subcommand or run, under one error contract. Thin on purpose: the run command
is launcher.run, the others live in launcher.commands."""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional

from launcher import interrupts
from launcher.commands import catalog
from launcher.config import torchrun_flags
from launcher.errors import ConfigError
from launcher.backends import registry
from launcher.backends.slurm.environment import adopt_allocation
from launcher.config.rendezvous import launch_mode
from launcher.run import resolve_config, run
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


def zygote_kind(argv: List[str]) -> Optional[str]:
    """The workers' kind ("trainer" or "script") where argv is a valid launch whose workers fork here; None otherwise
    (a subcommand, --dry-run, a SLURM or Ray job, start method spawn, a simulated job's coordinator); bad input raises,
    the launch's own pre-torch checks included (launcher.backends.dispatch.refuse_before_torch).
    launcher.prestart asks it first, quietly, to decide whether to exec; main() then does it all again for real."""
    if argv and (argv[0] in COMMANDS or catalog.mistyped(argv[0], COMMANDS)):
        return None
    argv = torchrun_flags.launcher_argv(argv, value_flags(), note=lambda line: None)
    args, script = parse_args(argv, lambda: catalog.command_list(COMMANDS))
    if args.show_config or args.dry_run:
        return None
    cfg = adopt_allocation(resolve_config(args, config_overrides(args), script_spec(args, script)))
    if registry.for_config(cfg).submits or cfg.launcher.start_method == "spawn" or launch_mode(cfg) == "simulated":
        return None
    from launcher.backends.dispatch import refuse_before_torch  # (loaded by the launch after the exec anyway)

    refuse_before_torch(cfg)  # what launch() refuses without torch: refused here, then, with no exec
    return "trainer" if cfg.script.path is None else "script"


def run_command(name: str, argv: List[str]) -> int:
    """Dispatch a subcommand with the same error contract as a run: one line, exit code."""
    def call() -> int:
        command = importlib.import_module(COMMANDS[name])  # its imports still under the hold
        interrupts.release()  # subcommands wait on runs and on SLURM: Ctrl-C must reach them at once
        return int(command.main(argv))

    return with_error_contract(call)
