"""The built-in training loop. It knows torchrun's environment contract and the config, nothing else.

Run it under the launcher (the default job) or directly under torchrun:
    torchrun --nproc-per-node 2 -m trainers.train trainer.steps=50
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainers.checkpointing import Checkpointer, open_epoch
from trainers.data import build_dataset, build_loader
from trainers.dist import DistEnv, init_process_group, pick_device, seed_everything, set_threads
from trainers.faults import maybe_fail
from trainers.loggers import build_loggers, run_dir_from_env
from trainers.models import build_model, param_checksum
from trainers.stop import STOP
from trainers.strategies import STRATEGIES

WARMUP_STEPS = 3  # steps left out of the steady-state step time (first-step costs, allocator warm-up)


def train(cfg: Any, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """Train cfg.model with cfg.trainer.strategy; rank 0's result carries the job-wide figures."""
    env = DistEnv.from_environ()
    STOP.install(grace_s=cfg.checkpoint.grace_s)  # Ctrl-C/SIGTERM: checkpoint at the next step boundary
    set_threads()
    device = pick_device(env)
    backend = init_process_group(env, device)
    result = _train(cfg, run_dir, env, device, backend)
    # Only on success: a failing rank must not close its connections before its error is recorded,
    # or its peers' "connection closed" errors may be recorded first and blamed (launcher.local.root_cause).
    dist.destroy_process_group()
    return result


def _train(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, backend: str) -> Dict[str, Any]:
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = STRATEGIES[cfg.trainer.strategy](build_model(cfg.model), device, cfg)
    seed_everything(cfg.seed + env.rank)  # per-rank randomness from here on
    dataset = build_dataset(cfg)
    loader, sampler = build_loader(dataset, cfg.data.batch_size, env.rank, env.world_size, cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    checkpointer = Checkpointer(cfg, run_dir, env.rank, env.world_size, device, model, optimizer)
    start = checkpointer.resume(len(loader))
    loggers = build_loggers(env.rank, run_dir, cfg.trainer.steps)
    global_batch = cfg.data.batch_size * env.world_size
    print(f"rank {env.rank}/{env.world_size} (node {env.group_rank}, local rank {env.local_rank}, pid {os.getpid()}) "
          f"on {device}, {backend}, {len(sampler)} samples per epoch", flush=True)
    if cfg.data.record_shards and run_dir:
        _record_shard(run_dir, env.rank, list(iter(sampler)))

    step, epoch, first_step_at = start.step, start.epoch, None
    skip, rng, stop = start.skip, start.rng, False
    step_times: List[float] = []
    window_start, window_steps, loss = time.perf_counter(), 0, torch.zeros(())
    while step < cfg.trainer.steps and not stop:
        sampler.set_epoch(epoch)
        batch_in_epoch = skip
        for x, y in open_epoch(loader, skip, rng):
            t0 = time.perf_counter()
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            batch_in_epoch += 1
            step_times.append(time.perf_counter() - t0)
            maybe_fail(env.rank, step, env.restart_count)
            window_steps += 1
            if first_step_at is None:
                first_step_at = time.time()
            if step % cfg.trainer.log_every == 0 or step == cfg.trainer.steps:
                elapsed = time.perf_counter() - window_start
                mean_loss = _mean_across_ranks(loss.detach(), env.world_size)
                loggers.log({
                    "step": step,
                    "epoch": epoch,
                    "loss": mean_loss,
                    "samples_per_s": global_batch * window_steps / elapsed,
                    "step_time_s": elapsed / window_steps,
                })
                window_start, window_steps = time.perf_counter(), 0
            stop = checkpointer.after_step(step, epoch, batch_in_epoch, lambda: _mean_across_ranks(loss, env.world_size),
                                           last=step == cfg.trainer.steps)
            if step == cfg.trainer.steps or stop:
                break
        epoch, skip, rng = epoch + 1, 0, None
    loggers.close()

    if step_times or start.resumed is None:
        final_loss = _mean_across_ranks(loss.detach(), env.world_size)
    else:  # a finished run started again: nothing left to train
        final_loss = start.resumed.position.loss
    checksum = param_checksum(model)
    checksums: List[Optional[float]] = [None] * env.world_size
    dist.all_gather_object(checksums, checksum)
    steady = step_times[WARMUP_STEPS:] or step_times
    median = statistics.median(steady) if steady else None
    return {
        "rank": env.rank,
        "world_size": env.world_size,
        "backend": backend,
        "device_type": device.type,
        "strategy": cfg.trainer.strategy,
        "model": cfg.model.name,
        "steps": step,
        "epochs_started": epoch + 1,
        "global_batch_size": global_batch,
        "samples_per_s": global_batch / median if median else None,
        "step_time_s_median": median,
        "final_loss": final_loss,
        "param_checksum": checksum,
        "param_checksums": checksums,
        "time_to_first_step_s": _since_launch(first_step_at),
        "restart_count": env.restart_count,
        "resumed_from_step": start.resumed.position.step if start.resumed else None,
        "stopped_by": signal.Signals(STOP.signum).name if STOP.signum else None,
    }


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
