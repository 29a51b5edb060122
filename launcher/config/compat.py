"""Which strategy, model and job shape go together: checked before anything starts.

Pure arithmetic on the config (no torch), so ``--dry-run`` and ``compare`` can reject an
unsupported combination in one line that names the fix.
"""

from __future__ import annotations

from typing import Any

from launcher.errors import ConfigError

# Strategies that drive all of a node's devices from one process: the plan starts one worker per node.
ONE_PROCESS_PER_NODE = ("dp", "naive_mp")


def workers_per_node(cfg: Any) -> int:
    """Worker processes per node: one for single-process strategies, else one per GPU (--gpus)."""
    if cfg.script.path is None and cfg.trainer.strategy in ONE_PROCESS_PER_NODE:
        return 1
    return cfg.gpus


def pipeline_stages(cfg: Any) -> int:
    return cfg.trainer.pipeline.stages or cfg.nodes * cfg.gpus


def tensor_widths(model: Any) -> dict[str, int]:
    """The sizes tensor parallel splits across ranks, per model."""
    if model.name == "gpt":
        return {"model.heads": model.heads}
    return {"model.hidden": model.hidden}


def check_strategy(cfg: Any) -> None:
    strategy, model, world = cfg.trainer.strategy, cfg.model, cfg.nodes * cfg.gpus
    if model.name == "gpt" and model.hidden % model.heads:
        raise ConfigError(f"model.hidden={model.hidden} does not divide by model.heads={model.heads}: pick sizes that divide")
    if strategy in ONE_PROCESS_PER_NODE and cfg.nodes > 1:
        raise ConfigError(f"trainer.strategy={strategy} runs one process per node and cannot span nodes: "
                          "use --nodes 1, or trainer.strategy=ddp (or fsdp) across nodes")
    if strategy == "pipeline":
        _check_pipeline(cfg, world)
    if strategy == "tensor":
        for key, size in tensor_widths(model).items():
            if size % world:
                raise ConfigError(f"trainer.strategy=tensor splits {key}={size} over {world} workers, which does not divide: "
                                  f"set {key} to a multiple of {world} or change --gpus")


def _check_pipeline(cfg: Any, world: int) -> None:
    stages, pipe = pipeline_stages(cfg), cfg.trainer.pipeline
    if stages < 1:
        raise ConfigError(f"trainer.pipeline.stages={pipe.stages} must be at least 1 (or 0 for all workers)")
    if stages > cfg.model.depth:
        raise ConfigError(f"a pipeline of {stages} stages needs at least {stages} layers but model.depth={cfg.model.depth}: "
                          f"raise model.depth or set trainer.pipeline.stages<={cfg.model.depth}")
    if world % stages:
        raise ConfigError(f"{world} workers do not split into pipelines of trainer.pipeline.stages={stages}: "
                          "use a stage count that divides the number of workers")
    replica_batch = cfg.data.batch_size * stages
    if pipe.microbatches < 1 or replica_batch % pipe.microbatches:
        raise ConfigError(f"each pipeline's batch ({cfg.data.batch_size} x {stages} stages = {replica_batch}) does not split "
                          f"into trainer.pipeline.microbatches={pipe.microbatches}: pick a divisor of {replica_batch}")
