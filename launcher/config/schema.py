"""The typed configuration: schema, loading and validation.

Precedence, lowest to highest: dataclass defaults < YAML file (--config) < command-line
flags and ``key=value`` overrides. Everything past ``load_config`` sees plain dataclasses:
the sections of launcher.config.sections, and after them each engine's own section, as the engines
declare them (launcher.backends.registry; config_class).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, List, Optional, Tuple, Type, Union

import yaml

from launcher.backends import registry
from launcher.config.sections import (CheckpointConfig, Config, DataConfig, LaunchSection, MetricsConfig,  # noqa: F401
                                      ModelConfig, PipelineConfig, RendezvousConfig, ScriptConfig, TrainerConfig,
                                      WandbConfig, WatchdogConfig)
from launcher.errors import ConfigError
from launcher.runtime.formatting import first_line
from launcher.config.inputs import (check_finite, check_int_bounds, check_no_tilde, check_override, check_run_id,
                                    parse_yaml_mapping, section_given_a_value)
from launcher.config.paths import check_checkpoint_dir, check_output_dir, check_script, resolve_config_path
from launcher.config.yaml_limits import MAX_YAML_BYTES, dump_yaml
from launcher.config.rendezvous import validate_rendezvous
from launcher.config.elastic import check_elastic
from launcher.config.secrets import redact
from launcher.config.compat import check_strategy
from launcher.config.features import check_feature_config
from launcher.config.torchrun_flags import check_std

STRATEGIES = ("dp", "ddp", "fsdp", "pipeline", "tensor", "naive_mp")
MODELS = ("mlp", "gpt", "cnn")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
WANDB_MODES = ("offline", "online", "disabled")
START_METHODS = ("auto", "fork", "spawn")
PROGRESS_STYLES = ("auto", "bar", "lines")


@functools.lru_cache(maxsize=None)
def config_class() -> Type[Config]:
    """Config with every engine's own section after its keys, as the engines declare them (launcher.backends.registry):
    the class every config is loaded into, built once per process."""
    fields = [(name, section, dataclasses.field(default_factory=section)) for name, section in registry.sections()]
    composed = dataclasses.make_dataclass("Config", fields, bases=(Config,), namespace={"__reduce__": _reduce})
    composed.__module__ = __name__
    return composed


def _reduce(cfg: Config) -> Tuple[Any, Tuple[Any, ...]]:
    """A loaded config pickles by its values: the process that loads it builds its own config_class()."""
    return _rebuilt, (dict(vars(cfg)),)


def _rebuilt(values: dict[str, Any]) -> Config:
    cls = config_class()
    cfg = cls.__new__(cls)
    vars(cfg).update(values)
    return cfg


def load_config(config_file: Optional[str] = None, overrides: Optional[List[str]] = None,
                label: str = "--config", script: Optional[ScriptConfig] = None) -> Config:
    """Merge defaults < YAML file < overrides into a validated Config.

    label: how messages name the file (`--config`, or a resumed run's recorded config). script: the command line's,
    set before validating: a script is held to none of the built-in trainer's rules (data.*, trainer.*)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged = OmegaConf.structured(config_class())
    layers: list[tuple[str, Any]] = []
    if config_file is not None:
        path = resolve_config_path(config_file)
        layers.append((f"{label} {path}", _read_yaml(path, f"{label} {path}")))
    for item in overrides or []:
        key, value = check_override(item)
        try:
            layer = OmegaConf.from_dotlist([item])
        except yaml.YAMLError as e:  # what the bracket check lets through, e.g. `key=]`
            raise ConfigError(f"override {key}=...: the value is not valid YAML: quote it for the shell, "
                              f"e.g. {key}='[a, b]'") from e
        # the key alone names an override: an unknown key's value may be a secret typed in the wrong place
        layers.append((f"override {key}=...", layer))
    for where, layer in layers:
        try:  # unsafe_merge: in place; OmegaConf.merge deep-copies the whole config each time (half the CPU)
            merged = OmegaConf.unsafe_merge(merged, layer)
        except OmegaConfBaseException as e:
            raise ConfigError(_explain(where, e, layer)) from e
    cfg = OmegaConf.to_object(merged)
    assert isinstance(cfg, Config)
    cfg.script = script or cfg.script
    validate(cfg)
    return cfg


def _read_yaml(path: Path, where: str) -> Any:
    from omegaconf import OmegaConf

    try:
        size = path.stat().st_size
        if size > MAX_YAML_BYTES:  # before reading it: the file may be any size
            raise ConfigError(f"{where} is {size} bytes, over the limit of {MAX_YAML_BYTES} for a config: "
                              "keep only key: value lines that differ from the defaults")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot read it ({e.__class__.__name__}): check the path and permissions") from e
    return OmegaConf.create(parse_yaml_mapping(text, where))  # values read as OmegaConf reads them (yaml_limits)


def _explain(where: str, e: Exception, layer: Any) -> str:
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, ValidationError

    section = section_given_a_value(config_class(), OmegaConf.to_container(layer))
    if section:  # OmegaConf names no key for these
        return (f"{where}: '{section}' is a section of keys, not a single value: set one of its keys, "
                f"e.g. {section}.KEY=VALUE (`python -m launcher --show-config` lists them)")
    key = getattr(e, "full_key", None) or "?"
    if isinstance(e, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        under = f" under {parent}" if parent else ""
        return f"{where}: unknown config key '{key}': see `python -m launcher --show-config` for the keys{under}"
    if isinstance(e, ValidationError):
        return _wrong_type(where, key, e, layer)
    return f"{where}: {first_line(e)}"


def _wrong_type(where: str, key: str, e: Exception, layer: Any) -> str:
    """A value of the wrong type, said in the key's terms: a list written without brackets, a value left empty."""
    from omegaconf import OmegaConf

    default = OmegaConf.select(OmegaConf.structured(config_class()), key, default=None)
    given = OmegaConf.select(layer, key, default=None)
    if OmegaConf.is_list(default) and isinstance(given, str):
        return f"{where}: {key} is a list: write {key}=[{given}] (quoted for the shell: '{key}=[{given}]')"
    if given is None and default is not None:
        return f"{where}: {key} was given no value: give one, e.g. {key}={default}, or leave the override out"
    return f"{where}: wrong type for '{key}': {first_line(e)}; see `python -m launcher --show-config` for its type"


def validate(cfg: Config) -> None:
    """Check values the type system cannot; every message names the fix."""
    check_finite(cfg)
    check_output_dir(cfg.output_dir, cfg.cluster)  # no ~, and a URL only for a launch from here
    check_no_tilde(cfg.checkpoint.dir, "checkpoint.dir")
    if cfg.run_id is not None:
        check_run_id(cfg.run_id)
    _at_least(cfg.nodes, 1, "--nodes")
    _at_least(cfg.gpus, 1, "--gpus")
    _at_least(cfg.trainer.steps, 1, "trainer.steps")
    _at_least(cfg.trainer.log_every, 1, "trainer.log_every")
    _check_batch_size(cfg.data.batch_size)
    _at_least(cfg.data.dataset_size, 1, "data.dataset_size")
    _at_least(cfg.rdzv.timeout_s, 1, "rdzv.timeout_s")
    validate_rendezvous(cfg)
    check_elastic(cfg)
    _at_least(cfg.launcher.max_restarts, 0, "launcher.max_restarts")
    _at_least(cfg.launcher.omp_threads, 0, "launcher.omp_threads")
    for key, value, example in (("exit_timeout_s", cfg.launcher.exit_timeout_s, 60),
                                ("monitor_interval_s", cfg.launcher.monitor_interval_s, 0.1)):
        if value <= 0:
            raise ConfigError(f"launcher.{key}={value:g} must be positive: e.g. launcher.{key}={example}")
    check_std("launcher.redirects", str(cfg.launcher.redirects))
    if not cfg.launcher.role.strip():
        raise ConfigError("launcher.role is empty: name the workers' role (ROLE_NAME), e.g. launcher.role=trainer")
    if cfg.checkpoint.every_steps != "auto":
        if not isinstance(cfg.checkpoint.every_steps, int):
            raise ConfigError(f"checkpoint.every_steps={cfg.checkpoint.every_steps} is neither a whole number nor auto: "
                              "try checkpoint.every_steps=100 or checkpoint.every_steps=auto")
        _at_least(cfg.checkpoint.every_steps, 0, "checkpoint.every_steps")
    if cfg.checkpoint.mtbf_s <= 0:
        raise ConfigError(f"checkpoint.mtbf_s={cfg.checkpoint.mtbf_s:g} must be positive: e.g. checkpoint.mtbf_s=3600")
    _at_least(cfg.checkpoint.keep, 1, "checkpoint.keep")
    if cfg.checkpoint.every_seconds < 0:
        raise ConfigError(f"checkpoint.every_seconds={cfg.checkpoint.every_seconds} must be 0 (off) or positive")
    if not 0 < cfg.checkpoint.grace_s <= 12:
        raise ConfigError(f"checkpoint.grace_s={cfg.checkpoint.grace_s} must be in (0, 12]: "
                          "everything must be gone within 15 s of Ctrl-C")
    if cfg.watchdog.timeout_s < 0:
        raise ConfigError(f"watchdog.timeout_s={cfg.watchdog.timeout_s:g} must be positive (or 0 to disable): try watchdog.timeout_s=300")
    if cfg.watchdog.start_timeout_s < 0:
        raise ConfigError(f"watchdog.start_timeout_s={cfg.watchdog.start_timeout_s:g} must be positive (or 0 to disable): "
                          "try watchdog.start_timeout_s=600")
    if cfg.trainer.lr <= 0:
        raise ConfigError(f"trainer.lr={cfg.trainer.lr} must be positive: try trainer.lr=1e-3")
    _one_of(cfg.trainer.strategy, STRATEGIES, "trainer.strategy")
    _one_of(cfg.model.name, MODELS, "model.name")
    _one_of(cfg.wandb.mode, WANDB_MODES, "wandb.mode")
    _one_of(cfg.launcher.start_method, START_METHODS, "launcher.start_method")
    _one_of(cfg.metrics.progress, PROGRESS_STYLES, "metrics.progress")
    if cfg.metrics.straggler_fraction <= 0:
        raise ConfigError(f"metrics.straggler_fraction={cfg.metrics.straggler_fraction} must be positive: "
                          "try 0.2 (20% slower than the median)")
    _one_of(cfg.cluster, tuple(registry.clusters()), "cluster")
    registry.check_sections(cfg)  # each engine's own keys
    check_int_bounds(cfg)
    if cfg.script.path is not None:  # a script reads none of data.* or trainer.*: its own batch is its business
        check_script(cfg.script.path, cfg.script.module)
        return
    check_checkpoint_dir(cfg.checkpoint.dir)
    for name in ("in_dim", "hidden", "depth", "classes", "vocab", "seq_len", "heads", "channels", "image_size"):
        _at_least(getattr(cfg.model, name), 1, f"model.{name}")
    world = cfg.nodes * cfg.gpus
    accum = cfg.trainer.grad_accum_steps  # an optimizer step takes this many batches from one epoch
    batch = cfg.data.batch_size  # a whole number, or auto (the trainer finds its own)
    if isinstance(batch, int) and batch * world * max(1, accum) > cfg.data.dataset_size:
        steps = f" x {accum} accumulation steps" if accum > 1 else ""
        raise ConfigError(
            f"data.dataset_size={cfg.data.dataset_size} is smaller than one global batch "
            f"({cfg.data.batch_size} x {world} workers{steps}): raise data.dataset_size or lower data.batch_size"
        )
    _one_of(cfg.trainer.pipeline.schedule, PIPELINE_SCHEDULES, "trainer.pipeline.schedule")
    check_feature_config(cfg)  # first: it rejects batch_size=auto where check_strategy does batch arithmetic
    check_strategy(cfg)


def _check_batch_size(value: Union[int, str]) -> None:
    """data.batch_size=auto, or a whole number of at least 1."""
    if value == "auto":
        return
    if not isinstance(value, int):
        raise ConfigError(f"data.batch_size={value} is neither a whole number nor auto: try data.batch_size=32 or data.batch_size=auto")
    _at_least(value, 1, "data.batch_size")


def _at_least(value: int, low: int, name: str) -> None:
    if value < low:
        raise ConfigError(f"{name}={value} must be at least {low}")


def _one_of(value: str, choices: tuple[str, ...], name: str) -> None:
    if value not in choices:
        raise ConfigError(f"{name}={value} is not one of: {', '.join(choices)}")


# Sections only the built-in trainer reads: a script run's recorded config leaves them out.
TRAINER_ONLY = ("seed", "model", "data", "trainer", "checkpoint", "metrics", "wandb")


def to_yaml(cfg: Config, recorded: bool = False) -> str:
    """The resolved config as YAML, with anything that looks like a secret redacted.

    recorded: the run directory's config.yaml, which for a script run holds only what applies to it.
    """
    data = redact(to_dict(cfg))
    if recorded and cfg.script.path is not None:
        data = {k: v for k, v in data.items() if k not in TRAINER_ONLY}
    return dump_yaml(data)


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dicts and lists; the same as OmegaConf's to_container for this schema (no enums, no
    interpolations), at a thousandth of its cost (0.3 CPU-s per launch: tests/test_config.py checks they agree)."""
    return dataclasses.asdict(cfg)


def from_dict(data: dict[str, Any]) -> Config:
    """Rebuild a Config from to_dict() output (as shipped to workers or read from a run)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(OmegaConf.unsafe_merge(OmegaConf.structured(config_class()), data))  # (in place: no deep copy)
    assert isinstance(cfg, Config)
    return cfg

