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
    """The config as a plain dict with anything that looks like a secret redacted (for loggers); a script's own
    `--key value` arguments also as `script_args` ({key: value}, numbers as numbers), so a tracker can filter and
    compare runs by them."""
    record = redact(to_dict(cfg))
    args = (record.get("script") or {}).get("args") or []
    if args:
        record["script_args"] = script_args(args)
    return record


def script_args(argv: List[str]) -> Dict[str, Any]:
    """`--lr 0.1 --epochs=3 --amp --name x` -> {"lr": 0.1, "epochs": 3, "amp": True, "name": "x"}; positional
    arguments as `_positional` (a list), a repeated key's values as a list."""
    out: Dict[str, Any] = {}
    positional: List[Any] = []
    i = 0
    while i < len(argv):
        item = str(argv[i])
        if item.startswith("--") and len(item) > 2:
            key, eq, value = item[2:].partition("=")
            if not eq and i + 1 < len(argv) and not str(argv[i + 1]).startswith("--"):
                value, i = str(argv[i + 1]), i + 1
            parsed: Any = _number(value) if (eq or value) else True
            if key in out:
                parsed = [*(out[key] if isinstance(out[key], list) else [out[key]]), parsed]
            out[key] = parsed
        else:
            positional.append(_number(item))
        i += 1
    if positional:
        out["_positional"] = positional
    return out


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
