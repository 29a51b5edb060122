"""The `run` command: argv's config -> the backend that takes it (launcher.backends.registry) -> a dry run or a launch."""

from __future__ import annotations

import argparse
from typing import List, Optional, Tuple

from launcher import prestart
from launcher.backends import registry
from launcher.clock import process_start_time
from launcher.config.rendezvous import check_port_is_used
from launcher.config.schema import Config, ScriptConfig, load_config, to_yaml
from launcher.errors import ConfigError


def resolve_config(args: argparse.Namespace, overrides: List[str], script: Optional[Tuple[str, bool, List[str]]]) -> Config:
    spec = None if script is None else ScriptConfig(path=script[0], module=script[1], args=list(script[2]))
    cfg = load_config(args.config, overrides, script=spec)
    check_port_is_used(cfg, overrides)
    return cfg


def run(args: argparse.Namespace, overrides: List[str], script: Optional[Tuple[str, bool, List[str]]]) -> int:
    started = process_start_time()
    cfg = resolve_config(args, overrides, script)
    if args.show_config:
        print(to_yaml(cfg), end="")
        return 0
    cfg = registry.adopt_allocation(cfg)  # inside a scheduler's job step: its nodes, node rank and node 0
    backend = registry.for_config(cfg)  # light: each backend loads torch, submitit or ray only in its methods
    wait = getattr(args, "wait", False)
    if wait and not backend.submits:
        submitting = " or ".join(f"--cluster {name}" for name, b in registry.clusters().items() if b.submits)
        raise ConfigError(f"--wait follows a submitted job: add {submitting} (a local run always waits)")
    if backend.submits:
        prestart.drop()  # a submitted job starts no worker here: a zygote forked at our start (a child's) ends now
    if args.dry_run:
        print(backend.dry_run(cfg), end="")
        return 0
    return backend.launch(cfg, started, wait)


def go_on(handover: bytes) -> int:
    """The launch that exec'd this process on its way (launcher.prestart), from where it was: nothing of it is parsed,
    resolved or planned again."""
    from launcher.backends.dispatch import go_on as launch_handed_over  # (torch is imported by now: see prestart)

    return launch_handed_over(handover)
