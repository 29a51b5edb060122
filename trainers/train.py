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
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from launcher.runtime import env
from launcher.runtime.beats import heartbeat
from launcher.runtime.config import read_config
from trainers.autobatch import activation_bytes, resolve_auto_batch
from trainers.checkpointing import Checkpointer, open_epoch
from trainers.data import build_dataset, build_loader, grouped_batches
from trainers.dist import DistEnv, init_process_group, pick_device, process_group_timeout, seed_everything, set_threads
from trainers.faults import maybe_fail
from trainers.features_report import FeatureTimes, feature_summary, loader_settings
from trainers.footprint import PeakMemory, state_bytes
from trainers.inject_hang import maybe_hang
from trainers.loggers import build_loggers, run_dir_from_env
from trainers.memory import OutOfMemory, memory_stats, oom_message
from trainers.metrics import Gathered, StepMeter, attach_comm_timer, job_figures, window_metrics
from trainers.models import build_model, param_checksum
from trainers.precision import Precision, resolve_precision
from trainers.stepping import grad_norm, optimizer_step
from trainers.stop import STOP
from trainers.strategies import STRATEGIES, data_layout
from trainers.transforms import prepare_model

WARMUP_STEPS = 3  # steps left out of the steady-state step time (first-step costs, allocator warm-up)


def train(cfg: Any, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """Train cfg.model with cfg.trainer.strategy; rank 0's result carries the job-wide figures."""
    env = DistEnv.from_environ()
    STOP.install(grace_s=cfg.checkpoint.grace_s)  # Ctrl-C/SIGTERM: checkpoint at the next step boundary
    set_threads()
    device = pick_device(env)
    backend = init_process_group(env, device, process_group_timeout(cfg.watchdog.timeout_s))
    try:
        result = _train(cfg, run_dir, env, device, backend)
    except torch.OutOfMemoryError as e:  # outside the loop (model, auto batch); the loop names its step
        raise OutOfMemory(oom_message(env.rank, device, None, cfg)) from e
    # Only on success: a failing rank must not close its connections before its error is recorded,
    # or its peers' "connection closed" errors may be recorded first and blamed (launcher.agent.launch.root_cause).
    dist.destroy_process_group()
    return result


def _train(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, backend: str) -> Dict[str, Any]:
    seed_everything(cfg.seed)  # the same initial weights on every rank
    model = STRATEGIES[cfg.trainer.strategy](prepare_model(build_model(cfg.model), cfg.trainer), device, cfg)
    seed_everything(cfg.seed + env.rank)  # per-rank randomness from here on
    dataset = build_dataset(cfg)
    precision = Precision(resolve_precision(cfg.trainer.precision, device), device, cfg.trainer.strategy)
    auto = resolve_auto_batch(model, dataset, cfg, env, device, precision) if cfg.data.batch_size == "auto" else {}
    layout = data_layout(cfg, env.rank, env.world_size, device)  # which shard, how many samples per step
    loader, sampler = build_loader(dataset, layout.batch_size, layout.shard_rank, layout.shard_count, cfg.seed,
                                   **loader_settings(cfg, device, env.rank))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    checkpointer = Checkpointer(cfg, run_dir, env.rank, env.world_size, device, model, optimizer)
    start = checkpointer.resume(len(loader))
    loggers = build_loggers(env.rank, run_dir, cfg.trainer.steps, cfg)
    comm = attach_comm_timer(model, env.world_size) if cfg.metrics.detailed else None
    meter = StepMeter(device, env.world_size, cfg.metrics.detailed, comm, compute_dtype=precision.dtype)
    accum = cfg.trainer.grad_accum_steps
    global_batch = layout.batch_size * layout.shard_count * accum  # the effective batch of one optimizer step
    memory = PeakMemory(device)
    print(f"rank {env.rank}/{env.world_size} (node {env.group_rank}, local rank {env.local_rank}, pid {os.getpid()}) "
          f"on {device}, {backend}, {len(sampler)} samples per epoch", flush=True)
    if layout.note and env.rank == 0:
        print(f"{cfg.trainer.strategy}: {layout.note}", flush=True)
    if cfg.data.record_shards and run_dir:
        _record_shard(run_dir, env.rank, list(iter(sampler)))

    step, epoch, first_step_at = start.step, start.epoch, None
    skip, rng, stop = start.skip, start.rng, False
    step_times: List[float] = []
    times = FeatureTimes()
    window_start, window_steps, loss = time.perf_counter(), 0, torch.zeros(())
    in_flight: Optional[Tuple[Gathered, Dict[str, Any]]] = None  # a log step's record awaiting its rows

    def log_window(gathered: Gathered, record: Dict[str, Any]) -> None:
        rows = gathered.rows()
        record["loss"] = float(rows[:, 0].mean())
        if meter.detailed:
            record.update(window_metrics(rows, cfg.metrics.straggler_fraction, record["samples_per_s"], meter))
        loggers.log(record)

    heartbeat()  # arms the node's hang watchdog for this rank (launcher.agent.watchdog)
    while step < cfg.trainer.steps and not stop:
        sampler.set_epoch(epoch)
        batch_in_epoch = skip
        for micro_batches in grouped_batches(open_epoch(loader, skip, rng), accum):  # one optimizer step's batches
            t0 = time.perf_counter()
            meter.start(micro_batches[0][0][0], sum(len(b[0][0]) for b in micro_batches))
            try:  # forward + backward as the strategy needs them, accumulation, clipping, optimizer step
                result = optimizer_step(model, optimizer, micro_batches, device, precision, cfg.trainer.max_grad_norm, meter)
            except torch.OutOfMemoryError as e:
                raise OutOfMemory(oom_message(env.rank, device, step + 1, cfg)) from e
            loss = result.loss
            step += 1
            batch_in_epoch += len(micro_batches)
            step_times.append(time.perf_counter() - t0)
            meter.end(counted=step > WARMUP_STEPS)
            if in_flight is not None:  # the last log step's figures have arrived during this step
                with meter.measuring():
                    log_window(*in_flight)
                in_flight = None
            logging = step % cfg.trainer.log_every == 0 or step == cfg.trainer.steps
            if result.grad_norm is None and (logging or times.grad_norm_first is None):
                with meter.measuring():  # not clipping: the norm is read for logging only
                    result.grad_norm = grad_norm(model)
            times.add(result)
            maybe_fail(env.rank, step, env.restart_count)
            window_steps += 1
            if first_step_at is None:
                first_step_at = time.time()
            if logging:
                with meter.measuring():  # counted in metrics_overhead_share
                    elapsed = time.perf_counter() - window_start
                    record = {
                        "step": step,
                        "epoch": epoch,
                        "loss": None,  # from the gathered rows
                        "samples_per_s": global_batch * window_steps / elapsed,
                        "step_time_s": elapsed / window_steps,
                        **times.window(window_steps, precision), **memory_stats(device),
                    }
                    # the loss rides along; the rows travel during the next step and are logged then
                    in_flight = (meter.gather(float(loss)), record)
                    window_start, window_steps = time.perf_counter(), 0
            heartbeat()
            maybe_hang(env.rank, step)
            stop = checkpointer.after_step(step, epoch, batch_in_epoch, lambda: _mean_across_ranks(loss, env.world_size),
                                           last=step == cfg.trainer.steps)
            if step == cfg.trainer.steps or stop:
                break
        epoch, skip, rng = epoch + 1, 0, None
    if in_flight is not None:
        log_window(*in_flight)
    figures = job_figures(meter, step - WARMUP_STEPS if step > WARMUP_STEPS else step)

    if step_times or start.resumed is None:
        final_loss = _mean_across_ranks(loss.detach(), env.world_size)
    else:  # a finished run started again: nothing left to train
        final_loss = start.resumed.position.loss
    checksum = param_checksum(model)
    checksums: List[Optional[float]] = [None] * env.world_size
    dist.all_gather_object(checksums, checksum)
    footprint = {**state_bytes(model, optimizer), "peak_memory_bytes": memory.peak_bytes(), **memory_stats(device),
                 "activation_bytes": activation_bytes(model, dataset, layout.batch_size, device, precision)}
    footprints: List[Optional[Dict[str, int]]] = [None] * env.world_size
    dist.all_gather_object(footprints, footprint)
    steady = step_times[WARMUP_STEPS:] or step_times
    median = statistics.median(steady) if steady else None
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
        "samples_per_s": global_batch / median if median else None,
        "step_time_s_median": median,
        "final_loss": final_loss,
        "param_checksum": checksum,
        "param_checksums": checksums,
        "time_to_first_step_s": _since_launch(first_step_at),
        "restart_count": env.restart_count,
        "resumed_from_step": start.resumed.position.step if start.resumed else None,
        "stopped_by": signal.Signals(STOP.signum).name if STOP.signum else None,
        **_strategy_figures(cfg, layout, footprints, global_batch / median if median else None, memory.kind),
        **figures,
        **feature_summary(cfg, layout, precision, times, step_times, median), **auto,
    }
    loggers.log_summary(result)
    loggers.close()
    return result


