"""launch()/submit() keyword settings -> the command line's `key=value` overrides, and the config they resolve to.

A setting is a config key with its dots as underscores (`trainer_steps=10` is `trainer.steps=10`, `gpus=2` is
`gpus=2`); `python -m launcher --show-config` lists the keys. Nothing else is accepted: an unknown name is one
ValueError naming it, the nearest key and where the keys are listed. The values become the same overrides a
command line gives, so the child launcher resolves the same config this module validates up front.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from typing import Any, Dict, List, Optional

from launcher.config.schema import Config, ScriptConfig, config_class, load_config
from launcher.errors import ConfigError, SettingError

RESERVED = ("script",)  # the function is the script: its section is the API's own


def setting_names(section: Any = None, prefix: str = "") -> Dict[str, str]:
    """Every settable key: its underscore name -> its dotted config key (sections of sections walked; by default the
    whole config's, the engines' sections included)."""
    names: Dict[str, str] = {}
    for field in dataclasses.fields(section or config_class()):
        key = f"{prefix}{field.name}"
        if not prefix and field.name in RESERVED:
            continue
        kind = field.default_factory if field.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(kind):
            names.update(setting_names(kind, f"{key}."))
        else:
            names[key.replace(".", "_")] = key
    return names


NAMES = setting_names()
assert len(set(NAMES.values())) == len(NAMES), "two config keys share an underscore name"


def overrides_for(settings: Dict[str, Any]) -> List[str]:
    """The `key=value` overrides of settings, in the order given; an unknown name is a SettingError (a ValueError)."""
    overrides = []
    for name, value in settings.items():
        key = NAMES.get(name)
        if key is None:
            raise SettingError(unknown_setting(name))
        overrides.append(f"{key}={yaml_value(name, value)}")
    return overrides


def unknown_setting(name: str) -> str:
    if name.startswith("script"):
        return (f"setting '{name}': the function you pass is the job's script; pass its arguments positionally "
                f"(launch(fn, a, b)) or bind keywords with functools.partial")
    near = difflib.get_close_matches(name, NAMES, n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return (f"unknown setting '{name}': {hint}settings are config keys with '.' written as '_' "
            f"(trainer.steps -> trainer_steps=10); `python -m launcher --show-config` lists the keys")


def yaml_value(name: str, value: Any) -> str:
    """A Python value as the YAML text an override holds (JSON is YAML): 10, 0.5, true, null, "text", [1, 2]."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise SettingError(f"setting {name}={value!r}: not a plain value: give a number, text, true/false, "
                           f"None, or a list or dict of those") from None


def resolve(overrides: List[str], script: ScriptConfig) -> Config:
    """The config the child launcher will resolve from the same overrides; its errors as SettingError."""
    try:
        return load_config(None, overrides, label="settings", script=script)
    except SettingError:
        raise
    except ConfigError as e:
        raise SettingError(str(e)) from None


def world_size(cfg: Config, summary: Optional[Dict[str, Any]] = None) -> int:
    """How many ranks return a value: the run's own record where it has one, else the config's nodes x gpus."""
    recorded = (summary or {}).get("world_size")
    return recorded if isinstance(recorded, int) and recorded > 0 else cfg.nodes * cfg.gpus
