"""torchrun's command line (torch 2.7-2.15) in the launcher's own terms: `python -m launcher` accepts every flag of
`torchrun --help`, in both spellings, and turns them into its own flags and key=value overrides before its parser
runs; a flag that cannot mean here what it means to torchrun is refused in one line (exit 2), never dropped.

Pure: reads nothing but its arguments (the device counts come in through `Host`). The table of what each flag
becomes is docs/torchrun.md#replace-torchrun; keep the two alike.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

from launcher.config.elastic import RDZV_CONF_KEYS, check_rdzv_option, parse_nodes
from launcher.config.inputs import OVERRIDE
from launcher.config.rendezvous import split_endpoint
from launcher.errors import ConfigError

# Elastic membership (--nnodes MIN:MAX, MIN < MAX): a range becomes the launcher's --nodes MIN:MAX
# (launcher.config.elastic); off, it is refused in one line.
ELASTIC_NNODES = True

SWITCHES = {"--standalone", "--module", "--no-python", "--run-path", "--virtual-local-rank"}
VALUED = {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
          "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role", "--log-dir",
          "--redirects", "--tee", "--local-ranks-filter", "--duplicate-stdout-filters", "--duplicate-stderr-filters",
          "--node-rank", "--master-addr", "--master-port", "--local-addr", "--logs-specs", "--numa-binding",
          "--signals-to-handle", "--shutdown-timeout", "--log-line-prefix-template", "--print-completion"}
SHORT = {"-r": "--redirects", "-t": "--tee"}
# Spelled alike by the launcher: on their own (no flag below) they keep the launcher's meaning.
SHARED = {"--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint", "--rdzv-id", "--max-restarts"}
# torchrun's own flags: any of them (or an underscore spelling, -r, -t, --module) makes the line a torchrun one.
TORCHRUN_ONLY = (SWITCHES | VALUED) - SHARED
# The launcher's flags a torchrun flag also sets: both on one line would be two answers to one question.
SAME_AS = {"--nnodes": "--nodes", "--nproc-per-node": "--gpus", "--log-dir": "--output-dir"}
# Flags with no counterpart here: why, in the words of the refusal.
REFUSED = {
    "--no-python": "workers run Python here (forked from a warm interpreter): start the program from a Python "
                   "script (subprocess.run) and launch that",
    "--logs-specs": "each rank's output goes to <run dir>/logs/rank-<k>.log (docs/run-directory.md): drop it",
    "--numa-binding": "the launcher binds no worker to CPUs: drop it, or bind inside your script "
                      "(os.sched_setaffinity)",
    "--virtual-local-rank": "LOCAL_RANK is the worker's index on its node, as torchrun's default: drop it, or set "
                            "CUDA_VISIBLE_DEVICES in your script",
    "--signals-to-handle": "the launcher itself handles SIGINT, SIGTERM and SIGHUP (a checkpoint, then a stop): "
                           "drop it",
    "--log-line-prefix-template": "each rank's console lines are prefixed [rank<k>]: and its log file holds them "
                                  "unprefixed (docs/run-directory.md): drop it",
    "--print-completion": "it prints torchrun's own shell completion: run torchrun --print-completion for that",
}
# Values of a refused flag that ask for what the launcher does anyway: accepted.
HARMLESS = {"--event-log-handler": {"null"}, "--duplicate-stdout-filters": {""},
            "--duplicate-stderr-filters": {""}}
RDZV_CONF = {"join_timeout": "rdzv.timeout_s", "timeout": "rdzv.timeout_s"}
START_METHODS = {"spawn": "spawn", "fork": "fork", "forkserver": "fork"}  # forkserver: the zygote is one
LOOPBACK = ("127.", "localhost", "::1", "[::1]")
C10D_PORT = 29400  # torch's c10d rendezvous port where --rdzv-endpoint names only a host (torchrun's docs)


@dataclass(frozen=True)
class Host:
    """How torchrun's --nproc-per-node gpu|cpu|auto count this machine (torch.distributed.run)."""

    cuda_count: Callable[[], int]
    cpu_count: Callable[[], int]
    fresh_id: Callable[[], str] = lambda: str(uuid.uuid4())  # torchrun's run id on one node (--standalone)


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


