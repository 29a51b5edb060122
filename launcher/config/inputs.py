"""Checks on raw user input that the schema's types let through: override syntax, a YAML file's
shape, non-finite numbers, `~` in paths and run ids that are not plain names.

Pure functions: each raises ConfigError with the problem and the fix, and reads nothing but its
arguments. (launcher.config.schema calls them while loading and validating.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterator, List, Tuple

import yaml

from launcher.errors import ConfigError

RUN_ID_MAX_BYTES = 255  # NAME_MAX: a run id is one directory name under output_dir
_CLOSING = {"]": "[", "}": "{"}


def check_override_value(key: str, value: str) -> None:
    """Brackets and braces in an override's value must balance (YAML would fail or keep a stray ']')."""
    stack: List[str] = []
    for char in value:
        if char in "[{":
            stack.append(char)
        elif char in _CLOSING and (not stack or stack.pop() != _CLOSING[char]):
            stack.append(char)  # an unmatched closer: reported below like an unclosed opener
            break
    if stack:
        raise ConfigError(f"override {key}=...: the value's brackets or braces do not balance: "
                          f"write a list as {key}=[a,b] and a map as {key}='{{k: v}}' (quoted for the shell)")


def parse_yaml_mapping(text: str, where: str) -> Any:
    """A config file's text -> its top-level mapping, or an error naming what it is instead."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
        raise ConfigError(f"{where} is not valid YAML ({first}): fix the file") from e
    if data is None:
        raise ConfigError(f"{where} is empty: a config file holds key: value lines, e.g. `trainer: {{steps: 50}}`")
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a single value ({type(data).__name__})"
        raise ConfigError(f"{where} holds {kind} at the top level, not a mapping: "
                          "write key: value lines, e.g. `trainer: {steps: 50}`")
    return data


def check_finite(config: Any) -> None:
    """No nan or inf anywhere: they pass every comparison-based range check and break training later."""
    for name, value in _leaves(config, ""):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}={value} is not a finite number: give a real value, e.g. {name}=0.001")


def _leaves(obj: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, f"{name}.")
        else:
            yield name, value


def check_no_tilde(value: Any, name: str) -> None:
    """`key=~/x` reaches us unexpanded (the shell expands ~ only at the start of a word)."""
    if isinstance(value, str) and value.startswith("~"):
        flag = " or --output-dir ~/..." if name == "output_dir" else ""
        raise ConfigError(f"{name}={value}: '~' is not expanded in key=value (it would create a directory named '~'): "
                          f"write {name}=$HOME{value[1:]}{flag}")


def check_run_id(run_id: str) -> None:
    """A run id is one directory name: no path, no control characters, not too long."""
    if run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id:
        raise ConfigError(f"run_id={run_id!r} is not a name: use letters, digits, '-', '_' or '.' "
                          "(no '/', and not '.' or '..'); to choose where runs go, set output_dir")
    if any(ord(c) < 32 or ord(c) == 127 for c in run_id):
        raise ConfigError(f"run_id={run_id!r} holds control characters: use letters, digits, '-', '_' or '.'")
    size = len(run_id.encode("utf-8"))
    if size > RUN_ID_MAX_BYTES:
        raise ConfigError(f"run_id is {size} bytes long, more than a directory name may be "
                          f"({RUN_ID_MAX_BYTES}): pick a shorter run_id")
