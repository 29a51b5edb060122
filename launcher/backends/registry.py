"""Every engine by its kind name: the one table that lists engines, and what generic code asks of them all.

An entry is "module:attribute", the attribute a launcher.backends.base.Backend instance that declares the
engine: its `--cluster` name and help, its config section (`options`, a dataclass under the key of its
name), and the allocation it detects and adopts (`allocation()`, a launcher.backends.allocation
.ClusterEnvironment). Modules are imported on first use, so `ls` or `status` never load another engine's
code, and nothing here loads torch, submitit or ray (start-up: bench/startup.py).
Adding an engine: its subpackage, with an instance of a Backend subclass, and one line here, or, for one
kept outside this package, one entry in $LAUNCHER_ENGINES (ENGINES_VARIABLE: docs/backends.md).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from launcher.backends.base import Backend, read_record, run_kind
from launcher.errors import ConfigError

if TYPE_CHECKING:  # only the types: the config's sections module imports nothing of the launcher's
    from launcher.backends.allocation import ClusterEnvironment
    from launcher.config.sections import Config

# Kind name -> where its Backend lives. The order is the order in which two questions go to the engines:
# - `run` asks each whether it takes a config (for_config): the schedulers first (--cluster names them;
#   inside a SLURM allocation SLURM declines and the run is a node of its job), then the engines here,
#   the general one (local) last;
# - a launch asks each for the allocation it may run inside (allocation_here): the schedulers that start one
#   process per node of their jobs first (only inside such a job step are their variables all set, so a
#   job step of theirs is never mistaken for a plain shell), none of the engines here (they run where
#   they are told, by the command line).
BACKENDS: Dict[str, str] = {
    "slurm": "launcher.backends.slurm.backend:BACKEND",
    "ray": "launcher.backends.ray.backend:BACKEND",
    "simulated": "launcher.backends.here:SIMULATED",
    "multinode": "launcher.backends.here:MULTINODE",
    "local": "launcher.backends.here:LOCAL",
}
# Engines kept outside this package: "kind=module:attribute" entries, comma-separated, asked before those above
# (an engine of yours may run its jobs on top of SLURM, its processes inside SLURM's job steps: it must be
# detected first). Every process the launcher starts inherits the variable, so every node knows the engine.
ENGINES_VARIABLE = "LAUNCHER_ENGINES"
DEFAULT_CLUSTER = "local"


def table() -> Dict[str, str]:
    """$LAUNCHER_ENGINES' entries, then BACKENDS."""
    extra: Dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in os.environ.get(ENGINES_VARIABLE, "").split(","))):
        kind, _, where = entry.partition("=")
        if not kind or ":" not in where:
            raise ConfigError(f"{ENGINES_VARIABLE} entry '{entry}' is not KIND=MODULE:ATTRIBUTE: "
                              f"e.g. {ENGINES_VARIABLE}=mine=mypackage.backend:BACKEND")
        extra[kind.strip()] = where.strip()
    return {**extra, **BACKENDS} if extra else BACKENDS


def _load(where: str) -> Backend:
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def get(kind: str) -> Backend:
    """The backend registered under kind (its module imported now)."""
    engines = table()
    if kind not in engines:
        raise ConfigError(f"no backend '{kind}': the backends are {', '.join(engines)} (launcher.backends.registry)")
    backend = _load(engines[kind])
    assert isinstance(backend, Backend) and backend.name == kind, (kind, backend)
    return backend


def names() -> List[str]:
    return list(table())


def for_config(cfg: "Config") -> Backend:
    """The backend that runs cfg: the first in the table that takes it."""
    for kind in table():
        backend = get(kind)
        if backend.takes(cfg):
            return backend
    raise AssertionError("the local backend takes every config")


def clusters() -> Dict[str, Backend]:
    """The --cluster names (the default first), each with the engine it names."""
    named = {b.cluster: b for b in map(get, table()) if b.cluster}
    return {name: named[name] for name in sorted(named, key=lambda name: name != DEFAULT_CLUSTER)}


def sections() -> List[Tuple[str, type]]:
    """Each engine's config section, (its key, its dataclass), in the table's order (launcher.config.schema)."""
    return [(b.name, b.options) for b in map(get, table()) if b.options is not None]


def check_sections(cfg: "Config") -> None:
    """Each engine's checks of its own section's values (a ConfigError names the key)."""
    for backend in map(get, table()):
        if backend.options is not None:
            backend.check_options(cfg)


def allocation_here() -> Optional["ClusterEnvironment"]:
    """The allocation this process runs inside, if any: the first engine's, in the table's order, whose detect() is
    true."""
    for backend in map(get, table()):
        environment = backend.allocation()
        if environment is not None and environment.detect():
            return environment.from_environ()
    return None


def step_signals() -> Tuple[int, ...]:
    """The signals the allocation this process runs inside sends every process of its step (none elsewhere)."""
    found = allocation_here()
    return found.step_signals if found is not None else ()


def adopt_allocation(cfg: "Config") -> "Config":
    """cfg as the allocation this process runs inside decides it (its nodes, node rank, node 0); as it is elsewhere."""
    found = allocation_here()
    return cfg if found is None else found.adopt(cfg)


def own_folders() -> Tuple[str, ...]:
    """The folders in a run directory that engines' schedulers write themselves (their own links are theirs)."""
    return tuple(folder for backend in map(get, table()) for folder in backend.folders)


def kind_of_run(run_dir: Path) -> Tuple[str, bool]:
    """The kind a run recorded at its creation, and whether it was recorded (False: an older run, guessed)."""
    return run_kind(read_record(Path(run_dir) / "job.json"), read_record(Path(run_dir) / "plan.json"))


def backend_of_run(run_dir: Path) -> Backend:
    """The backend that created the run in run_dir."""
    kind, _ = kind_of_run(run_dir)
    if kind not in table():
        raise ConfigError(f"{run_dir} was made by a backend this launcher does not have ('{kind}'): "
                          f"use the launcher version that made it")
    return get(kind)
