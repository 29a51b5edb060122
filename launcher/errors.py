"""The launcher's error hierarchy: user errors carry a hint and map to an exit code."""

from __future__ import annotations


class LauncherError(Exception):
    """Base class for errors the launcher reports in one line, without a traceback."""

    exit_code = 1


class ConfigError(LauncherError):
    """Bad command line, config file, key or value: the user can fix it (exit code 2)."""

    exit_code = 2


class LaunchError(LauncherError):
    """Something outside the config prevented the job from starting (exit code 1)."""


class WorkerFailedError(LauncherError):
    """One or more workers failed; the message names the ranks and their errors."""

    def __init__(self, message: str, restarts: int = 0, root_cause: "dict | None" = None) -> None:
        super().__init__(message)
        self.restarts = restarts  # restarts made before the job gave up
        self.root_cause = root_cause  # the rank that failed first: summary.json's "root_cause" (launcher.agent.failures)


class RendezvousError(LauncherError):
    """Nodes could not find each other in time."""


class RendezvousAuthError(LauncherError):
    """What the rendezvous store holds is not signed with this job's secret: the nodes were given
    different secrets, another job uses the port, or someone wrote there (exit code 2, as for a
    config error: the usual fix is the same secret on every node)."""

    exit_code = 2


class Interrupted(KeyboardInterrupt):
    """SIGTERM/SIGHUP to the launcher, raised like Ctrl-C so the same clean-up runs; exit 128+signal."""

    def __init__(self, sigval: int) -> None:
        super().__init__(f"signal {sigval}")
        self.sigval = sigval


class HangError(LauncherError):
    """The watchdog saw ranks stop making progress; the message names them and where they were."""


class RunDirLostError(LauncherError):
    """The run directory was deleted, moved or made read-only while the job ran: the job was stopped and
    nothing more is written there; the message says what was kept and where."""


class SettingError(ConfigError, ValueError):
    """A launch()/submit() setting the config does not have, or a value it refuses (launcher.api.settings): a
    ValueError to Python code, a config error (exit 2) to the launcher's error contract."""


class LaunchFailed(LauncherError):
    """A launch()/submit() job did not return its ranks' values (launcher.api.job): the rank that failed first
    (None where no rank failed: the job was cancelled, or never started), its traceback text, the job's state
    and its run directory."""

    def __init__(self, message: str, rank: "int | None" = None, traceback: str = "", state: str = "FAILED",
                 run_dir: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.traceback = traceback
        self.state = state
        self.run_dir = run_dir