def _strategy_figures(cfg: Any, layout: Any, footprints: List[Any], samples_per_s: Optional[float], memory_kind: str) -> Dict[str, Any]:
    """Per-rank memory and state bytes, for comparing strategies (compare.json)."""
    figures: Dict[str, Any] = {f"{key}_per_rank": [f[key] for f in footprints] for key in footprints[0]}
    figures.update({
        "peak_memory_kind": memory_kind,
        "replica_groups": layout.replica_groups,
        "strategy_note": layout.note or None,
        "processes": len(footprints),
    })
    if cfg.model.name == "gpt" and samples_per_s:
        figures["tokens_per_s"] = samples_per_s * cfg.model.seq_len
    return figures


def _mean_across_ranks(value: torch.Tensor, world: int) -> float:
    t = value.detach().to(torch.float64).reshape(1).clone()
    if world > 1:
        t = t.to(value.device)
        dist.all_reduce(t)
    return float(t.item()) / world


def _since_launch(at: Optional[float]) -> Optional[float]:
    start = os.environ.get(env.START_TIME)
    if at is None or not start:
        return None
    return at - float(start)


def _record_shard(run_dir: str, rank: int, indices: List[int]) -> None:
    path = Path(run_dir) / "shards" / f"rank-{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(indices))


def main(argv: List[str]) -> int:
    """torchrun entry point: `key=value` overrides as arguments, results on rank 0's stdout."""
    cfg = read_config(argv)
    result = train(cfg, run_dir_from_env())
    if result["rank"] == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
