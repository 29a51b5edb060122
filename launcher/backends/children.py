"""The launcher's own Python child processes (node agents, Ray drivers and tasks, child runs): their argv.

`python -m MODULE` would put the working folder first on the child's sys.path, where a user's own
``launcher.py`` (or a folder of that name) would shadow the installed package. The child runs the module
as ``-m`` does, minus that entry. Nothing is added to PYTHONPATH either: the package is installed, and a
worker inherits its agent's environment, so a folder added there would end up on the user's script's path.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, List, Optional

from launcher.prestart import BOOTSTRAP, KINDS, RUN_MODULE

if TYPE_CHECKING:  # only the type: a SLURM task's or Ray actor's process loads no config code
    from launcher.config.sections import Config


def launcher_module_command(module: str, *args: str) -> List[str]:
    """argv that runs `module` of the installed launcher as `python -m module ARGS` would, the working folder left out."""
    return [sys.executable, "-c", RUN_MODULE, module, *args]


def zygote_module_command(module: str, kind: Optional[str], *args: str) -> List[str]:
    """launcher_module_command, for a child that runs a node agent whose workers (of kind "trainer" or "script") fork
    from a zygote: it starts as launcher/worker/bootstrap.py, which imports torch once for the agent and forks the
    zygote first (launcher.prestart). kind None: no zygote (start method spawn)."""
    if kind not in KINDS or not sys.platform.startswith("linux"):
        return launcher_module_command(module, *args)
    return [sys.executable, "-u", BOOTSTRAP, str(kind), "node", module, *args]


def workers_kind(cfg: "Config") -> Optional[str]:
    """The kind of workers (zygote_module_command's `kind`) of a node running cfg: "trainer" for the built-in
    trainer, "script" for a script, None with start method spawn."""
    if cfg.launcher.start_method == "spawn":
        return None
    return "trainer" if cfg.script.path is None else "script"
