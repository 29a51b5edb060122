"""Multi-node settings: which kind of launch a config asks for, and the rendezvous every node agrees on.

Pure functions over the config: no sockets (launcher.backends.handshake) and no processes
(launcher.backends.simulated). Four modes:
  single     one node, this machine (c10d on a free loopback port)
  simulated  --nodes N with no address: all N node agents on this machine (static rendezvous, free port;
             c10d for an elastic --nodes MIN:MAX, its store hosted by the launcher that starts the nodes)
  static     --node-rank K --master-addr HOST --master-port PORT on every machine
  c10d       --rdzv-endpoint HOST:PORT on every machine; ranks assigned on arrival, worker counts may differ
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from launcher.config.elastic import rdzv_options, re_forms, spares
from launcher.errors import ConfigError

MODES = ("single", "simulated", "static", "c10d")
# An elastic job counts a lost node as gone after 3 missed 1 s keep-alives (torch's default: 3 of 5 s): with a hot
# spare, the spare takes its place (loss to the next step 6.6 s, not 12+); without one, the survivors re-form 12 s
# sooner. A live node stalled that long is dropped too, and nodes outside the job's round could form a second job
# beside it. Our handler fences it (launcher.runtime.torch_private: at its agent's next look it stops its workers
# and joins again), so that costs a restart where the outsiders cannot form a job before that look: where they
# cannot make MIN at all (2 x MIN > MAX + spares), or where there are no spares (a node joining is in its first
# round, which waits the whole last_call_timeout, 30 s, unless MAX are in at once, which nodes outside a running
# job are not). With spares that could make MIN of their own, torch's 5 s x 3 stays. Each keep-alive rewrites the
# rendezvous state (82 bytes a node): for hundreds of nodes set rdzv.conf.keep_alive_interval=5.
QUICK_KEEP_ALIVE = {"keep_alive_interval": 1, "keep_alive_max_attempt": 3}
_UNSAFE_ID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def launch_mode(cfg: Any) -> str:
    r = cfg.rdzv
    if r.endpoint:
        return "c10d"
    if r.node_rank is not None or r.master_addr:
        return "static"
    return "simulated" if cfg.nodes > 1 or spares(cfg) else "single"


def validate_rendezvous(cfg: Any) -> None:
    """Multi-node flags that contradict each other or are out of range; each message names the fix."""
    r = cfg.rdzv
    if r.endpoint and (r.node_rank is not None or r.master_addr):
        raise ConfigError("--rdzv-endpoint (c10d) and --node-rank/--master-addr (static) are two kinds of "
                          "rendezvous: give one of them on every node")
    check_port(r.master_port, "--master-port")
    if r.endpoint:
        split_endpoint(r.endpoint)
    if r.master_addr is not None and r.node_rank is None:
        raise ConfigError(f"--master-addr {r.master_addr} needs --node-rank K: 0 on the machine at that address, "
                          f"1..{max(cfg.nodes - 1, 1)} on the others")
    if r.node_rank is not None:
        if not 0 <= r.node_rank < cfg.nodes:
            raise ConfigError(f"--node-rank {r.node_rank} is outside 0..{cfg.nodes - 1} for --nodes {cfg.nodes}: "
                              f"number the machines 0..{cfg.nodes - 1}, one rank each")
        if cfg.nodes > 1 and not r.master_addr:
            raise ConfigError(f"--node-rank {r.node_rank} needs --master-addr HOST: the address of the machine "
                              "started with --node-rank 0, the same on every node")
    if r.id is not None and not _UNSAFE_ID_CHARS.sub("", r.id):
        raise ConfigError(f"--rdzv-id '{r.id}' has no usable characters: use letters, digits, '-', '_' or '.'")


def check_port(port: int, flag: str) -> None:
    if not 1 <= port <= 65535:
        raise ConfigError(f"{flag} {port} is outside 1..65535: pick a free TCP port, e.g. 29500")


def split_endpoint(endpoint: str) -> Tuple[str, int]:
    """'HOST:PORT' (or '[v6]:PORT') -> (host, port), or a ConfigError naming the expected form."""
    host, sep, port_text = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isascii() or not port_text.isdigit():
        raise ConfigError(f"--rdzv-endpoint {endpoint} is not HOST:PORT: write it like node0.example.com:29400")
    if int(port_text) == 0:  # torchrun's one-node meaning of port 0 is taken before this (launcher.config.torchrun_flags)
        raise ConfigError(f"--rdzv-endpoint {endpoint}: port 0 (a free port) is for one node, which needs no "
                          "endpoint: leave --rdzv-endpoint out, or give the port the nodes meet on, e.g. HOST:29400")
    check_port(int(port_text), "--rdzv-endpoint port")
    return host, int(port_text)


def shared_run_id(cfg: Any) -> Optional[str]:
    """The run id every node of a real multi-node job derives alike, so they share one run directory name.

    --rdzv-id when given, else the rendezvous address and port (both are on every node's command
    line). None for single and simulated runs, which get a fresh id, and for a one-node job without
    --rdzv-id: no other node needs to find its directory, and `torchrun --nproc-per-node 2 --master-port P
    train.py` run again (a common line: a fixed port beside other jobs) is a new run, as under torchrun,
    not a second launch on the first one's run id.
    """
    if cfg.nodes == 1 and not cfg.rdzv.id:
        return None
    mode = launch_mode(cfg)
    if mode == "c10d":
        host, port = split_endpoint(cfg.rdzv.endpoint)
    elif mode == "static":
        host, port = cfg.rdzv.master_addr or "127.0.0.1", cfg.rdzv.master_port
    else:
        return None
    raw = cfg.rdzv.id if cfg.rdzv.id else f"{host}-{port}"
    return "job-" + _UNSAFE_ID_CHARS.sub("_", raw).strip("_")


def rendezvous_fields(cfg: Any, run_id: str, free_port: int = 0) -> Dict[str, Any]:
    """The plan's rendezvous fields; free_port is a port the caller found free (simulated mode)."""
    mode = launch_mode(cfg)
    fields: Dict[str, Any] = {"mode": mode, "node_rank": cfg.rdzv.node_rank, "rdzv_id": run_id}
    if mode == "single":
        # static, as torchrun's own one-node default: c10d's first round sleeps a random 0-0.3 s, which a launch pays
        fields.update(rdzv_backend="static", rdzv_endpoint="127.0.0.1:0")
    elif mode == "simulated":
        backend = "c10d" if re_forms(cfg) else "static"  # only c10d re-forms without a lost node
        fields.update(rdzv_backend=backend, rdzv_endpoint=f"127.0.0.1:{free_port}")
    elif mode == "static":
        addr = cfg.rdzv.master_addr or "127.0.0.1"
        fields.update(rdzv_backend="static", rdzv_endpoint=f"{addr}:{cfg.rdzv.master_port}")
    else:
        host, port = split_endpoint(cfg.rdzv.endpoint)
        fields.update(rdzv_backend="c10d", rdzv_endpoint=f"{host}:{port}",
                      rdzv_id=_UNSAFE_ID_CHARS.sub("_", cfg.rdzv.id) if cfg.rdzv.id else run_id)
    if cfg.rdzv.torchelastic_run_id is not None:  # torch's run id (the workers' TORCHELASTIC_RUN_ID), as torchrun's
        fields.update(rdzv_id=cfg.rdzv.torchelastic_run_id)
    if mode in ("static", "c10d"):  # a job across machines: its nodes sign what they share (docs/security.md)
        fields.update(rdzv_secret_file=cfg.rdzv.secret_file)
    return fields


