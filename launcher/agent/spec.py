"""What a node's agent, its watchdog and its workers need of the resolved config, typed: the backends make an AgentSpec
from the Config (AgentSpec.of) and hand it down with the plan; nothing below reads the config as a dict or restates
its defaults. Imports no torch."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Dict, Literal, Optional, Tuple

if TYPE_CHECKING:
    from launcher.config.schema import Config

WorkerKind = Literal["trainer", "script", "module"]  # the built-in trainer, a script, a module run as `python -m`


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    """One node's agent: its workers, how it watches them, what its rendezvous needs beyond the plan."""

    kind: WorkerKind
    target: Optional[str]  # the script's path or the module's name; None for the built-in trainer
    args: Tuple[str, ...]  # the script's own arguments
    role: str  # torchrun's --role: workers see ROLE_NAME
    monitor_interval_s: float  # how often the agent looks at its workers
    exit_timeout_s: float  # a rank whose script returned but whose process lingers this long is killed
    redirects: str  # streams the console leaves out (torchrun's -r)
    local_ranks_filter: Tuple[int, ...]  # the local ranks the console shows; () = all
    watchdog_timeout_s: float  # 0: no hang watchdog
    watchdog_start_timeout_s: float
    script_metrics: bool  # a script's step records (metrics.scripts)
    wandb: bool  # rank 0 of a script adds the launcher's figures to a W&B run it starts (wandb.mode not disabled)
    local_addr: Optional[str]  # this node's address towards the others (rdzv.local_addr); None = the route's
    trainer_config: Dict[str, Any] = dataclasses.field(default_factory=dict)  # the built-in trainer's, for its ranks
    ignored_signals: Tuple[int, ...] = ()  # what the allocation's scheduler sends every process of a step (SLURM's USR2)

    @classmethod
    def of(cls, cfg: "Config", ignored_signals: Tuple[int, ...] = ()) -> "AgentSpec":
        from launcher.config.schema import to_dict

        script = cfg.script
        kind: WorkerKind = "trainer" if script.path is None else ("module" if script.module else "script")
        return cls(kind=kind, target=script.path, args=tuple(script.args), role=cfg.launcher.role,
                   monitor_interval_s=float(cfg.launcher.monitor_interval_s),
                   exit_timeout_s=float(cfg.launcher.exit_timeout_s), redirects=str(cfg.launcher.redirects),
                   local_ranks_filter=tuple(cfg.launcher.local_ranks_filter),
                   watchdog_timeout_s=float(cfg.watchdog.timeout_s),
                   watchdog_start_timeout_s=float(cfg.watchdog.start_timeout_s),
                   script_metrics=bool(cfg.metrics.scripts), wandb=cfg.wandb.mode != "disabled",
                   local_addr=cfg.rdzv.local_addr, trainer_config=to_dict(cfg) if kind == "trainer" else {},
                   ignored_signals=ignored_signals)
