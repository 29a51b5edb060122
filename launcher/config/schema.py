"""The typed configuration: schema, loading and validation.

Precedence, lowest to highest: dataclass defaults < YAML file (--config) < command-line
flags and ``key=value`` overrides. Everything past ``load_config`` sees plain dataclasses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import yaml

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
from launcher.config.ray_section import RayConfig, check_ray_config
from launcher.config.torchrun_flags import check_std

STRATEGIES = ("dp", "ddp", "fsdp", "pipeline", "tensor", "naive_mp")
MODELS = ("mlp", "gpt", "cnn")
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
WANDB_MODES = ("offline", "online", "disabled")
START_METHODS = ("auto", "fork", "spawn")
PROGRESS_STYLES = ("auto", "bar", "lines")
CLUSTERS = ("local", "slurm", "ray")


@dataclass
class ModelConfig:
    name: str = "mlp"  # a built-in model: mlp | gpt (small transformer LM) | cnn (image classifier)
    in_dim: int = 256  # input features (mlp)
    hidden: int = 512  # hidden width (mlp: 4 layers of 512 is about 0.9M parameters; gpt: model width; cnn: classifier width)
    depth: int = 4  # hidden layers (mlp), transformer blocks (gpt), conv blocks (cnn)
    classes: int = 10  # output classes (mlp, cnn)
    vocab: int = 64  # vocabulary of the synthetic text corpus (gpt)
    seq_len: int = 32  # tokens per sample (gpt)
    heads: int = 4  # attention heads (gpt); hidden must divide by it
    channels: int = 16  # conv channels (cnn)
    image_size: int = 16  # square synthetic images, 3 channels (cnn)


@dataclass
class DataConfig:
    batch_size: Union[int, str] = 32  # per worker; the global batch is batch_size x world size; auto = the largest that fits
    dataset_size: int = 8192  # samples in the deterministic synthetic dataset
    record_shards: bool = False  # each rank writes the indices it saw in epoch 0 to shards/
    num_workers: int = -1  # DataLoader processes per worker; -1 = auto (2 with CUDA, 0 on CPU: in-memory data)
    pin_memory: Optional[bool] = None  # page-locked batches for async copies; None = on with CUDA; ignored on CPU
    max_memory_gb: float = 0.0  # batch_size=auto: memory cap per worker; 0 = 90% of the GPU, or a share of free RAM on CPU


@dataclass
class PipelineConfig:
    stages: int = 0  # pipeline stages; 0 = all workers form one pipeline; fewer = pipeline x data parallel
    microbatches: int = 4  # microbatches per step; each replica's batch (batch_size x stages) must divide by it
    schedule: str = "gpipe"  # gpipe | 1f1b


@dataclass
class TrainerConfig:
    strategy: str = "ddp"  # how the model is parallelised: dp | ddp | fsdp | pipeline | tensor | naive_mp
    steps: int = 200  # optimizer steps to run
    lr: float = 1e-3  # AdamW learning rate
    log_every: int = 10  # write a metrics.jsonl line every N steps (and at the last step)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)  # trainer.strategy=pipeline only
    precision: str = "auto"  # auto (bf16 on CUDA that supports it, else fp32) | fp32 | bf16 | fp16 (CUDA only, gradient scaler)
    grad_accum_steps: int = 1  # micro-batches per optimizer step; the gradient all-reduce runs on the last one only
    activation_checkpointing: bool = False  # recompute each block's activations in backward: less memory, more compute
    compile: bool = False  # torch.compile each block before the strategy wraps the model
    max_grad_norm: float = 0.0  # clip the global gradient norm to this; 0 = no clipping (the norm is logged either way)


@dataclass
class CheckpointConfig:
    every_steps: Union[int, str] = "auto"  # save every N steps (0 = off); auto = Young/Daly from a measured save and mtbf_s
    mtbf_s: float = 3600.0  # expected seconds between failures, for every_steps=auto (less if the job's restarts show less)
    every_seconds: float = 0.0  # also save when this long has passed since the last save (0 = off); always at the end and on Ctrl-C/SIGTERM/preemption
    keep: int = 3  # keep the newest K checkpoints
    dir: Optional[str] = None  # None = <run_dir>/checkpoints
    grace_s: float = 8.0  # after Ctrl-C/SIGTERM, how long workers get to checkpoint before being killed
    async_save: bool = False  # the loop waits only for a host-memory copy; the write runs in the background


@dataclass
class MetricsConfig:
    detailed: bool = True  # time data/forward/backward/optimizer/communication, memory, CPU; false = throughput only
    straggler_fraction: float = 0.2  # name the slowest rank when its step time exceeds the median by this fraction
    progress: str = "auto"  # rank 0's console: auto (a bar on a terminal, plain lines otherwise) | bar | lines
    # a user's script: record its optimizer steps, memory and launcher.log() values per rank (one global optimizer
    # step hook in each worker) into metrics.jsonl, summary.json and W&B; false = none of that
    scripts: bool = True


@dataclass
class RendezvousConfig:
    timeout_s: int = 60  # how long a node waits for the others before giving up
    # Multi-node (launcher/config/rendezvous.py). With nodes > 1 and none of these set, all nodes run
    # on this machine (simulated). node_rank + master_addr/master_port: static rendezvous;
    # endpoint: torch's c10d rendezvous (nodes may have different worker counts).
    node_rank: Optional[int] = None  # this machine's node rank in [0, nodes) (static rendezvous)
    master_addr: Optional[str] = None  # host name or address of node 0 (static rendezvous)
    master_port: int = 29500  # TCP port on node 0 that the nodes meet on (static rendezvous)
    endpoint: Optional[str] = None  # HOST:PORT of the c10d rendezvous (any node may host it)
    id: Optional[str] = None  # rendezvous id; None = derived from the address and port
    # a file holding the job's rendezvous secret, the same on every node (docs/security.md); without
    # it, LAUNCHER_RDZV_SECRET. Only the path is recorded: the secret is read by the node agent.
    secret_file: Optional[str] = None
    local_addr: Optional[str] = None  # this node's address towards the others (torchrun's --local-addr); None = the interface reaching the rendezvous
    conf: Dict[str, Any] = field(default_factory=dict)  # torch's rendezvous options, e.g. last_call_timeout (config/elastic.py)


@dataclass
class LaunchSection:
    start_method: str = "auto"  # auto | fork: forked from a warm zygote (torch imported once) | spawn: fresh interpreters
    max_restarts: int = 0  # restart all workers up to this many times when one fails
    omp_threads: int = 0  # threads per worker; 0 = OMP_NUM_THREADS if exported, else cores / workers per node (at least 1)
    # a rank whose script returned but whose process has not exited this long after is killed (its result kept)
    exit_timeout_s: float = 60.0
    role: str = "default"  # the workers' ROLE_NAME (torchrun's --role)
    monitor_interval_s: float = 0.1  # how often each node's agent checks its workers (torchrun's --monitor-interval)
    # the console leaves these streams out, kept in logs/rank-<k>.log only (torchrun's -r): 0 none, 1 stdout,
    # 2 stderr, 3 both, or LOCAL_RANK:N,... per local rank
    redirects: str = "0"
    local_ranks_filter: List[int] = field(default_factory=list)  # the console shows only these local ranks; [] = all


@dataclass
class WatchdogConfig:
    # seconds a rank that has made progress (a training step, an optimizer step, heartbeat()) may go
    # without more before the job is declared hung (stacks dumped to stacks/, job stopped, exit 1);
    # a rank gets longer when it was slower before: max(timeout_s, 2 x its slowest). 0 disables.
    timeout_s: float = 300.0
    # seconds a rank may take from its start to its first progress while it sits in
    # init_process_group (imports, rendezvous and a compile take less); 0 disables
    start_timeout_s: float = 600.0


@dataclass
class SlurmConfig:
    """How a --cluster slurm job is submitted (launcher/backends/slurm/submit.py): one task per node."""

    partition: Optional[str] = None  # sbatch --partition; None = the cluster's default
    time_min: int = 60  # time limit in minutes; the job is warned (USR2) signal_delay_s before it and requeues
    signal_delay_s: int = 90  # how long before the time limit SLURM sends USR2 (checkpoint, then requeue)
    account: Optional[str] = None  # sbatch --account
    qos: Optional[str] = None  # sbatch --qos
    constraint: Optional[str] = None  # sbatch --constraint, e.g. a100
    mem: Optional[str] = None  # memory per node, e.g. 64G; None = the partition's default
    cpus_per_task: int = 0  # CPUs for each node's agent and its workers; 0 = --gpus x launcher.omp_threads (at least --gpus)
    gpus: str = "auto"  # ask SLURM for --gpus GPUs per node: auto (if the partition has gres/gpu) | always | never
    job_name: Optional[str] = None  # sbatch --job-name; None = launcher-<run id>
    max_requeues: int = 3  # preemptions/time limits survived by requeueing (submitit's max_num_timeout)
    extra: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option, e.g. {exclusive: true, reservation: r1}


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline (no key, no network) | online | disabled
    project: str = "launcher"  # W&B project
    entity: Optional[str] = None  # W&B team or user; None = the key's default
    group: Optional[str] = None  # W&B group, e.g. to gather a sweep
    tags: List[str] = field(default_factory=list)  # W&B tags


@dataclass
class ScriptConfig:
    path: Optional[str] = None  # a torchrun-style script (or module with module=true) to run
    module: bool = False  # path is a module name, run like `python -m path`
    args: List[str] = field(default_factory=list)  # arguments passed through to the script


@dataclass
class Config:
    nodes: int = 1  # number of nodes (machines); with min_nodes below it, the most an elastic job admits
    min_nodes: Optional[int] = None  # elastic (--nodes MIN:MAX): starts with, and goes on while, this many; None = nodes
    gpus: int = 1  # worker processes per node: one per GPU, or CPU workers without CUDA
    seed: int = 0  # seeds every RNG (model init from seed, data order from seed and rank)
    output_dir: str = "launcher_runs"  # each run gets <output_dir>/<run_id>/ (not runs/: TensorBoard's default)
    run_id: Optional[str] = None  # None = a fresh id from the time and a random suffix
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rdzv: RendezvousConfig = field(default_factory=RendezvousConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launcher: LaunchSection = field(default_factory=LaunchSection)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    script: ScriptConfig = field(default_factory=ScriptConfig)
    cluster: str = "local"  # local: run here | slurm: submit to SLURM (inside a SLURM job step: use its allocation) | ray: a Ray cluster
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    ray: RayConfig = field(default_factory=RayConfig)  # --cluster ray: where and how (launcher/config/ray_section.py)


def load_config(config_file: Optional[str] = None, overrides: Optional[List[str]] = None,
                label: str = "--config", script: Optional[ScriptConfig] = None) -> Config:
    """Merge defaults < YAML file < overrides into a validated Config.

    label: how messages name the file (`--config`, or a resumed run's recorded config). script: the command line's,
    set before validating: a script is held to none of the built-in trainer's rules (data.*, trainer.*)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    merged = OmegaConf.structured(Config)
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

    section = section_given_a_value(Config, OmegaConf.to_container(layer))
    if section:  # OmegaConf names no key for these
        return (f"{where}: '{section}' is a section of keys, not a single value: set one of its keys, "
                f"e.g. {section}.KEY=VALUE (`python -m launcher --show-config` lists them)")
    key = getattr(e, "full_key", None) or "?"
    if isinstance(e, ConfigKeyError):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        return f"{where}: unknown config key '{key}': see `python -m launcher --show-config` for the keys{' under ' + parent if parent else ''}"
    if isinstance(e, ValidationError):
        msg = first_line(e)
        return f"{where}: wrong type for '{key}': {msg}; see `python -m launcher --show-config` for its type"
    return f"{where}: {first_line(e)}"


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
    auto_batch = _check_batch_size(cfg.data.batch_size)
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
        raise ConfigError(f"metrics.straggler_fraction={cfg.metrics.straggler_fraction} must be positive: try 0.2 (20% slower than the median)")
    _one_of(cfg.cluster, CLUSTERS, "cluster")
    _one_of(cfg.slurm.gpus, ("auto", "always", "never"), "slurm.gpus")
    _at_least(cfg.slurm.time_min, 1, "slurm.time_min")
    _at_least(cfg.slurm.cpus_per_task, 0, "slurm.cpus_per_task")
    _at_least(cfg.slurm.signal_delay_s, 1, "slurm.signal_delay_s")
    _at_least(cfg.slurm.max_requeues, 0, "slurm.max_requeues")
    check_ray_config(cfg)
    check_int_bounds(cfg)
    if cfg.script.path is not None:  # a script reads none of data.* or trainer.*: its own batch is its business
        check_script(cfg.script.path, cfg.script.module)
        return
    check_checkpoint_dir(cfg.checkpoint.dir)
    for name in ("in_dim", "hidden", "depth", "classes", "vocab", "seq_len", "heads", "channels", "image_size"):
        _at_least(getattr(cfg.model, name), 1, f"model.{name}")
    world = cfg.nodes * cfg.gpus
    accum = cfg.trainer.grad_accum_steps  # an optimizer step takes this many batches from one epoch
    if not auto_batch and cfg.data.batch_size * world * max(1, accum) > cfg.data.dataset_size:
        steps = f" x {accum} accumulation steps" if accum > 1 else ""
        raise ConfigError(
            f"data.dataset_size={cfg.data.dataset_size} is smaller than one global batch "
            f"({cfg.data.batch_size} x {world} workers{steps}): raise data.dataset_size or lower data.batch_size"
        )
    _one_of(cfg.trainer.pipeline.schedule, PIPELINE_SCHEDULES, "trainer.pipeline.schedule")
    check_feature_config(cfg)  # first: it rejects batch_size=auto where check_strategy does batch arithmetic
    check_strategy(cfg)


def _check_batch_size(value: Union[int, str]) -> bool:
    """True for data.batch_size=auto; a whole number of at least 1 otherwise."""
    if value == "auto":
        return True
    if not isinstance(value, int):
        raise ConfigError(f"data.batch_size={value} is neither a whole number nor auto: try data.batch_size=32 or data.batch_size=auto")
    _at_least(value, 1, "data.batch_size")
    return False


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

    cfg = OmegaConf.to_object(OmegaConf.unsafe_merge(OmegaConf.structured(Config), data))  # (in place: no deep copy)
    assert isinstance(cfg, Config)
    return cfg

