"""The `run` command: argv's config -> a SLURM submission, or a launch here (launcher.backends.dispatch)."""

from __future__ import annotations

import argparse
from typing import List, Optional, Tuple

from launcher.backends.slurm.environment import adopt_allocation, should_submit
from launcher import interrupts
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
    cfg = adopt_allocation(cfg)  # inside a SLURM job step: its nodes, node rank and node 0
    wait = getattr(args, "wait", False)
    if wait and not (should_submit(cfg) or cfg.cluster == "ray"):
        raise ConfigError("--wait follows a submitted job: add --cluster slurm or --cluster ray (a local run always waits)")
    # Imported here, not at the top: both load torch (and submitit), which a run should start loading
    # only once its zygote is on its way (launcher.backends.dispatch; bench/startup.py).
    if should_submit(cfg):
        from launcher.backends.slurm.submit import submit

        interrupts.release()  # submitting and --wait talk to SLURM for as long as it takes: Ctrl-C works there
        return submit(cfg, dry_run=args.dry_run, wait=wait)
    if cfg.cluster == "ray":  # the only import of the Ray backend: ray itself stays an optional extra
        from launcher.backends.ray.submit import submit as submit_to_ray

        interrupts.release()
        return submit_to_ray(cfg, dry_run=args.dry_run, wait=wait)
    from launcher.backends.dispatch import launch

    return launch(cfg, args.dry_run, started)
