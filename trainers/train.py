"""The built-in training loop. It knows torchrun's environment contract and the config, nothing else.

Run it under the launcher (the default job) or directly under torchrun:
    torchrun --nproc-per-node 2 -m trainers.train trainer.steps=50
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainers.data import build_dataset, build_loader
from trainers.dist import DistEnv, init_process_group, pick_device, seed_everything, set_threads
from trainers.loggers import build_loggers, run_dir_from_env
from trainers.metrics import StepMeter, attach_comm_timer, job_figures, window_metrics
from trainers.models import build_model, param_checksum
from trainers.strategies import STRATEGIES

WARMUP_STEPS = 3  # steps left out of the steady-state step time (first-step costs, allocator warm-up)


def train(cfg: Any, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """Train cfg.model with cfg.trainer.strategy; rank 0's result carries the job-wide figures."""
    env = DistEnv.from_environ()
    set_threads()
    device = pick_device(env)
    backend = init_process_group(env, device)
    try:
        return _train(cfg, run_dir, env, device, backend)
    finally:
        dist.destroy_process_group()


def _train(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, backend: str) -> Dict[str, Any]:
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = STRATEGIES[cfg.trainer.strategy](build_model(cfg.model), device, cfg)
    seed_everything(cfg.seed + env.rank)  # per-rank randomness from here on
    dataset = build_dataset(cfg)
    loader, sampler = build_loader(dataset, cfg.data.batch_size, env.rank, env.world_size, cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    loggers = build_loggers(env.rank, run_dir, cfg.trainer.steps, cfg)
    comm = attach_comm_timer(model, env.world_size) if cfg.metrics.detailed else None
    meter = StepMeter(device, env.world_size, cfg.metrics.detailed, comm)
    global_batch = cfg.data.batch_size * env.world_size
    print(f"rank {env.rank}/{env.world_size} (node {env.group_rank}, local rank {env.local_rank}) on {device}, "
          f"{backend}, {len(sampler)} samples per epoch", flush=True)
    if cfg.data.record_shards and run_dir:
        _record_shard(run_dir, env.rank, list(iter(sampler)))

    step, epoch, first_step_at = 0, 0, None
    step_times: List[float] = []
    window_start, window_steps, loss = time.perf_counter(), 0, torch.zeros(())
    while step < cfg.trainer.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            t0 = time.perf_counter()
            meter.start(x, len(x))
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            meter.phase("forward")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            meter.phase("backward")
            optimizer.step()
            meter.phase("optimizer")
            step += 1
            step_times.append(time.perf_counter() - t0)
            meter.end(counted=step > WARMUP_STEPS)
            window_steps += 1
            if first_step_at is None:
                first_step_at = time.time()
            if step % cfg.trainer.log_every == 0 or step == cfg.trainer.steps:
                elapsed = time.perf_counter() - window_start
                mean_loss = _mean_across_ranks(loss.detach(), env.world_size)
                rows = meter.gather()
                record = {
                    "step": step,
                    "epoch": epoch,
                    "loss": mean_loss,
                    "samples_per_s": global_batch * window_steps / elapsed,
                    "step_time_s": elapsed / window_steps,
                }
                if rows is not None:
                    record.update(window_metrics(rows, cfg.metrics.straggler_fraction, record["samples_per_s"], meter))
                loggers.log(record)
                window_start, window_steps = time.perf_counter(), 0
            if step == cfg.trainer.steps:
                break
        epoch += 1
    figures = job_figures(meter, step - WARMUP_STEPS if step > WARMUP_STEPS else step)

    final_loss = _mean_across_ranks(loss.detach(), env.world_size)
    checksum = param_checksum(model)
    checksums: List[Optional[float]] = [None] * env.world_size
    dist.all_gather_object(checksums, checksum)
    steady = step_times[WARMUP_STEPS:] or step_times
    median = statistics.median(steady)
    result = {
        "rank": env.rank,
        "world_size": env.world_size,
        "backend": backend,
        "device_type": device.type,
        "strategy": cfg.trainer.strategy,
        "model": cfg.model.name,
        "steps": step,
        "epochs_started": epoch + 1,
        "global_batch_size": global_batch,
        "samples_per_s": global_batch / median,
        "step_time_s_median": median,
        "final_loss": final_loss,
        "param_checksum": checksum,
        "param_checksums": checksums,
        "time_to_first_step_s": _since_launch(first_step_at),
        "restart_count": env.restart_count,
        **figures,
    }
    if meter.tokens and meter.samples:
        result["tokens_per_s"] = result["samples_per_s"] * meter.tokens / meter.samples
    loggers.log_summary(result)
    loggers.close()
    return result


def _mean_across_ranks(value: torch.Tensor, world: int) -> float:
    t = value.detach().to(torch.float64).reshape(1).clone()
    if world > 1:
        t = t.to(value.device)
        dist.all_reduce(t)
    return float(t.item()) / world


def _since_launch(at: Optional[float]) -> Optional[float]:
    start = os.environ.get("LAUNCHER_START_TIME")
    if at is None or not start:
        return None
    return at - float(start)


def _record_shard(run_dir: str, rank: int, indices: List[int]) -> None:
    path = Path(run_dir) / "shards" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(indices))


def main(argv: List[str]) -> int:
    """torchrun entry point: `key=value` overrides as arguments, results on rank 0's stdout."""
    from launcher.config import load_config

    cfg = load_config(None, argv)
    result = train(cfg, run_dir_from_env())
    if result["rank"] == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
