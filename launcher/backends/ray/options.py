"""The `ray:` config section: how a --cluster ray job is placed on a Ray cluster (launcher/backends/ray/).

The Ray engine's own keys (launcher.backends.ray.backend declares them); nothing here imports ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from launcher.errors import ConfigError


@dataclass
class RayConfig:
    """One placement group, one bundle per node (STRICT_SPREAD), one node agent per bundle."""

    # the cluster's address (HOST:PORT of its GCS, or `auto` for the cluster this machine belongs to);
    # None = $RAY_ADDRESS, and `auto` inside a Ray job
    address: Optional[str] = None
    cpus_per_node: int = 0  # CPUs each bundle reserves; 0 = --gpus x launcher.omp_threads (at least --gpus)
    gpus: str = "auto"  # reserve --gpus GPUs per bundle: auto (if the cluster has GPUs) | always | never
    placement_timeout_s: float = 60.0  # how long the placement group may wait for its nodes before the job is refused
    # send the submitting folder to every node as the job's Ray working_dir (launcher/backends/ray/code.py);
    # false: the code is already on every node, at the same path (a shared filesystem, a baked image)
    ship_code: bool = True
    ship_limit_mb: float = 100.0  # the shipped folder's size after excludes, at most (Ray's own upload limit is 512 MiB)
    node_death_s: float = 30.0  # after a node agent fails, how long Ray may take to say its node died (node failure vs rank failure)


def ray_section(cfg: Any) -> RayConfig:
    """A loaded config's ray: section (launcher.config.schema.config_class adds it: Config itself declares none)."""
    section: RayConfig = cfg.ray
    return section


def check_ray_config(cfg: Any) -> None:
    """Values of the ray section the type system cannot check; each message names the fix."""
    r = cfg.ray
    if r.gpus not in ("auto", "always", "never"):
        raise ConfigError(f"ray.gpus={r.gpus} is not one of: auto, always, never")
    if r.cpus_per_node < 0:
        raise ConfigError(f"ray.cpus_per_node={r.cpus_per_node} must be at least 0 (0 = one per worker)")
    if r.placement_timeout_s <= 0 or r.node_death_s <= 0:
        raise ConfigError("ray.placement_timeout_s and ray.node_death_s must be positive: e.g. ray.placement_timeout_s=60")
    if not 0 < r.ship_limit_mb <= 512:
        raise ConfigError(f"ray.ship_limit_mb={r.ship_limit_mb:g} must be above 0 and at most 512 (Ray's upload limit)")
    if cfg.cluster == "ray" and (cfg.rdzv.node_rank is not None or cfg.rdzv.master_addr or cfg.rdzv.endpoint):
        raise ConfigError("--cluster ray places the nodes and their rendezvous itself: drop --node-rank, "
                          "--master-addr and --rdzv-endpoint")
