"""The typed configuration's sections and the Config every launch reads: plain dataclasses, nothing else.

Each engine's own section (slurm:, ray:, ...) is declared by the engine (launcher.backends.registry) and added
after these by launcher.config.schema.config_class, which loads and validates a config. This module imports
nothing of the launcher, so anything may name these types (the engines' interface among them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union


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
    # also save when this long has passed since the last save (0 = off); always at the end and on Ctrl-C/SIGTERM/preemption
    every_seconds: float = 0.0
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
    # this node's address towards the others (torchrun's --local-addr); None = the interface reaching the rendezvous
    local_addr: Optional[str] = None
    conf: Dict[str, Any] = field(default_factory=dict)  # torch's rendezvous options, e.g. last_call_timeout (config/elastic.py)
    # the workers' TORCHELASTIC_RUN_ID; None = the run id. A torchrun command line sets what torchrun gives: its
    # --rdzv-id, 'none', or a fresh uuid where torchrun picks the port itself (docs/torchrun.md)
    torchelastic_run_id: Optional[str] = None


@dataclass
class LaunchSection:
    start_method: str = "auto"  # auto | fork: forked from a warm zygote (torch imported once) | spawn: fresh interpreters
    max_restarts: int = 0  # restart all workers up to this many times when one fails
    # hot spare nodes beyond --nodes (c10d): checked in and warm, running no ranks, each taking a lost node's place
    spares: int = 0
    # with a spare waiting, a node whose ranks the step records name the straggler this many seconds in a row leaves
    # the job and the spare takes its place (launcher.agent.eviction); 0 = never
    evict_slow_after_s: float = 0.0
    # threads per worker; 0 = OMP_NUM_THREADS if exported, else for a script torchrun's (1 with several workers per
    # node, none with one), for the built-in trainer cores / workers per node (at least 1)
    omp_threads: int = 0
    # a rank whose script returned but whose process has not exited this long after is killed (its result kept)
    exit_timeout_s: float = 60.0
    role: str = "default"  # the workers' ROLE_NAME (torchrun's --role)
    monitor_interval_s: float = 0.1  # how often each node's agent checks its workers (torchrun's --monitor-interval)
    # the console leaves these streams out, kept in logs/rank-<k>.log only (torchrun's -r): 0 none, 1 stdout,
    # 2 stderr, 3 both, or LOCAL_RANK:N,... per local rank
    redirects: str = "0"
    local_ranks_filter: List[int] = field(default_factory=list)  # the console shows only these local ranks; [] = all
    # use a run directory or output folder another user owns (who could rename or remove what is written there);
    # false = refused in one line (docs/security.md)
    allow_other_owner: bool = False


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
    # which engine runs the job: one of the --cluster names of launcher.backends.registry (local: this machine, or
    # the nodes of the allocation this process runs inside); each engine adds its own section of keys after this one
    cluster: str = "local"
