"""An allocation a launch can run inside (a scheduler's job step), as an engine declares it.

Modelled on Lightning's cluster environments (lightning.fabric.plugins.environments): `detect()` says,
from the environment alone, whether this process runs inside such an allocation; `from_environ()`
reads it; its getters are read-only (none writes os.environ). `adopt()` applies it to a resolved
config: the allocation, not the command line, decides the nodes, this node's rank and node 0.
launcher.backends.registry asks each engine's environment in its table's order (`environment()`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Mapping, Tuple

if TYPE_CHECKING:  # only the type: this module loads nothing of the launcher's
    from launcher.config.sections import Config


class ClusterEnvironment(ABC):
    """The allocation this process runs in, as a node agent needs it."""

    node_rank: int  # this node's rank in the job
    num_nodes: int  # the job's nodes
    step_signals: Tuple[int, ...] = ()  # what the scheduler sends every process of the step (workers ignore them)

    @staticmethod
    @abstractmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        """Whether env is that of a process this allocation started for the job (one per node)."""

    @classmethod
    @abstractmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> "ClusterEnvironment":
        """The allocation as env describes it (detect(env) is true)."""

    @property
    @abstractmethod
    def master_addr(self) -> str:
        """Node 0's host, where the nodes meet."""

    @property
    @abstractmethod
    def master_port(self) -> int:
        """The port on node 0 every node derives alike, with nothing sent."""

    @property
    @abstractmethod
    def run_id(self) -> str:
        """A run id every node of the job agrees on without talking (used when none was given)."""

    @abstractmethod
    def adopt(self, cfg: "Config") -> "Config":
        """cfg as this allocation runs it: its nodes, this node's rank and node 0 (a mismatch is a ConfigError)."""
