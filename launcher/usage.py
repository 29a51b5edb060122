"""The command line's shared parts: the run command's flags and overrides, where a script's own
arguments start, usage errors in one line, and the error contract every command answers with.

launcher.cli dispatches; the subcommands (launcher.commands) parse their own flags with the same
OneLineParser, and `compare` and `doctor --comm` reuse the run command's parser.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any, Union, Callable, List, NoReturn, Optional, Set, Tuple

from launcher import interrupts
from launcher.backends import registry
from launcher.config.elastic import nodes_overrides, parse_nodes
from launcher.config.inputs import OVERRIDE
from launcher.errors import ConfigError, LauncherError
from launcher.logs import into_log_file
from launcher.runtime.safefs import PlantedLinkError

EPILOG = """\
examples:
  python -m launcher --nodes 1 --gpus 2                     built-in DDP job, 2 workers
  python -m launcher --gpus 4 trainer.steps=500 data.batch_size=64
  python -m launcher --gpus 2 train.py --lr 0.1             your torchrun-style script, args passed through
  python -m launcher --gpus 2 -m mypkg.train --epochs 3     a module, like python -m
  python -m launcher --config configs/quick.yaml --dry-run  print the resolved config and plan only
  python -m launcher --show-config                          every config key with its default
  python -m launcher resume launcher_runs/RUN_ID trainer.steps=500   continue a run from its newest checkpoint
  python -m launcher --cluster slurm --nodes 2 --gpus 4 slurm.partition=gpu slurm.time_min=240
                                                            submit to SLURM; then: status RUN, logs RUN, cancel RUN

  python -m launcher --nodes 2 --gpus 2                     2 nodes simulated on this machine (WORLD_SIZE 4)
  python -m launcher --nodes 2 --gpus 4 --node-rank 0 --master-addr HOST --master-port 29500
                                                            one node of a 2-machine job (run it on each, K=0,1)
  python -m launcher --nodes 2 --gpus 2 --rdzv-endpoint HOST:29400 --rdzv-id job1
                                                            c10d rendezvous: same command on every node
  python -m launcher compare --gpus 4 strategies=ddp,fsdp   the same job under each strategy, side by side

torchrun's flags work too (--nproc-per-node, --nnodes, --standalone, --rdzv-backend, ...): docs/torchrun.md.
Configuration precedence: built-in defaults < --config YAML < flags and key=value overrides.
Without CUDA, --gpus G runs G CPU workers with gloo.
"""


DISTRIBUTION = "torch-launcher"  # the name this package installs under (setup.cfg), whose metadata holds its version


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line with a pointer to --help, exit code 2."""

    def error(self, message: str) -> "NoReturn":
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        return super().parse_known_args(None if args is None else self.dashed_values(list(args)), namespace)

    def dashed_values(self, args: List[str]) -> List[str]:
        """`--nodes -1:2`, `ls --since -5m`: argparse takes a value starting with '-' for a flag ("expected one
        argument") unless it reads as a negative number; joined as --nodes=-1:2, the flag's own check names
        what is wrong with it. A value that is one of this parser's flags stays a flag."""
        takes_one = {s for a in self._actions if a.nargs is None for s in a.option_strings}
        out: List[str] = []
        i = 0
        while i < len(args):
            token, value = args[i], args[i + 1] if i + 1 < len(args) else ""
            if (token in takes_one and len(value) > 1 and value.startswith("-") and value != "--"
                    and value.partition("=")[0] not in self._option_string_actions):
                out.append(f"{token}={value}")
                i += 2
                continue
            out.append(token)
            i += 1
        return out


class RunParser(OneLineParser):
    """The run command's parser. Its --help can list the subcommands too: launcher.cli owns that table and passes
    a function that writes the list, called only when help is printed."""

    command_list: Optional[Callable[[], str]] = None

    def format_help(self) -> str:
        if self.command_list is None:
            return super().format_help()
        own, self.description = self.description, f"{self.description}\n\n{self.command_list()}"
        try:
            return super().format_help()
        finally:
            self.description = own