HOST = Host(cuda_count=_cuda_count, cpu_count=lambda: os.cpu_count() or 1)


@dataclass
class Scan:
    """A command line taken apart: torchrun's flags (canonical name -> value, the last one given), everything
    else for the launcher's parser, and the script with its arguments."""

    given: Dict[str, str] = field(default_factory=dict)
    ours: List[str] = field(default_factory=list)
    script: List[str] = field(default_factory=list)
    module: bool = False
    torchrun: bool = False  # a torchrun command line: torchrun's defaults apply to the shared flags


def canonical(name: str) -> str:
    """`--nproc_per_node` -> `--nproc-per-node` (torchrun accepts either, not a mix); -r/-t -> their long names."""
    if name in SHORT:
        return SHORT[name]
    body = name[2:]
    return "--" + body.replace("_", "-") if name.startswith("--") and "-" not in body else name


def scan(argv: List[str], takes_value: Set[str]) -> Scan:
    """Split argv as torchrun's parser would (its flags, then the script) while keeping the launcher's flags
    (takes_value: those of them that take a value) and key=value overrides for its own parser."""
    found, i = Scan(), 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            found.script = argv[i + 1:]
            break
        if token in ("-m", "--module"):  # torchrun's switch; the launcher's `-m MODULE` reads the same
            found.module, found.torchrun = True, found.torchrun or token == "--module"
            i += 1
            continue
        name, value = _split_flag(token)
        flag = canonical(name)
        if flag in SWITCHES or flag in VALUED:
            if flag in SWITCHES and value is not None:
                raise ConfigError(f"{name} takes no value (got {name}={value}): write {name} alone")
            if flag in VALUED and value is None:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{name} needs a value, e.g. {name} 2")
                i, value = i + 1, argv[i + 1]
            found.given[flag] = value or ""
            found.torchrun = found.torchrun or flag in TORCHRUN_ONLY or name != flag
        elif token.startswith("-"):
            found.ours.append(token)
            if token in takes_value and i + 1 < len(argv):
                i += 1
                found.ours.append(argv[i])
        elif OVERRIDE.match(token):
            found.ours.append(token)
        else:
            found.script = argv[i:]
            break
        i += 1
    return found


def _split_flag(token: str) -> Tuple[str, Optional[str]]:
    """(name, value given in the same token or None): --flag=value, and -r3 / -t=3 as argparse reads them."""
    if token.startswith("--"):
        name, eq, value = token.partition("=")
        return name, value if eq else None
    if token[:2] in SHORT and len(token) > 2:
        return token[:2], token[2:].removeprefix("=")
    return token, None


def launcher_argv(argv: List[str], takes_value: Set[str], host: Host = HOST,
                  note: Callable[[str], None] = lambda line: None) -> List[str]:
    """argv with torchrun's flags turned into the launcher's; argv itself when it holds none of them.
    note: gets one line for each flag torchrun itself would ignore here (it logs a warning for those)."""
    found = scan(argv, takes_value)
    if not found.torchrun:  # the launcher's own command line: its flags keep their meaning (docs/several-machines.md)
        return argv
    own = {token.partition("=")[0] for token in found.ours}
    for flag, ours in SAME_AS.items():
        if flag in found.given and ours in own:
            raise ConfigError(f"{flag} and {ours} both given: they set the same thing, keep one")
    flags, overrides = translate(found, host, note)
    script = (["-m", *found.script] if found.module else ["--", *found.script]) if found.script else []
    if found.module and not found.script:
        raise ConfigError("-m/--module needs a module name after the flags, e.g. -m mypkg.train")
    return [*found.ours, *flags, *overrides, *script]


