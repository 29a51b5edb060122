"""The engines that run a job from this process: this machine (local), simulated nodes, one node of several (multinode).

Each launches through launcher.backends.dispatch (plan, run directory, lock) and hands the locked run to
its runner module, imported only then (they load torch). Their state is the run directory's: a live
launcher holds its lock (launcher.runlock), summary.json says how it ended (launcher.runindex), and
cancelling one signals the launcher that holds it, which records the stop as an interrupted run.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from launcher.backends.base import Description, RunsHere
from launcher.runtime.schema import Status

if TYPE_CHECKING:
    from launcher.config.sections import Config
    from launcher.plan import LaunchPlan

EXIT_CODES: Dict[str, int] = {Status.COMPLETED: 0, Status.INTERRUPTED: 130, Status.RUNNING: 0}  # anything else: 1 (README, exit codes)
CANCEL_WAIT_S = 60.0


class HereBackend(RunsHere):
    """An engine dispatch runs here; `modes` are the launch modes it runs (launcher.config.rendezvous.launch_mode)."""

    modes: Tuple[str, ...] = ()

    def takes(self, cfg: "Config") -> bool:
        from launcher.config.rendezvous import launch_mode

        return launch_mode(cfg) in self.modes

    def dry_run(self, cfg: "Config") -> str:
        from launcher.backends.dispatch import dry_run_text

        return dry_run_text(cfg, self)

    def launch(self, cfg: "Config", started: float, wait: bool) -> int:
        from launcher.backends.dispatch import launch

        return launch(cfg, started, backend=self)

    def describe(self, run_dir: Path) -> Description:
        from launcher.runindex import run_row

        row = run_row(Path(run_dir), time.time())
        status = str(row["status"])
        line = f"{self.label} {row['run_id']} {status.upper()}"
        if row.get("error"):
            line += f": {row['error']}"
        elif status == Status.COMPLETED:
            line += f": world size {row.get('world_size')}, restarts {row.get('restarts')}" + (
                f", {row['step']} steps" if row.get("step") is not None else "")
        elif status == Status.RUNNING:
            line += f" ({', '.join(row.get('holders') or [])})"
        return Description(status.upper(), status != Status.RUNNING, EXIT_CODES.get(status, 1), line)

    def cancel(self, run_dir: Path) -> str:
        """SIGTERM to the launchers holding the run on this host (each records `interrupted`), then wait for them."""
        from launcher.runlock import live_holders

        holders = live_holders(Path(run_dir))
        if not holders:
            return f"{self.label} {Path(run_dir).name} already ended ({self.describe(run_dir).state}); nothing to cancel"
        here = {socket.gethostname(), socket.getfqdn()}
        mine = sorted({h.pid for h in holders if h.host in here})
        elsewhere = sorted({f"{h.host}:{h.pid}" for h in holders if h.host not in here})
        for pid in mine:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass  # it ended meanwhile
        deadline = time.monotonic() + CANCEL_WAIT_S
        while mine and time.monotonic() < deadline and any(h.pid in mine for h in live_holders(Path(run_dir))):
            time.sleep(0.5)
        line = f"cancelled {self.label} {Path(run_dir).name} (launcher pid {', '.join(map(str, mine)) or 'none here'})"
        if elsewhere:
            line += f"; launchers on other hosts hold it too, stop them there: {', '.join(elsewhere)}"
        return line + f"; run directory {run_dir} kept"


class LocalBackend(HereBackend):
    name, label, modes, runner = "local", "local run", ("single",), "launcher.backends.local"
    # --cluster local: this machine, or the nodes the command line names (the simulated and multinode engines)
    cluster, cluster_help = "local", "run here (default)"


class SimulatedBackend(HereBackend):
    name, label, modes, runner = "simulated", "simulated run", ("simulated",), "launcher.backends.simulated"

    def pick_port(self) -> int:
        return int(self.runner_module().pick_port())


class MultinodeBackend(HereBackend):
    name, label, modes, runner = "multinode", "multinode run", ("static", "c10d"), "launcher.backends.node"

    def check_before_start(self, plan: "LaunchPlan") -> None:
        from launcher.backends.addresses import check_before_start

        check_before_start(plan.mode, plan.rdzv_endpoint, plan.node_rank, plan.rdzv_secret_file)

    def meet(self, plan: "LaunchPlan") -> Optional[Any]:
        return self.runner_module().meet(plan)

    def run(self, cfg: "Config", plan: "LaunchPlan", started: float, session: Optional[Any]) -> int:
        return int(self.runner_module().run(cfg, plan, started, session))


LOCAL, SIMULATED, MULTINODE = LocalBackend(), SimulatedBackend(), MultinodeBackend()
