"""Every engine by its kind name: the one table the commands look backends up in.

An entry is "module:attribute", the attribute a launcher.backends.base.Backend instance. Modules are
imported on first use, so `ls` or `status` never load another engine's code (start-up: bench/startup.py).
Adding a backend: its subpackage, with an instance of a Backend subclass, and one line here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Tuple

from launcher.backends.base import Backend, read_record, run_kind
from launcher.errors import ConfigError

if TYPE_CHECKING:  # ls and status need no config
    from launcher.config.schema import Config

# Kind name -> where its Backend lives. The order is the order `run` asks each whether it takes a config:
# the schedulers first (--cluster names them; inside a SLURM allocation SLURM declines and the run is a
# node of its job), then the engines here, the general one (local) last.
BACKENDS: Dict[str, str] = {
    "slurm": "launcher.backends.slurm.backend:BACKEND",
    "ray": "launcher.backends.ray.backend:BACKEND",
    "simulated": "launcher.backends.here:SIMULATED",
    "multinode": "launcher.backends.here:MULTINODE",
    "local": "launcher.backends.here:LOCAL",
}


def get(kind: str) -> Backend:
    """The backend registered under kind (its module imported now)."""
    if kind not in BACKENDS:
        raise ConfigError(f"no backend '{kind}': the backends are {', '.join(BACKENDS)} (launcher.backends.registry)")
    module, _, attribute = BACKENDS[kind].partition(":")
    backend = getattr(importlib.import_module(module), attribute)
    assert isinstance(backend, Backend) and backend.name == kind, (kind, backend)
    return backend


def names() -> List[str]:
    return list(BACKENDS)


def for_config(cfg: "Config") -> Backend:
    """The backend that runs cfg: the first in the table that takes it."""
    for kind in BACKENDS:
        backend = get(kind)
        if backend.takes(cfg):
            return backend
    raise AssertionError("the local backend takes every config")


def kind_of_run(run_dir: Path) -> Tuple[str, bool]:
    """The kind a run recorded at its creation, and whether it was recorded (False: an older run, guessed)."""
    return run_kind(read_record(Path(run_dir) / "job.json"), read_record(Path(run_dir) / "plan.json"))


def backend_of_run(run_dir: Path) -> Backend:
    """The backend that created the run in run_dir."""
    kind, _ = kind_of_run(run_dir)
    if kind not in BACKENDS:
        raise ConfigError(f"{run_dir} was made by a backend this launcher does not have ('{kind}'): "
                          f"use the launcher version that made it")
    return get(kind)