def translate(found: Scan, host: Host, note: Callable[[str], None]) -> Tuple[List[str], List[str]]:
    """(launcher flags, key=value overrides) for torchrun's flags in found.given; ConfigError for a refused one."""
    given = found.given
    for flag, why in REFUSED.items():
        if flag in given and given[flag] not in HARMLESS.get(flag, ()):
            raise ConfigError(f"torchrun's {flag} has no counterpart here: {why}")
    for flag in ("--event-log-handler", "--duplicate-stdout-filters", "--duplicate-stderr-filters"):
        if flag in given and given[flag] not in HARMLESS[flag]:
            raise ConfigError(f"torchrun's {flag} has no counterpart here: the launcher records its own events "
                              f"in the run directory (docs/run-directory.md): drop it")
    flags: List[str] = []
    nodes = nnodes(given["--nnodes"]) if "--nnodes" in given else _launcher_nodes(found.ours)
    if "--nnodes" in given:
        flags += ["--nodes", given["--nnodes"].strip() if ELASTIC_NNODES else str(nodes)]  # N or MIN:MAX
    if "--nproc-per-node" in given:
        flags += ["--gpus", str(nproc_per_node(given["--nproc-per-node"], host))]
    for flag in ("--max-restarts", "--log-dir"):
        if flag in given:
            flags += [SAME_AS.get(flag, flag), given[flag]]
    flags += rendezvous_flags(given, nodes, note)
    return flags, [*overrides(given), run_id_override(given, nodes, host)]


def _launcher_nodes(ours: List[str]) -> int:
    """The launcher's own --nodes N on a torchrun line (1 without it): the rendezvous rules depend on it."""
    for i, token in enumerate(ours):
        name, _, value = token.partition("=")
        if name == "--nodes":
            text = value or (ours[i + 1] if i + 1 < len(ours) else "1")
            try:
                return parse_nodes(text)[1]  # N, or MIN:MAX (elastic): the most
            except ConfigError:
                return 1  # not a number: the launcher's parser says so
    return 1


def nnodes(text: str) -> int:
    """torchrun's --nnodes N or MIN:MAX -> the node count; a range with MIN < MAX only once ELASTIC_NNODES is on."""
    low, sep, high = text.partition(":")
    try:
        least, most = int(low), int(high if sep else low)
    except ValueError:
        raise ConfigError(f"--nnodes expects N or MIN:MAX, got '{text}': e.g. --nnodes 2") from None
    if not 0 < least <= most:
        raise ConfigError(f"--nnodes {text}: need 0 < MIN <= MAX, e.g. --nnodes 2 or --nnodes 2:2")
    if least < most and not ELASTIC_NNODES:
        raise ConfigError(f"elastic membership (--nnodes MIN:MAX) is not supported yet: --nnodes {text} asks for "
                          f"{least} to {most} nodes; give a fixed count, e.g. --nnodes {most}")
    return most


def nproc_per_node(text: str, host: Host) -> int:
    """torchrun's --nproc-per-node: a number, gpu (CUDA devices), cpu (cores) or auto (GPUs if any, else cores)."""
    try:
        return int(text)  # as torchrun reads it: any sign and range, checked afterwards as --gpus
    except ValueError:
        pass
    if text == "cpu":
        return host.cpu_count()
    if text in ("gpu", "auto"):
        gpus = host.cuda_count()
        if gpus:
            return gpus
        if text == "gpu":
            raise ConfigError("--nproc-per-node gpu: no CUDA device here: give a number, or cpu/auto for one "
                              "worker per core")
        return host.cpu_count()
    raise ConfigError(f"--nproc-per-node {text}: the launcher takes a number, gpu, cpu or auto "
                      "(xpu and other accelerators: not supported)")


