"""`python -m launcher doctor`: check this machine for what a distributed job needs (ok / warn / FAIL, a hint for each
problem); `--comm` adds an all-reduce bandwidth test.

Without --comm it starts no process group and no worker, so it answers in a few seconds.
Exit code 1 when any check FAILs (or the bandwidth job fails), else 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, List

from launcher.config.schema import Config, load_config
from launcher.usage import OneLineParser
from launcher.commands.doctor_comm import check_sizes, run_comm_test

OK, WARN, FAIL = "ok", "warn", "FAIL"
MIN_PYTHON = (3, 10)  # setup.cfg python_requires
MIN_TORCH = (2, 4)  # setup.cfg install_requires
DEFAULT_MASTER_PORT = 29500  # torchrun's default; something already listening there breaks its users
SLURM_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf")
LOW_DISK_FAIL, LOW_DISK_WARN = 1 << 30, 10 << 30


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # ok | warn | FAIL
    detail: str
    hint: str = ""  # what to do about a warn or FAIL


def check_python() -> List[Check]:
    version = platform.python_version()
    if sys.version_info < MIN_PYTHON:
        return [Check("python", FAIL, version, f"use Python {'.'.join(map(str, MIN_PYTHON))} or newer")]
    return [Check("python", OK, f"{version} ({sys.executable})")]


def check_torch() -> List[Check]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return [Check("torch", FAIL, f"cannot import torch ({e})", "pip install torch (torch==2.13.0 for the CPU build)")]
    cuda = torch.version.cuda
    old = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) < MIN_TORCH
    checks = [Check("torch", FAIL if old else OK, f"{torch.__version__}, CUDA build {cuda or 'none (CPU build)'}",
                    f"pip install 'torch>={'.'.join(map(str, MIN_TORCH))}'" if old else "")]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gloo = dist.is_available() and dist.is_gloo_available()
    checks.append(Check("gloo", OK if gloo else FAIL, "built in" if gloo else "not built in",
                        "" if gloo else "install a torch build with distributed support"))
    nccl = dist.is_available() and dist.is_nccl_available()
    if nccl:
        version = ".".join(map(str, torch.cuda.nccl.version()))
        checks.append(Check("nccl", OK, f"built in, version {version}"))
    elif gpus:
        checks.append(Check("nccl", FAIL, "not built in, but CUDA devices are present",
                            "install a torch build with NCCL (the CUDA wheels from pytorch.org have it)"))
    else:
        checks.append(Check("nccl", OK, "not built in (no GPU: workers use gloo)"))
    checks.append(check_gpus(torch, gpus))
    return checks


def check_gpus(torch: ModuleType, count: int) -> Check:
    if count == 0:
        hint = "no CUDA device: --gpus G runs G CPU workers with gloo"
        if torch.version.cuda and os.environ.get("CUDA_VISIBLE_DEVICES") == "":
            hint = "CUDA_VISIBLE_DEVICES is empty: unset it to see the GPUs"
        return Check("gpus", WARN, "0", hint)
    cards = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        cards.append(f"{i}: {props.name} {props.total_memory / 2**30:.0f} GiB")
    return Check("gpus", OK, f"{count} ({'; '.join(cards)})")


def check_network() -> List[Check]:
    import psutil

    host = socket.gethostname()
    try:
        address = socket.gethostbyname(host)
        loopback = address.startswith("127.")
        checks = [Check("hostname", WARN if loopback else OK, f"{host} -> {address}",
                        "resolves to loopback: fine on one node; for several, give other nodes this node's "
                        "real address (rendezvous endpoint), not its hostname" if loopback else "")]
    except OSError as e:
        checks = [Check("hostname", FAIL, f"{host} does not resolve ({e.strerror or e})",
                        f"add '127.0.1.1 {host}' (or the node's address) to /etc/hosts")]
    interfaces = {name: [a.address for a in addrs if a.family == socket.AF_INET]
                  for name, addrs in psutil.net_if_addrs().items()}
    listed = ", ".join(f"{n} {' '.join(a)}" for n, a in sorted(interfaces.items()) if a)
    routable = [n for n, a in interfaces.items() if any(not ip.startswith("127.") for ip in a)]
    checks.append(Check("interfaces", OK if routable else WARN, listed or "no IPv4 address",
                        "" if routable else "only loopback: other machines cannot reach this one (single-node jobs only)"))
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        wanted = os.environ.get(var)
        if wanted:
            missing = [n for n in wanted.lstrip("^=").split(",") if n and not wanted.startswith("^") and n not in interfaces]
            checks.append(Check(var.lower(), FAIL if missing else OK, wanted,
                                f"no interface named {', '.join(missing)}: pick one of {', '.join(sorted(interfaces))}" if missing else ""))
    return checks


def check_ports() -> List[Check]:
    try:
        with socket.socket() as s:
            s.bind(("", 0))
            free = s.getsockname()[1]
    except OSError as e:
        return [Check("ports", FAIL, f"cannot open a listening socket ({e.strerror or e})",
                      "check the firewall or sandbox: rendezvous and gloo need listening TCP ports")]
    checks = [Check("ports", OK, f"can listen (got free port {free})")]
    with socket.socket() as s:
        try:
            s.bind(("", DEFAULT_MASTER_PORT))
            checks.append(Check("port 29500", OK, "free (torchrun's default MASTER_PORT)"))
        except OSError:
            checks.append(Check("port 29500", WARN, "in use",
                                "another job or stale process holds torchrun's default port: set MASTER_PORT for torchrun jobs"))
    return checks


def check_slurm() -> List[Check]:
    job = os.environ.get("SLURM_JOB_ID")
    clients = [c for c in ("sinfo", "squeue", "srun", "sbatch") if shutil.which(c)]
    if not clients:
        if job:
            return [Check("slurm", FAIL, f"inside job {job} but no SLURM client on PATH", "load the SLURM module or fix PATH")]
        return [Check("slurm", OK, "no client installed (local and multi-node launches only)")]
    checks = [Check("slurm", OK, f"clients: {', '.join(clients)}")]
    conf = os.environ.get("SLURM_CONF") or next((c for c in SLURM_CONFS if os.path.isfile(c)), None)
    if conf and "sinfo" in clients:
        checks.append(_slurm_partitions(conf, inside_job=bool(job)))
    elif "sinfo" in clients:
        checks.append(Check("slurm partitions", WARN, "no slurm.conf found", "set SLURM_CONF=/path/to/slurm.conf"))
    if job:
        nodes = os.environ.get("SLURM_JOB_NODELIST", "?")
        checks.append(Check("slurm allocation", OK, f"inside job {job} on {nodes}, {os.environ.get('SLURM_NTASKS', '?')} tasks"))
    else:
        checks.append(Check("slurm allocation", OK, "not inside an allocation (SLURM_JOB_ID unset)"))
    return checks


def _slurm_partitions(conf: str, inside_job: bool) -> Check:
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        out = None
    if out is None or out.returncode != 0:
        why = "timed out" if out is None else (out.stderr.strip().splitlines() or ["failed"])[0]
        return Check("slurm partitions", FAIL if inside_job else WARN, f"sinfo: {why}",
                     f"is slurmctld running and is {conf} the cluster's config (SLURM_CONF)?")
    parts = ", ".join(out.stdout.split()) or "none"
    return Check("slurm partitions", OK if parts != "none" else WARN, f"{parts} ({conf})",
                 "" if parts != "none" else "the cluster has no partition: ask the admins")


def check_wandb(cfg: Config) -> List[Check]:
    """Mode and whether a key is there; the key's value is never read into any output."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("wandb")
    except importlib.metadata.PackageNotFoundError:
        version = None
    env_mode = os.environ.get("WANDB_MODE")
    mode = cfg.wandb.mode
    detail = f"wandb.mode={mode}" + (f", WANDB_MODE={env_mode} in the environment" if env_mode else "")
    has_key = bool(os.environ.get("WANDB_API_KEY"))
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    in_netrc = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")
    key = "WANDB_API_KEY is set" if has_key else ("a key in ~/.netrc" if in_netrc else "no key")
    checks = [Check("wandb", OK if version or mode == "disabled" else FAIL,
                    f"{version or 'not installed'}; {detail}; {key}",
                    "" if version or mode == "disabled" else "pip install wandb, or set wandb.mode=disabled")]
    if (mode == "online" or env_mode == "online") and not (has_key or in_netrc):
        checks.append(Check("wandb key", FAIL, "online mode but no key",
                            "set WANDB_API_KEY or run `wandb login`, or use wandb.mode=offline and `wandb sync` later"))
    return checks


