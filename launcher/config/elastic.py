"""Elastic membership (`--nodes MIN:MAX`, torchrun's `--nnodes MIN:MAX`): parsing, its rules, and torch's
rendezvous options (torchrun's `--rdzv-conf`).

Pure functions over the config. An elastic job starts once MIN nodes have joined torch's c10d rendezvous,
admits up to MAX, and re-forms without a lost node while at least MIN remain (docs/several-machines.md).
"""

from __future__ import annotations

from typing import Union, Any, Dict, Sequence, Tuple

from launcher.errors import ConfigError

# torch's dynamic rendezvous options a user may set (torchrun's --rdzv-conf), with what each holds
RDZV_CONF_KEYS = {
    "join_timeout": "seconds a node waits for the rendezvous to form (default: rdzv.timeout_s)",
    "last_call_timeout": "seconds the rendezvous waits for more nodes once MIN have joined (torch: 30)",
    "close_timeout": "seconds to close the rendezvous (torch: 30)",
    "heartbeat": "seconds between heartbeats (torch: 5)",
    "keep_alive_interval": "seconds between a node's keep-alives (torch: 5)",
    "keep_alive_max_attempt": "missed keep-alives before a node counts as lost (torch: 3)",
    "read_timeout": "seconds a store read may take (torch: 60)",
}


def parse_nodes(text: Union[int, str]) -> Tuple[int, int]:
    """'2' -> (2, 2); '1:4' -> (1, 4), as torchrun's --nnodes; a ConfigError naming the form otherwise."""
    low, sep, high = str(text).strip().partition(":")
    try:
        pair = (int(low), int(high)) if sep else (int(low), int(low))
    except ValueError:
        raise ConfigError(f"--nodes expects a whole number N, or MIN:MAX for an elastic job, got '{text}': "
                          "e.g. --nodes 2 or --nodes 1:4") from None
    if sep and not 1 <= pair[0] <= pair[1]:  # a single N is range-checked with the config (nodes)
        raise ConfigError(f"--nodes {text}: MIN:MAX needs 1 <= MIN <= MAX, e.g. --nodes 1:4")
    return pair


def nodes_overrides(text: str) -> Tuple[str, str]:
    """The config overrides `--nodes TEXT` stands for: `--nodes N` is N:N, a fixed membership."""
    low, high = parse_nodes(text)
    return f"nodes={high}", f"min_nodes={low}"


def min_nodes(cfg: Any) -> int:
    return cfg.nodes if cfg.min_nodes is None else cfg.min_nodes


def is_elastic(cfg: Any) -> bool:
    return min_nodes(cfg) < cfg.nodes


def spares(cfg: Any) -> int:
    return int(cfg.launcher.spares)


def re_forms(cfg: Any) -> bool:
    """The job re-forms when a node leaves or joins (torch's c10d rendezvous): elastic, or with hot spares waiting."""
    return is_elastic(cfg) or spares(cfg) > 0


def shown(cfg: Any) -> str:
    """How the command line spells the membership: '2', or '1:2' for an elastic one."""
    return f"{min_nodes(cfg)}:{cfg.nodes}" if is_elastic(cfg) else str(cfg.nodes)


def check_elastic(cfg: Any) -> None:
    """MIN in 1..MAX, torch's options known, and an elastic job on the one rendezvous that can re-form: c10d."""
    for key, value in cfg.rdzv.conf.items():
        if key not in RDZV_CONF_KEYS:
            raise ConfigError(f"rdzv.conf.{key} is not a rendezvous option: use one of {', '.join(RDZV_CONF_KEYS)}")
        check_rdzv_option(key, value, f"rdzv.conf.{key}={value}")
    if cfg.min_nodes is not None and not 1 <= cfg.min_nodes <= cfg.nodes:
        raise ConfigError(f"min_nodes={cfg.min_nodes} must be in 1..{cfg.nodes} (--nodes MIN:MAX, e.g. --nodes 1:{cfg.nodes})")
    if spares(cfg) < 0:
        raise ConfigError(f"--spares {spares(cfg)} must be 0 or more: the hot spare nodes beyond --nodes, e.g. --spares 1")
    if not re_forms(cfg):
        if cfg.launcher.evict_slow_after_s:
            check_eviction(cfg)
        return
    what = f"--nodes {shown(cfg)} (elastic)" if is_elastic(cfg) else f"--spares {spares(cfg)}"
    if cfg.rdzv.node_rank is not None or cfg.rdzv.master_addr:
        raise ConfigError(f"{what} needs the c10d rendezvous, which re-forms when nodes leave or "
                          "join: use --rdzv-endpoint HOST:PORT --rdzv-id ID on every node instead of --master-addr/--node-rank")
    if cfg.cluster != "local":
        raise ConfigError(f"{what} is not supported with --cluster {cfg.cluster}, which allocates "
                          f"a fixed set of nodes: use --nodes {cfg.nodes}")
    check_eviction(cfg)
    if spares(cfg) and cfg.launcher.max_restarts == 0:
        raise ConfigError(f"--spares {spares(cfg)} with --max-restarts 0: a spare takes a lost node's place in a restart "
                          f"of the workers, which counts as one: add --max-restarts K, e.g. --max-restarts {spares(cfg) + 2}")


def check_eviction(cfg: Any) -> None:
    """launcher.evict_slow_after_s: 0 (off) or seconds, and only where a spare can take the slow node's place."""
    after = cfg.launcher.evict_slow_after_s
    if isinstance(after, bool) or not isinstance(after, (int, float)) or not 0 <= after < float("inf"):
        raise ConfigError(f"launcher.evict_slow_after_s={after} must be 0 (off) or seconds, e.g. 60")
    if after and not spares(cfg):
        raise ConfigError(f"launcher.evict_slow_after_s={after:g} replaces a slow node with a hot spare, and this job "
                          f"has none: add --spares 1 (and one more node agent started), or drop the option")
    if after and not cfg.metrics.scripts and cfg.script.path is not None:
        raise ConfigError(f"launcher.evict_slow_after_s={after:g} judges nodes by the script's step records, which "
                          "metrics.scripts=false turns off: drop one of the two")


def check_rdzv_option(key: str, value: Any, shown: str) -> None:
    """Each option is a whole number above 0, as torch reads it (int() of the text; its timeouts must be positive):
    refused here in one line, before anything starts, not in a torch traceback once the node meets the others."""
    try:
        number = None if isinstance(value, (bool, float)) else int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < 1:
        what = RDZV_CONF_KEYS.get(key, RDZV_CONF_KEYS["join_timeout"])  # torchrun's timeout is join_timeout
        raise ConfigError(f"{shown}: {key} is {what}, a whole number above 0: "
                          f"e.g. {shown.partition('=')[0]}=5")


def rdzv_options(conf: Dict[str, Any]) -> Dict[str, Any]:
    """The user's rendezvous options as torch reads them (it parses strings itself)."""
    return {key: value for key, value in conf.items() if key in RDZV_CONF_KEYS}


def round_line(round_no: int, nodes: Sequence[str], world_size: int, least: int, most: int, spares: int = 0) -> str:
    """What one round of an elastic job runs, said as it forms (the start line states only MIN:MAX): the agent's
    hook after each rendezvous passes its round record (launcher.agent.membership: round, nodes, world_size)."""
    count = len(nodes)
    shape = f"--nodes {least}:{most}" if least < most else f"--nodes {most}"
    shape += f" --spares {spares}" if spares else ""
    return (f"elastic round {round_no}: running {world_size} worker{'' if world_size == 1 else 's'} on {count} "
            f"node{'' if count == 1 else 's'} ({shape})")
