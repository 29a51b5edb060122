"""The launcher's own Python child processes (node agents, Ray drivers and tasks, child runs): their argv.

`python -m MODULE` would put the working folder first on the child's sys.path, where a user's own
``launcher.py`` (or a folder of that name) would shadow the installed package. The child runs the module
as ``-m`` does, minus that entry. Nothing is added to PYTHONPATH either: the package is installed, and a
worker inherits its agent's environment, so a folder added there would end up on the user's script's path.
"""

from __future__ import annotations

import sys
from typing import List

from launcher.prestart import BOOTSTRAP

RUN_MODULE = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"


def launcher_module_command(module: str, *args: str) -> List[str]:
    """argv that runs `module` of the installed launcher as `python -m module ARGS` would, the working folder left out."""
    return [sys.executable, "-c", RUN_MODULE, module, *args]


def node_command(module: str, start_method: str, *args: str) -> List[str]:
    """launcher_module_command, for a node agent whose workers fork from a zygote: the node starts as
    launcher/worker/bootstrap.py, which imports torch once for the node and forks its zygote (launcher.prestart)."""
    if start_method != "fork" or not sys.platform.startswith("linux"):
        return launcher_module_command(module, *args)
    return [sys.executable, "-u", BOOTSTRAP, "node", module, *args]