class VersionAction(argparse.Action):
    """--version: this package's version and torch's, from the installed packages' metadata (no torch import)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit(0)


def version_text() -> str:
    from importlib import metadata

    try:
        ours = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, never installed
        ours = "unknown (not installed: pip install -e .)"
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:  # a torch built from source without metadata: ask the module itself
        import torch

        torch_version = torch.__version__
    return f"{DISTRIBUTION} {ours} (torch {torch_version}, Python {sys.version.split()[0]})"


def build_parser() -> RunParser:
    p = RunParser(
        prog="python -m launcher",
        description="Launch a PyTorch distributed training job: built-in trainer or your own torchrun-style script.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=VersionAction, nargs=0, help="print the launcher's and torch's versions and exit")
    p.add_argument("--nodes", type=nodes_flag, metavar="N|MIN:MAX",
                   help="number of nodes (default 1), e.g. --nodes 2; MIN:MAX for an elastic job (c10d rendezvous): "
                        "it starts once MIN nodes joined and goes on while at least MIN remain, e.g. --nodes 1:4")
    p.add_argument("--gpus", type=int_flag("--gpus"), metavar="G",
                   help="workers per node: one per GPU, or G CPU workers with gloo when there is no CUDA; e.g. --gpus 4")
    p.add_argument("--config", metavar="FILE", help="a YAML config (path, or a name from configs/ such as 'quick')")
    p.add_argument("--max-restarts", type=int_flag("--max-restarts"), metavar="K",
                   help="restart the workers up to K times when one fails (launcher.max_restarts)")
    p.add_argument("--spares", type=int_flag("--spares"), metavar="K",
                   help="K hot spare nodes beyond --nodes: they check in and wait, warm, and one takes a lost node's "
                        "place, so the world size stays (launcher.spares; c10d rendezvous)")
    p.add_argument("--rdzv-timeout", type=int_flag("--rdzv-timeout"), metavar="SECONDS",
                   help="how long a node waits for the others (rdzv.timeout_s, default 60)")
    p.add_argument("--node-rank", type=int_flag("--node-rank"), metavar="K",
                   help="this machine's node rank, 0..N-1 (static rendezvous with --master-addr/--master-port)")
    p.add_argument("--master-addr", metavar="HOST", help="node 0's host name or address (static rendezvous)")
    p.add_argument("--master-port", type=int_flag("--master-port"), metavar="PORT",
                   help="the port on node 0 the nodes meet on (static rendezvous, default 29500)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                   help="torch's c10d rendezvous instead of --node-rank: node ranks are assigned on arrival and "
                        "nodes may run different worker counts (e.g. --gpus 1 on one node, --gpus 2 on another)")
    p.add_argument("--rdzv-id", metavar="ID", help="rendezvous and run id shared by all nodes of one job "
                                                   "(default: derived from the address and port)")
    p.add_argument("--rdzv-secret-file", metavar="PATH",
                   help="a file holding the job's secret, the same on every machine: the nodes sign what they share "
                        "at the rendezvous with it (default: $LAUNCHER_RDZV_SECRET; SLURM jobs get one)")
    clusters = registry.clusters()  # each engine's name and help (launcher.backends.registry)
    p.add_argument("--cluster", choices=tuple(clusters),
                   help=" | ".join(f"{name}: {backend.cluster_help}" for name, backend in clusters.items()))
    submitting = "/".join(name for name, backend in clusters.items() if backend.submits)
    p.add_argument("--wait", action="store_true", help=f"--cluster {submitting}: block until the job ends, showing rank 0's log")
    p.add_argument("--output-dir", metavar="DIR", help="where run directories go (output_dir, default launcher_runs)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and launch plan; start nothing")
    p.add_argument("--show-config", action="store_true", help="print every config key with its value and exit")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module as the script, like python -m MODULE")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. trainer.steps=50 seed=1")
    return p


def int_flag(name: str):
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} expects a whole number, got '{text}'") from None
    return parse


def nodes_flag(text: str) -> Union[int, str]:
    """--nodes N (an int, as before elastic jobs) or 'MIN:MAX', checked here so a typo is argparse's one line."""
    try:
        low, high = parse_nodes(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text if ":" in text else low


def split_argv(argv: List[str], parser: argparse.ArgumentParser) -> Tuple[List[str], List[str]]:
    """Split launcher arguments from the script and its arguments.

    The script starts at `-m MODULE` or at the first bare word that is not a flag's value and
    not a key=value override; everything after it belongs to the script.
    """
    takes_value = value_flags(parser)
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "-m":
            return argv[: i + 2], argv[i + 2:]
        if token == "--":
            return argv[:i], argv[i + 1:]
        if token.startswith("-"):
            i += 2 if token in takes_value else 1
            continue
        if OVERRIDE.match(token):
            i += 1
            continue
        return argv[:i], argv[i:]
    return argv, []


def value_flags(parser: Optional[argparse.ArgumentParser] = None) -> Set[str]:
    """The run command's flags that take a value (the next word is theirs, not the script)."""
    parser = parser or build_parser()
    return {s for a in parser._actions if a.nargs != 0 and a.option_strings for s in a.option_strings}


def parse_args(argv: List[str], command_list: Optional[Callable[[], str]] = None) -> Tuple[argparse.Namespace, List[str]]:
    """(the run's arguments, the script and its arguments); command_list: see RunParser."""
    parser = build_parser()
    parser.command_list = command_list
    ours, script = split_argv(argv, parser)
    args = parser.parse_intermixed_args(ours)
    return args, script


def config_overrides(args: argparse.Namespace) -> List[str]:
    """Flags become overrides of their config keys, applied after the user's key=value items."""
    overrides = list(args.overrides)
    if args.nodes is not None:
        overrides.extend(nodes_overrides(args.nodes))
    for flag, key in (("gpus", "gpus"), ("max_restarts", "launcher.max_restarts"), ("spares", "launcher.spares"),
                      ("rdzv_timeout", "rdzv.timeout_s"), ("output_dir", "output_dir"), ("cluster", "cluster"),
                      ("node_rank", "rdzv.node_rank"), ("master_addr", "rdzv.master_addr"),
                      ("master_port", "rdzv.master_port"), ("rdzv_endpoint", "rdzv.endpoint"), ("rdzv_id", "rdzv.id"),
                      ("rdzv_secret_file", "rdzv.secret_file")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={value}")
    return overrides


def script_spec(args: argparse.Namespace, script: List[str]) -> Optional[Tuple[str, bool, List[str]]]:
    """(path or module, is_module, arguments) of the user's script, or None for the built-in trainer."""
    if args.module:
        return args.module, True, script
    if script:
        return script[0], False, script[1:]
    return None


def reader_went_away() -> int:
    """Our stdout's reader closed it (`ls | head`): stop quietly, exit 0, as Unix tools do."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not raise again
    return 0


def with_error_contract(call: Callable[[], int]) -> int:
    """User errors and interrupts end in one line and an exit code; only bugs show a traceback."""
    try:
        code = int(call())
        interrupts.conclude()  # one recorded as the run finished (or held through --dry-run) still counts; later ones do not
        return code
    except SystemExit as e:  # argparse already printed its one line (or --help)
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except LauncherError as e:
        print(f"error: {e}", file=sys.stderr)
        into_log_file(f"error: {e}")
        return e.exit_code
    except PlantedLinkError as e:  # a link planted in a run directory (docs/security.md): refused, never followed
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("interrupted", file=sys.stderr)
        return 128 + getattr(e, "sigval", signal.SIGINT)
