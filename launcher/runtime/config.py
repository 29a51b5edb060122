"""The config as a worker reads it: the built-in trainer's settings from argv (run under plain
torchrun) and the record of them that goes to W&B, secrets redacted."""

from __future__ import annotations

from typing import Any, Dict, List

from launcher.config.schema import Config, load_config, to_dict
from launcher.config.secrets import redact


def read_config(overrides: List[str]) -> Config:
    """Built-in defaults < KEY=VALUE overrides, validated as the launcher validates them."""
    return load_config(None, overrides)


def config_record(cfg: Config) -> Dict[str, Any]:
    """The config as a plain dict with anything that looks like a secret redacted (for loggers)."""
    return redact(to_dict(cfg))
