"""The one interface every engine implements (local, simulated, multinode, SLURM, Ray), and how a run's kind is recorded.

Modelled on TorchX's Scheduler (torchx/schedulers/api.py): a dry run that says what would start, a launch
that starts it, `describe` (a small dataclass: state, whether it ended, its exit code, one line), the rank
logs, `cancel` (idempotent: a job that already ended is a no-op that says so) and listing its runs. The
CLI's run, resume, ls, logs, status, cancel, sweep and the board reach an engine only through this class
and launcher.backends.registry, so a verb added here is a verb every engine has.

A run's kind is recorded when it is created, never guessed later: a submitted job's job.json (written at
submission, before anything runs) and every launch's plan.json carry KIND_FIELD. Cheap to import: the
engines load torch, submitit or ray inside their methods, never at the top.
"""

from __future__ import annotations

import importlib
import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Type

from launcher.errors import ConfigError
from launcher.runtime import safefs

if TYPE_CHECKING:  # only the types: this module loads nothing of the launcher's
    from launcher.backends.allocation import ClusterEnvironment
    from launcher.config.sections import Config
    from launcher.plan import LaunchPlan

KIND_FIELD = "kind"  # in job.json and plan.json: the registry name of the backend that created the run
# Runs written before KIND_FIELD existed: plan.json's launch mode says which engine ran them.
KIND_BY_MODE = {"single": "local", "simulated": "simulated", "static": "multinode", "c10d": "multinode"}
RANK_LOG = re.compile(r"^rank-(\d+)(?:\.attempt-(\d+))?\.log$")


class NotSupported(ConfigError):
    """A verb this engine cannot do; the message names the engine and what to do instead."""


@dataclass(frozen=True)
class Description:
    """What `status` prints about a run, and its exit code (0 while it runs; after, what `--wait` would return)."""

    state: str  # the engine's own word: RUNNING, COMPLETED, FAILED, CANCELLED, ... (a SLURM job: sacct's)
    final: bool  # it will not run again on its own
    exit_code: int
    line: str  # "<engine> job <id> <STATE>: <what the run's summary says>"


class Backend(ABC):
    """One engine. Subclasses set `name` (the kind recorded in a run directory and shown by `ls`) and `label`, and
    declare what generic code asks of every engine (launcher.backends.registry): the `--cluster` name that chooses
    it, its own config section, the allocation it runs inside, the folders its scheduler writes in a run."""

    name: str = ""
    label: str = ""  # how messages name one of its jobs: "local run", "SLURM job", "Ray job"
    submits: bool = False  # its job outlives the command that started it (so --wait, status and cancel matter)
    cluster: str = ""  # the --cluster (config `cluster`) name that chooses it; "": chosen otherwise (the launch mode)
    cluster_help: str = ""  # --cluster's help for it: what it does, and its config keys
    options: Optional[type] = None  # its config section, a dataclass under the key `name` (docs/backends.md)
    folders: Tuple[str, ...] = ()  # folders its scheduler writes in a run directory itself (their links are its own)

    def check_options(self, cfg: "Config") -> None:  # noqa: B027 (a hook: a backend with nothing to check keeps it empty)
        """Check the values of its config section the type system cannot (a ConfigError names the key and the fix)."""

    def allocation(self) -> Optional[Type["ClusterEnvironment"]]:
        """The allocation its jobs' processes run inside (its ClusterEnvironment class, imported now), or None."""
        return None

    @abstractmethod
    def takes(self, cfg: "Config") -> bool:
        """Whether this engine runs cfg (the registry asks each in its table's order; the first that takes it runs it)."""

    @abstractmethod
    def dry_run(self, cfg: "Config") -> str:
        """What launch would start or send for cfg, as text; nothing is started, created or contacted."""

    @abstractmethod
    def launch(self, cfg: "Config", started: float, wait: bool) -> int:
        """Start cfg: run it here to its end, or submit it (and follow it to its end with wait); the exit code."""

    @abstractmethod
    def describe(self, run_dir: Path) -> Description:
        """The run's state now, asking the engine where only the engine knows (sacct, the Ray driver)."""

    @abstractmethod
    def cancel(self, run_dir: Path) -> str:
        """Stop the run, keeping its directory; a run that already ended is left alone. The line to print."""

    def running(self, run_dir: Path) -> bool:
        """Whether the run may still write its logs (`logs -f` follows until this turns False)."""
        return not self.describe(run_dir).final

    def log_files(self, run_dir: Path, rank: int) -> List[Path]:
        """Where a rank's log is: logs/rank-<k>.log, then its restarted attempts' logs in attempt order."""
        logs = Path(run_dir) / "logs"
        names = sorted(p.name for p in logs.iterdir()) if logs.is_dir() else []
        found = [(int(m.group(2) or 0), logs / n) for n in names if (m := RANK_LOG.match(n)) and int(m.group(1)) == rank]
        return [path for _, path in sorted(found)]

    def no_log_hint(self, run_dir: Path) -> str:
        """Why a rank may have no log yet, and where to look instead."""
        return "the run has not started its workers (see logs/launcher.log)"

    def runs(self, root: Path) -> List[Path]:
        """The run directories directly under root that this engine created, as their records say."""
        found = []
        for path in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
            if path.is_dir() and run_kind(read_record(path / "job.json"), read_record(path / "plan.json"))[0] == self.name:
                found.append(path.resolve())
        return found


class RunsHere(Backend):
    """A backend whose job runs from the launching process: launcher.backends.dispatch plans it, creates and
    locks its run directory, and calls these hooks in this order. `runner` is the module that runs the job
    (it loads torch: imported only by runner_module)."""

    runner: str = ""

    def pick_port(self) -> int:
        """A port the plan records before anything starts (0: the rendezvous picks its own)."""
        return 0

    def check_before_start(self, plan: "LaunchPlan") -> None:
        """What can fail before anything starts, checked before the run directory exists."""

    def meet(self, plan: "LaunchPlan") -> Optional[Any]:
        """The nodes of a multi-node job meet and agree before any touches the run directory; the session, or None."""
        return None

    def run(self, cfg: "Config", plan: "LaunchPlan", started: float, session: Optional[Any]) -> int:
        """Run the locked run directory's job to its end; the job's exit code on this machine."""
        return int(self.runner_module().run(cfg, plan, started))

    def runner_module(self) -> ModuleType:
        return importlib.import_module(self.runner)


def run_kind(job: Dict[str, Any], plan: Dict[str, Any]) -> Tuple[str, bool]:
    """A run's kind and whether it was recorded (True) or, for a run older than KIND_FIELD, guessed (False).

    job.json first: a submitted job writes it before anything runs, and its nodes' plan.json name the
    engine of one node (multinode), not the job's."""
    for record in (job, plan):
        if isinstance(record.get(KIND_FIELD), str) and record[KIND_FIELD]:
            return record[KIND_FIELD], True
    if job:  # job.json has named its cluster since it was first written; older SLURM records may not
        return str(job.get("cluster") or "slurm"), False
    if plan:
        return KIND_BY_MODE.get(str(plan.get("mode")), "local"), False
    return "unknown", False


def read_record(path: Path) -> Dict[str, Any]:
    """A run's JSON record, or {} where it is absent or unreadable (a half-written file is replaced atomically)."""
    try:
        with os.fdopen(safefs.open_regular(str(path)), "rb") as f:  # a FIFO planted there: no record, not a wait
            data = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