def rdzv_configs(plan: Any) -> Dict[str, Any]:
    """torch's rendezvous options: the static backend needs this node's rank and its own timeout."""
    spares, least = getattr(plan, "spares", 0), getattr(plan, "min_nodes", None) or plan.nodes
    # elastic, and no second job can form before a dropped node fences itself: it costs a restart (see above)
    quick = (least < plan.nodes or spares) and (not spares or 2 * least > plan.nodes + spares)
    configs: Dict[str, Any] = {"join_timeout": plan.rdzv_timeout_s, **(QUICK_KEEP_ALIVE if quick else {}),
                               **rdzv_options(getattr(plan, "rdzv_conf", {}))}
    if plan.rdzv_backend == "static":
        configs.update(rank=plan.node_rank or 0, timeout=plan.rdzv_timeout_s)
    elif plan.mode == "simulated":  # the launcher that started the nodes hosts the store: any node may be lost
        configs.update(is_host=False)
    return configs


def check_port_is_used(cfg: Any, overrides: List[str]) -> None:
    """A master port given on the command line must matter: one machine's runs pick a free port themselves."""
    if not any(item.split("=", 1)[0] == "rdzv.master_port" for item in overrides):
        return
    mode = launch_mode(cfg)
    if mode in ("single", "simulated"):
        where = "a single-node run" if mode == "single" else f"--nodes {cfg.nodes} on this one machine"
        raise ConfigError(f"--master-port is not used by {where} (it picks a free port): drop it, or for a "
                          "job across machines add --node-rank K --master-addr HOST on every node")
