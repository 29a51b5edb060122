"""Checks on raw user input that the schema's types let through: override syntax, a YAML file's
shape, non-finite numbers, `~` in paths and run ids that are not plain names.

Pure functions: each raises ConfigError with the problem and the fix, and reads nothing but its
arguments. (launcher.config.schema calls them while loading and validating.)
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterator, List, Optional, Tuple

from launcher.config.yaml_limits import load_yaml
from launcher.errors import ConfigError

OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")  # a key=value item on the command line
RUN_ID_MAX_BYTES = 255  # NAME_MAX: a run id is one directory name under output_dir
_CLOSING = {"]": "[", "}": "{"}


def check_override(item: str) -> Tuple[str, str]:
    """A `key=value` item -> (key, value) once its text, key and value are well-formed; ConfigError otherwise."""
    if not is_utf8(item):
        raise ConfigError(f"override {_shown(item.split('=', 1)[0])}=...: holds bytes that are not UTF-8 text: "
                          "config keys and values must be UTF-8; retype it (check the terminal's encoding)")
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not key=value: write it like trainer.steps=50")
    key, value = item.split("=", 1)
    if not all(key.split(".")):
        raise ConfigError(f"override {key}=...: the key has an empty part (a '.' at its start or end, or '..'): "
                          f"write it like trainer.steps=50")
    if "\n" in value or "\r" in value:  # YAML folds a line break into a space: s3://b/a<newline>b became s3://b/a b
        raise ConfigError(f"override {key}=...: the value holds a line break, which would be read as a space: "
                          "retype it on one line")
    check_override_value(key, value)
    if key == "run_id" and _has_control_characters(value.strip()):  # the text YAML keeps: a plain scalar loses its outer blanks
        check_run_id(value.strip())  # said here: the YAML reader of omegaconf 2.3 (Hydra's pin) fails on a tab, "not valid YAML"
    check_keys(load_yaml(value, f"override {key}=...: the value", fix=None), f"override {key}=...: the value", key)
    return key, value  # load_yaml: its limits; OmegaConf reads it (load_config)


def misread_override(word: str) -> Optional[str]:
    """Why a bare word that names no file is a key=value override gone wrong (it was taken for the script's path:
    the key holds characters a config key cannot), else None."""
    key, eq, value = word.partition("=")
    if not eq or "/" in key:
        return None
    if not key:
        return f"'{_shown(word)}' has no key before '=': write an override like trainer.steps=50"
    if not is_utf8(key):
        return (f"override {_shown(key)}=...: the key holds bytes that are not UTF-8 text: config keys are names "
                "of letters, digits, '_' and '.'; retype it (check the terminal's encoding)")
    if key.rstrip("-+") != key and OVERRIDE.match(f"{key.rstrip('-+')}="):  # trainer.steps-=5: no operators here
        return f"override {key}=...: '{key[len(key.rstrip('-+')):]}=' is not an override's form: write " \
               f"{key.rstrip('-+')}={_shown(value)}"
    fixed = key.strip("-").replace("-", "_")
    if fixed != key and OVERRIDE.match(f"{fixed}="):
        return f"override {key}=...: config keys are spelled with '_', not '-': write {fixed}={_shown(value)}"
    return (f"override {_shown(key)}=...: '{_shown(key)}' is not a config key (letters, digits, '_' and '.'): "
            "write it like trainer.steps=50 (`python -m launcher --show-config` lists the keys)")


def check_keys(data: Any, where: str, prefix: str = "") -> None:
    """Every key of a mapping (a config file, an override's {..} value) is a name: YAML lets '' and null be keys."""
    if isinstance(data, list):
        for item in data:
            check_keys(item, where, prefix)
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        if key is None or (isinstance(key, str) and not key.strip()):
            under = f" under '{prefix}'" if prefix else ""
            raise ConfigError(f"{where} holds an empty (or null) key{under}: give each value its key's name, "
                              "e.g. trainer: {steps: 50}")
        check_keys(value, where, f"{prefix}.{key}" if prefix else str(key))


def is_utf8(text: str) -> bool:
    """False for text holding bytes that were not UTF-8 (Python keeps them in argv as surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(text: str) -> str:
    """text with its non-UTF-8 bytes written as backslash-x escapes, for a message."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


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
    data = load_yaml(text, where)
    check_keys(data, where)
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


INT64 = (-(2**63), 2**63 - 1)  # any other whole number: it must fit where torch, JSON readers and C code put it
# The whole numbers with a tighter range than 64 bits, and how the message names them.
INT_BOUNDS = {
    "seed": ("seed", 0, 2**32 - 1),  # numpy's seed range (the trainer adds small offsets to it per stream)
    "nodes": ("--nodes", 1, 65_536),
    "min_nodes": ("min_nodes", 1, 65_536),
    "gpus": ("--gpus", 1, 4_096),  # worker processes on one node
    "trainer.steps": ("trainer.steps", 1, 2**31 - 1),
    "launcher.max_restarts": ("launcher.max_restarts", 0, 10_000),
}


def check_int_bounds(config: Any) -> None:
    """Every whole number within its range: Python's are unbounded, torch's and the OS's are not."""
    for name, value in _leaves(config, ""):
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        shown, low, high = INT_BOUNDS.get(name, (name, *INT64))
        if not low <= value <= high:
            given = str(value) if value.bit_length() <= 80 else f"(a {value.bit_length()}-bit number)"
            raise ConfigError(f"{shown}={given} is out of range: it must be in [{low}, {high}]")


def section_given_a_value(schema: type, data: Any, prefix: str = "") -> Optional[str]:
    """The first dotted key where data gives a single value (or a list) for one of the schema's sections."""
    if not isinstance(data, dict):
        return None
    for f in dataclasses.fields(schema):
        if f.name not in data or not dataclasses.is_dataclass(f.default_factory):
            continue
        if not isinstance(data[f.name], dict):
            return f"{prefix}{f.name}"
        inner = section_given_a_value(f.default_factory, data[f.name], f"{prefix}{f.name}.")
        if inner:
            return inner
    return None


def check_no_tilde(value: Any, name: str) -> None:
    """`key=~/x` reaches us unexpanded (the shell expands ~ only at the start of a word)."""
    if isinstance(value, str) and value.startswith("~"):
        flag = " or --output-dir ~/..." if name == "output_dir" else ""
        raise ConfigError(f"{name}={value}: '~' is not expanded in key=value (it would create a directory named '~'): "
                          f"write {name}=$HOME{value[1:]}{flag}")


def _has_control_characters(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def check_run_id(run_id: str) -> None:
    """A run id is one directory name: no path, no control characters, not too long."""
    if run_id in ("", ".", "..") or "/" in run_id or "\\" in run_id:
        raise ConfigError(f"run_id={run_id!r} is not a name: use letters, digits, '-', '_' or '.' "
                          "(no '/', and not '.' or '..'); to choose where runs go, set output_dir")
    if not is_utf8(run_id):
        raise ConfigError(f"run_id={_shown(run_id)!r} holds bytes that are not UTF-8 text: "
                          "use letters, digits, '-', '_' or '.'")
    if _has_control_characters(run_id):
        raise ConfigError(f"run_id={run_id!r} holds control characters: use letters, digits, '-', '_' or '.'")
    size = len(run_id.encode("utf-8"))
    if size > RUN_ID_MAX_BYTES:
        raise ConfigError(f"run_id is {size} bytes long, more than a directory name may be "
                          f"({RUN_ID_MAX_BYTES}): pick a shorter run_id")
