"""A toy engine, kept outside the launcher's package and registered the way a user registers one of theirs:
LAUNCHER_ENGINES=toy=tests.toy_engine:BACKEND (launcher.backends.registry; docs/backends.md).

It declares what every engine declares: its --cluster name, its own config section (toy.*, with a check of its
own) and an allocation it detects and adopts ($TOY_JOB_ID: a one-node job whose run id it names). It runs the job
on this machine, as the local engine does, and leaves toy.json in the run directory from its section's values.
tests/test_backend_registry.py runs a real job through it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Type

from launcher.backends.allocation import ClusterEnvironment
from launcher.backends.here import HereBackend
from launcher.errors import ConfigError


@dataclass
class ToyConfig:
    greeting: str = "hello"  # written into the run directory's toy.json
    repeat: int = 1  # how many times; at least 1


@dataclass(frozen=True)
class ToyEnvironment(ClusterEnvironment):
    """A toy scheduler's job step: $TOY_JOB_ID names a one-node job."""

    job_id: str
    node_rank: int = 0
    num_nodes: int = 1

    @staticmethod
    def detect(env: Mapping[str, str] = os.environ) -> bool:
        return bool(env.get("TOY_JOB_ID"))

    @classmethod
    def from_environ(cls, env: Mapping[str, str] = os.environ) -> "ToyEnvironment":
        return cls(job_id=env["TOY_JOB_ID"])

    @property
    def master_addr(self) -> str:
        return "127.0.0.1"

    @property
    def master_port(self) -> int:
        return 0

    @property
    def run_id(self) -> str:
        return f"toy-{self.job_id}"

    def adopt(self, cfg: Any) -> Any:
        cfg.run_id = cfg.run_id or self.run_id
        return cfg


class ToyBackend(HereBackend):
    name, label, modes, runner = "toy", "toy run", ("single",), "launcher.backends.local"
    cluster, cluster_help, options = "toy", "run here through the toy engine (config: toy.*)", ToyConfig

    def takes(self, cfg: Any) -> bool:
        return cfg.cluster == self.cluster

    def check_options(self, cfg: Any) -> None:
        if cfg.toy.repeat < 1:
            raise ConfigError(f"toy.repeat={cfg.toy.repeat} must be at least 1")

    def allocation(self) -> Optional[Type[ClusterEnvironment]]:
        return ToyEnvironment

    def run(self, cfg: Any, plan: Any, started: float, session: Optional[Any]) -> int:
        (Path(plan.run_dir) / "toy.json").write_text(json.dumps({"greetings": [cfg.toy.greeting] * cfg.toy.repeat}))
        return super().run(cfg, plan, started, session)


BACKEND = ToyBackend()