def check_disk(cfg: Config) -> List[Check]:
    out = Path(cfg.output_dir).resolve()
    probe = out
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    detail = f"{out}: {free / 2**30:.1f} GiB free"
    if not os.access(probe, os.W_OK):
        return [Check("disk", FAIL, f"{detail}, not writable", "pick a writable place with output_dir=PATH")]
    if free < LOW_DISK_FAIL:
        return [Check("disk", FAIL, detail, "free some space or set output_dir=PATH elsewhere")]
    if free < LOW_DISK_WARN:
        return [Check("disk", WARN, detail, "checkpoints may not fit: free space or set output_dir=PATH")]
    return [Check("disk", OK, detail)]


def run_checks(cfg: Config) -> List[Check]:
    groups: List[Callable[[], List[Check]]] = [
        check_python, check_torch, check_network, check_ports, check_slurm,
        lambda: check_wandb(cfg), lambda: check_disk(cfg),
    ]
    return [check for group in groups for check in group()]


def print_checks(checks: List[Check]) -> None:
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{c.verdict:<4}  {c.name:<{width}}  {c.detail}")
        if c.hint and c.verdict != OK:
            print(f"{'':<4}  {'':<{width}}  -> {c.hint}")
    fails = sum(c.verdict == FAIL for c in checks)
    warns = sum(c.verdict == WARN for c in checks)
    print(f"verdict: {'FAIL' if fails else 'ok'} ({fails} failed, {warns} warnings, {len(checks)} checks)")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m launcher doctor",
                      description="Check this machine for distributed training; --comm also measures all-reduce bandwidth.")
    p.add_argument("--comm", action="store_true", help="run a real all-reduce bandwidth test through the launcher")
    p.add_argument("--gpus", type=int, default=None, metavar="N", help="workers per node for --comm (default: GPUs, or 2)")
    p.add_argument("--nodes", type=int, default=1, metavar="M", help="nodes for --comm (default 1)")
    p.add_argument("--max-bytes", type=int, default=64 << 20, metavar="B", help="largest message for --comm (default 64 MiB)")
    p.add_argument("--config", metavar="FILE", help="a YAML config (for output_dir and wandb.mode)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. output_dir=/scratch/runs")
    return p


def main(argv: List[str]) -> int:
    args = build_parser().parse_args(argv)  # usage errors: launcher.usage.with_error_contract turns SystemExit into the exit code
    cfg = load_config(args.config, args.overrides)
    if args.comm:
        check_sizes(args)  # before the checks: a bad size is a one-line error, not a report then an error
    checks = run_checks(cfg)
    print_checks(checks)
    failed = any(c.verdict == FAIL for c in checks)
    if args.comm:
        failed = run_comm_test(args, cfg) != 0 or failed
    return 1 if failed else 0
