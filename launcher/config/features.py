"""Which training-loop features (precision, accumulation, compile, loaders, auto batch) go with which
strategy and device: pure checks on the config, run before anything starts (no torch import)."""

from __future__ import annotations

from typing import Any, List

from launcher.errors import ConfigError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


def check_feature_config(cfg: Any) -> None:
    """Device-independent checks; every message names the fix."""
    t, d = cfg.trainer, cfg.data
    if t.precision not in PRECISIONS:
        raise ConfigError(f"trainer.precision={t.precision} is not one of: {', '.join(PRECISIONS)}")
    if t.grad_accum_steps < 1:
        raise ConfigError(f"trainer.grad_accum_steps={t.grad_accum_steps} must be at least 1 (1 = no accumulation)")
    if t.max_grad_norm < 0:
        raise ConfigError(f"trainer.max_grad_norm={t.max_grad_norm} must be positive, or 0 for no clipping")
    if d.num_workers < -1:
        raise ConfigError(f"data.num_workers={d.num_workers} must be -1 (auto), 0 (load in the worker) or more")
    if d.max_memory_gb < 0:
        raise ConfigError(f"data.max_memory_gb={d.max_memory_gb} must be positive, or 0 for the device's own limit")
    if t.strategy == "pipeline":
        _check_pipeline_features(cfg)
    if t.compile and t.strategy == "tensor":
        raise ConfigError("trainer.compile=true is not supported with trainer.strategy=tensor here: "
                          "set trainer.compile=false, or use ddp or fsdp")


def _check_pipeline_features(cfg: Any) -> None:
    """The pipeline schedule owns forward, backward and its microbatches; some switches do not fit it."""
    t = cfg.trainer
    if t.grad_accum_steps > 1:
        raise ConfigError("trainer.grad_accum_steps>1 with trainer.strategy=pipeline: the pipeline already splits each batch, "
                          "raise trainer.pipeline.microbatches and data.batch_size instead")
    if t.precision == "fp16":
        raise ConfigError("trainer.precision=fp16 with trainer.strategy=pipeline: the schedule's loss cannot be scaled, "
                          "use trainer.precision=bf16")
    if t.compile:
        raise ConfigError("trainer.compile=true is not supported with trainer.strategy=pipeline: set trainer.compile=false")
    if cfg.data.batch_size == "auto":
        raise ConfigError("data.batch_size=auto is not supported with trainer.strategy=pipeline "
                          "(the batch must split into microbatches): give a number, e.g. data.batch_size=32")


def check_device_features(cfg: Any, device_type: str) -> List[str]:
    """Checks that need the device type (known to the plan); returns notices for the user."""
    notices: List[str] = []
    if cfg.script.path is not None:
        return notices
    if device_type != "cuda":
        if cfg.trainer.precision == "fp16":
            raise ConfigError("trainer.precision=fp16 needs CUDA (CPU autocast has no fp16 gradient scaler): "
                              "use trainer.precision=bf16 or fp32")
        if cfg.data.pin_memory:
            notices.append("data.pin_memory=true ignored: no CUDA device to copy to")
    return notices