def rendezvous_flags(given: Dict[str, str], nodes: int, note: Callable[[str], None]) -> List[str]:
    """torchrun's rendezvous rules (torch.distributed.run.run) in the launcher's modes: single (a c10d store on a free
    loopback port), static (--node-rank/--master-addr/--master-port) or c10d (--rdzv-endpoint)."""
    backend = given.get("--rdzv-backend", "static")
    endpoint, rank = given.get("--rdzv-endpoint"), given.get("--node-rank")
    if "--standalone" in given:
        if nodes > 1:
            raise ConfigError(f"--standalone is one machine, {_nodes_given(given, nodes)} asks for up to {nodes}: "
                              "drop --standalone (the nodes then meet at --rdzv-endpoint HOST:PORT), or give --nnodes 1")
        ignored = [f for f in ("--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--node-rank", "--master-addr",
                               "--master-port") if f in given]
        for flag in ignored:
            note(f"note: --standalone: {flag} ignored, as torchrun ignores it (one machine, a free port)")
        return _local_addr(given, single=True)
    if backend not in ("static", "c10d"):
        raise ConfigError(f"--rdzv-backend {backend}: the launcher's rendezvous is static or c10d (torch's store, "
                          "no etcd): use --rdzv-backend c10d --rdzv-endpoint HOST:PORT")
    if backend == "c10d":
        if not endpoint:
            raise ConfigError("--rdzv-backend c10d needs --rdzv-endpoint HOST:PORT (the same on every node)")
        for flag in ("--node-rank", "--master-addr", "--master-port"):
            if flag in given:
                note(f"note: {flag} ignored: it is for the static rendezvous, and torchrun ignores it with c10d")
        endpoint, c10d_port = c10d_endpoint(endpoint)
        if c10d_port == 0:  # torchrun's "stacked single-node" line: the one node's agent picks a free port
            if nodes > 1:
                raise ConfigError(f"--rdzv-endpoint {given['--rdzv-endpoint']}: port 0 picks a free port, which the "
                                  f"other nodes of {_nodes_given(given, nodes)} cannot know: give the port they "
                                  f"meet on, e.g. --rdzv-endpoint HOST:{C10D_PORT}")
            return _local_addr(given, single=True)
        return ["--rdzv-endpoint", endpoint, *_rdzv_id(given), *_local_addr(given, single=False)]
    if not endpoint and "--master-port" not in given and nodes == 1:  # torchrun: a local c10d store on a free port
        for flag in ("--master-addr", "--rdzv-id"):
            if flag in given:
                note(f"note: {flag} ignored: one node with no --master-port meets on a free port, as under torchrun")
        return _local_addr(given, single=True)
    for flag in ("--master-addr", "--master-port"):
        if endpoint and flag in given:
            note(f"note: {flag} ignored: --rdzv-endpoint names node 0's address and port, as under torchrun")
    addr, port = (split_endpoint(endpoint) if endpoint
                  else (given.get("--master-addr", "127.0.0.1").strip("[]"), given.get("--master-port", "29500")))
    return ["--node-rank", rank or "0", "--master-addr", addr, "--master-port", str(port),
            *_rdzv_id(given), *_local_addr(given, single=nodes == 1 and addr.startswith(LOOPBACK))]


def _nodes_given(given: Dict[str, str], nodes: int) -> str:
    """How the line asked for its nodes: torchrun's --nnodes as written, else the launcher's --nodes (the most)."""
    return f"--nnodes {given['--nnodes']}" if "--nnodes" in given else f"--nodes {nodes}"


def c10d_endpoint(endpoint: str) -> Tuple[str, int]:
    """torchrun's c10d --rdzv-endpoint HOST[:PORT] -> (HOST:PORT, PORT): no port is torch's 29400; 0 is a free one."""
    text = endpoint.strip()
    if ":" not in text or (text.startswith("[") and text.endswith("]")):  # a host (or [v6] address) alone
        text = f"{text}:{C10D_PORT}"
    port = text.rpartition(":")[2]
    if port.isascii() and port.isdigit() and int(port) == 0:
        return text, 0
    return text, split_endpoint(text)[1]


def run_id_override(given: Dict[str, str], nodes: int, host: Host) -> str:
    """The workers' TORCHELASTIC_RUN_ID as torchrun gives it (torch.distributed.run.run): a fresh uuid where torchrun
    picks the rendezvous itself (--standalone, or one node with no rendezvous flag), else --rdzv-id, 'none' unless given."""
    picks_itself = ("--standalone" in given or nodes == 1 and given.get("--rdzv-backend", "static") == "static"
                    and "--rdzv-endpoint" not in given and "--master-port" not in given)
    value = host.fresh_id() if picks_itself else given.get("--rdzv-id", "none")
    return "rdzv.torchelastic_run_id='" + value.replace("'", "''") + "'"  # quoted: YAML would read 101 as a number


