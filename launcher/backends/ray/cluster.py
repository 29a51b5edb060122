"""The Ray cluster as this launcher uses it: connect, place one bundle per node, say where they are, clean up.

With launcher.backends.ray.actor, the only modules that import ray (an optional extra: `pip install -e .[ray]`).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from launcher.backends.ray.options import ray_section
from launcher.config.schema import Config
from launcher.errors import ConfigError

log = logging.getLogger("launcher")
INSTALL_HINT = "pip install -e .[ray]"


def import_ray() -> Any:
    """The ray module, or one line that says how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ConfigError(f"--cluster ray needs Ray, which is not installed here: {INSTALL_HINT} "
                          "(or pip install 'ray[default]')") from e
    return ray


def cluster_address(cfg: Config) -> str:
    """ray.address, else $RAY_ADDRESS, else `auto` inside a Ray job; one line naming the fix otherwise."""
    environ = os.environ  # read now: a caller of launcher.launch may set RAY_ADDRESS after importing us
    address = ray_section(cfg).address or environ.get("RAY_ADDRESS") or ("auto" if environ.get("RAY_JOB_ID") else None)
    if not address:
        raise ConfigError("--cluster ray needs the cluster's address: ray.address=HOST:PORT (the head's GCS port, "
                          "as `ray start --head` printed it) or export RAY_ADDRESS")
    return address


def connect(address: str, runtime_env: Optional[Dict[str, Any]] = None) -> Any:
    """ray.init on an existing cluster (never a new local one); one line when there is none at the address.

    runtime_env: the job's (launcher.backends.ray.code: the shipped working folder), for every actor it starts."""
    ray = import_ray()
    check_reachable(address)
    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False,
                 include_dashboard=False, namespace="launcher",
                 runtime_env=runtime_env)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = (str(e).strip().splitlines() or [e.__class__.__name__])[0][:200]
        raise ConfigError(f"no Ray cluster at ray.address={address} ({first}): start one with "
                          "`ray start --head`, or fix ray.address / RAY_ADDRESS") from e
    return ray


def check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """HOST:PORT answers TCP: ray.init would retry a dead address for minutes before saying so."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # `auto`, ray://...: ray.init resolves those itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ConfigError(f"no Ray cluster at ray.address={address} ({e.strerror or e.__class__.__name__}): start one "
                          "with `ray start --head`, or fix ray.address / RAY_ADDRESS") from e


@dataclass(frozen=True)
class Placement:
    """Where the job's bundles landed: node_rank K is bundle K."""

    group_name: str
    node_ids: List[str]
    ips: List[str]

    def to_dict(self) -> Dict[str, Any]:
        return {"placement_group": self.group_name,
                "placement": [{"node_rank": k, "ip": ip, "ray_node_id": nid} for k, (nid, ip) in enumerate(zip(self.node_ids, self.ips))]}


def bundle(cfg: Config, gpus: int) -> Dict[str, float]:
    cpus = ray_section(cfg).cpus_per_node or max(cfg.gpus, cfg.gpus * cfg.launcher.omp_threads)
    return {"CPU": float(cpus), **({"GPU": float(gpus)} if gpus else {})}


def gpus_to_request(cfg: Config, ray: Any) -> int:
    wanted = ray_section(cfg).gpus
    if wanted == "never" or (wanted == "auto" and not ray.cluster_resources().get("GPU")):
        return 0  # a CPU cluster: --gpus workers without GPUs
    return cfg.gpus


def place(ray: Any, cfg: Config, name: str, bundles: List[Dict[str, float]]) -> Any:
    """One STRICT_SPREAD placement group; removed again, with one line, when it cannot be placed in time."""
    from ray.util.placement_group import placement_group

    group = placement_group(bundles, strategy="STRICT_SPREAD", name=name)
    try:
        ready = group.wait(timeout_seconds=ray_section(cfg).placement_timeout_s)
    except BaseException:
        remove(ray, group)
        raise
    if not ready:
        remove(ray, group)
        alive = [n for n in ray.nodes() if n.get("Alive")]
        raise ConfigError(f"the Ray cluster cannot place {len(bundles)} node(s) x {bundles[0]} on distinct nodes within "
                          f"{ray_section(cfg).placement_timeout_s:g}s (it has {len(alive)} live node(s), "
                          f"{describe_resources(alive)}): lower --nodes/--gpus, set ray.cpus_per_node, or add nodes")
    return group


def describe_resources(nodes: List[Dict[str, Any]]) -> str:
    return ", ".join(f"{n['NodeManagerAddress']}: {n['Resources'].get('CPU', 0):g} CPU {n['Resources'].get('GPU', 0):g} GPU"
                     for n in nodes) or "none"


def where(ray: Any, group: Any, name: str) -> Placement:
    from ray.util import placement_group_table

    table = placement_group_table(group)["bundles_to_node_id"]
    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    ids = [table[k] for k in sorted(table)]
    return Placement(name, ids, [ips.get(i, "?") for i in ids])


def dead_nodes(ray: Any, node_ids: List[str]) -> List[str]:
    """Those of node_ids the cluster no longer counts as alive."""
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return [i for i in node_ids if i not in alive]


def remove(ray: Any, group: Optional[Any]) -> None:
    """Remove a placement group (and so any actor still in it); quiet where it is gone already."""
    if group is None:
        return
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception as e:  # the cluster went away: nothing of ours is left on it to remove
        log.warning(f"could not remove Ray placement group {group.id}: {e}")