def _rdzv_id(given: Dict[str, str]) -> List[str]:
    return ["--rdzv-id", given["--rdzv-id"]] if given.get("--rdzv-id") not in (None, "none") else []


def _local_addr(given: Dict[str, str], single: bool) -> List[str]:
    """--local-addr: the address this node's store listens on and the others reach; on one machine, loopback."""
    addr = given.get("--local-addr")
    if addr is None or (single and addr.startswith(LOOPBACK)):
        return []
    if single:
        raise ConfigError(f"--local-addr {addr}: on one machine the workers' store listens on loopback only "
                          "(docs/security.md): drop it")
    return [f"rdzv.local_addr={addr}"]


def overrides(given: Dict[str, str]) -> List[str]:
    """The flags that are config keys with no flag of their own."""
    out: List[str] = []
    if "--start-method" in given:
        method = given["--start-method"]
        if method not in START_METHODS:
            raise ConfigError(f"--start-method {method}: choose spawn, fork or forkserver")
        out.append(f"launcher.start_method={START_METHODS[method]}")
    if "--role" in given:
        out.append(f"launcher.role={given['--role']}")
    if "--monitor-interval" in given:
        out.append(f"launcher.monitor_interval_s={_number(given, '--monitor-interval')}")
    if "--shutdown-timeout" in given:
        out.append(f"checkpoint.grace_s={_number(given, '--shutdown-timeout')}")
    if "--rdzv-conf" in given:
        out += rdzv_conf(given["--rdzv-conf"])
    if "--tee" in given:
        check_std("--tee", given["--tee"])  # the launcher tees both streams of every rank already
    if "--redirects" in given:
        check_std("--redirects", given["--redirects"])
        out.append(f"launcher.redirects='{given['--redirects']}'")
    if "--local-ranks-filter" in given:
        out.append(f"launcher.local_ranks_filter=[{local_ranks(given['--local-ranks-filter'])}]")
    return out


def local_ranks(text: str) -> str:
    """--local-ranks-filter 0,1,2 -> '0,1,2', each item read with int() as torchrun reads it ('²' passed isdigit())."""
    try:
        ranks = [int(item) for item in text.split(",")]
    except ValueError:
        raise ConfigError(f"--local-ranks-filter {text}: expects local ranks joined by commas, e.g. 0 or 0,1") from None
    return ",".join(map(str, ranks))


def rdzv_conf(text: str) -> List[str]:
    """--rdzv-conf k=v,...: join_timeout and timeout are the launcher's rendezvous timeout; torch's other dynamic
    rendezvous options (launcher.config.elastic.RDZV_CONF_KEYS: last_call_timeout, keep_alive_interval, ...) go to
    rdzv.conf; any other is refused."""
    out = []
    for item in filter(None, text.split(",")):
        key, _, value = item.strip().partition("=")
        if key in RDZV_CONF or key in RDZV_CONF_KEYS:
            check_rdzv_option(key, value, f"--rdzv-conf {item.strip()}")
        if key in RDZV_CONF:
            out.append(f"{RDZV_CONF[key]}={value}")
        elif key in RDZV_CONF_KEYS:
            out.append(f"rdzv.conf.{key}={value}")
        else:
            raise ConfigError(f"--rdzv-conf {key}: not a rendezvous option here: use join_timeout (or timeout) or "
                              f"one of {', '.join(k for k in RDZV_CONF_KEYS if k != 'join_timeout')}")
    return out


def _number(given: Dict[str, str], flag: str) -> float:
    try:
        return float(given[flag])
    except ValueError:
        raise ConfigError(f"{flag} expects seconds, got '{given[flag]}'") from None


def check_std(flag: str, text: str) -> None:
    """torchrun's Std format: 0-3, or local_rank:0-3 pairs joined by commas."""
    parts = [p.partition(":")[2] if ":" in p else p for p in text.split(",")]
    if not all(p in ("0", "1", "2", "3") for p in parts):
        raise ConfigError(f"{flag} {text}: expects 0-3 or LOCAL_RANK:0-3,... (e.g. {flag} 3)")
