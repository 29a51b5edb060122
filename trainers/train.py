"""The built-in training loop. It knows torchrun's environment contract and the config, nothing else.

Run it under the launcher (the default job) or directly under torchrun:
    torchrun --nproc-per-node 2 -m launcher.trainers.train trainer.steps=50
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from launcher.runtime.beats import heartbeat
from launcher.runtime.config import read_config
from launcher.runtime.env import START_TIME
from launcher.runtime.goodput import GoodputClock, first_step_of_launch, job_goodput
from launcher.runtime.schema import Status
from .autobatch import activation_bytes, resolve_auto_batch
from .checkpoint.checkpointer import Checkpointer, Start, open_epoch
from .data import ResumableSampler, build_dataset, build_loader, grouped_batches
from .faults.hang import maybe_hang
from .faults.inject import maybe_fail
from .faults.stop import STOP
from .metrics.features import FeatureTimes, feature_summary, loader_settings
from .metrics.footprint import PeakMemory, state_bytes
from .metrics.loggers import MetricsLogger, build_loggers, run_dir_from_env
from .metrics.memory import OutOfMemory, memory_stats, oom_message
from .metrics.steps import Gathered, StepMeter, attach_comm_timer, job_figures, window_metrics
from .models import build_model, param_checksum
from .parallel.dist import DistEnv, init_process_group, pick_device, process_group_timeout, seed_everything, set_threads
from .parallel.strategies import STRATEGIES, DataLayout, data_layout
from .precision import Precision, resolve_precision
from .stepping import grad_norm, optimizer_step, settle_gradient_buckets
from .shards import SeenRecorder, record_shard
from .transforms import prepare_model

WARMUP_STEPS = 3  # steps left out of the steady-state step time (first-step costs, allocator warm-up)


def train(cfg: Any, run_dir: Optional[str] = None) -> Dict[str, Any]:
    """Train cfg.model with cfg.trainer.strategy; rank 0's result carries the job-wide figures."""
    marks = {"launch": time.time()}  # the attempt's start, by phase (launcher.runtime.goodput.PHASES)
    env = DistEnv.from_environ()
    STOP.install(grace_s=cfg.checkpoint.grace_s)  # Ctrl-C/SIGTERM: checkpoint at the next step boundary
    set_threads()
    device = pick_device(env)
    backend = init_process_group(env, device, process_group_timeout(cfg.watchdog.timeout_s))
    marks["process_group"] = time.time()
    try:
        result = _train(cfg, run_dir, env, device, backend, marks)
    except torch.OutOfMemoryError as e:  # outside the loop (model, auto batch); the loop names its step
        raise OutOfMemory(oom_message(env.rank, device, None, cfg)) from e
    # Only on success: a failing rank must not close its connections before its error is recorded,
    # or its peers' "connection closed" errors may be recorded first and blamed (launcher.agent.failures.root_cause).
    dist.destroy_process_group()
    return result


@dataclass
class _Run:
    """What set-up builds for the loop and the finish, so the steps share one object, not a dozen locals."""

    model: torch.nn.Module
    dataset: TensorDataset
    precision: Precision
    auto: Dict[str, Any]  # the automatic batch size's figures; empty unless data.batch_size=auto
    layout: DataLayout
    loader: DataLoader
    sampler: ResumableSampler
    optimizer: torch.optim.Optimizer
    checkpointer: Checkpointer
    start: Start  # where the loop begins: from scratch or just after a checkpoint
    loggers: MetricsLogger
    meter: StepMeter
    accum: int  # micro-batches per optimizer step
    global_batch: int  # the effective batch of one optimizer step
    memory: PeakMemory
    clock: GoodputClock  # rank 0's record of where this attempt's time went (launcher.runtime.goodput)
    run_dir: Optional[str]
    seen: SeenRecorder  # data.record_shards: the indices of every step


@dataclass
class _LoopState:
    """Where the loop is, what the summary needs from it, and the metrics window still open."""

    step: int
    epoch: int
    offset: int  # samples of `epoch` all ranks consumed before this attempt (a resumed run); 0 from the next epoch on
    rng: Optional[dict]  # RNG states to restore when opening `epoch` (open_epoch); None from the next epoch on
    stop: bool = False  # the ranks agreed to stop (a signal arrived on one of them)
    first_step_at: Optional[float] = None
    step_times: List[float] = field(default_factory=list)
    times: FeatureTimes = field(default_factory=FeatureTimes)
    window_start: float = field(default_factory=time.perf_counter)
    window_steps: int = 0
    loss: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    in_flight: Optional[Tuple[Gathered, Dict[str, Any]]] = None  # a log step's record awaiting its rows


def _train(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, backend: str,
           marks: Dict[str, float]) -> Dict[str, Any]:
    """Set up, train, finish: every rank runs the three in lockstep, as each holds collectives."""
    run = _set_up(cfg, run_dir, env, device, marks)
    _announce(cfg, run_dir, env, device, backend, run)
    state = _loop(cfg, env, device, run)
    return _finish(cfg, env, device, backend, run, state)


def _set_up(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, marks: Dict[str, float]) -> _Run:
    """Model, data, optimizer and metrics, resumed from the newest checkpoint if there is one."""
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
    clock = GoodputClock(run_dir, _launch_started(), env.attempt, env.rank)
    for phase, at in marks.items():
        clock.mark(phase, at)
    checkpointer = Checkpointer(cfg, run_dir, env.rank, env.world_size, device, model, optimizer, clock)
    clock.mark("build")
    per_batch = layout.batch_size * layout.shard_count  # one batch of every rank: the epoch's position counts samples
    start = checkpointer.resume(per_batch, lambda offset: max(0, len(dataset) - offset) // layout.shard_count // layout.batch_size)
    clock.mark("reload")
    clock.resumed_at(start.step)
    loggers = build_loggers(env.rank, run_dir, cfg.trainer.steps, cfg)
    comm = attach_comm_timer(model, env.world_size) if cfg.metrics.detailed else None
    meter = StepMeter(device, env.world_size, cfg.metrics.detailed, comm, compute_dtype=precision.dtype)
    accum = cfg.trainer.grad_accum_steps
    return _Run(model, dataset, precision, auto, layout, loader, sampler, optimizer, checkpointer, start, loggers,
                meter, accum, global_batch=layout.batch_size * layout.shard_count * accum, memory=PeakMemory(device),
                clock=clock, run_dir=run_dir,
                seen=SeenRecorder(run_dir, cfg.data.record_shards, env.rank, env.attempt, layout.batch_size))


def _announce(cfg: Any, run_dir: Optional[str], env: DistEnv, device: torch.device, backend: str, run: _Run) -> None:
    """Say where this rank runs and what it reads, before the first step."""
    print(f"rank {env.rank}/{env.world_size} (node {env.group_rank}, local rank {env.local_rank}, pid {os.getpid()}) "
          f"on {device}, {backend}, {len(run.sampler)} samples per epoch", flush=True)
    if run.layout.note and env.rank == 0:
        print(f"{cfg.trainer.strategy}: {run.layout.note}", flush=True)
    if cfg.data.record_shards and run_dir:
        record_shard(run_dir, env.rank, list(iter(run.sampler)))


def _loop(cfg: Any, env: DistEnv, device: torch.device, run: _Run) -> _LoopState:
    """Optimizer steps, epoch after epoch, until cfg.trainer.steps or until the ranks agree to stop."""
    start = run.start
    state = _LoopState(start.step, start.epoch, start.offset, start.rng)
    per_batch = run.layout.batch_size * run.layout.shard_count
    heartbeat()  # arms the node's hang watchdog for this rank (launcher.agent.watchdog)
    while state.step < cfg.trainer.steps and not state.stop:
        run.sampler.set_epoch(state.epoch, state.offset)  # a resumed epoch goes on where all ranks together stood
        run.seen.open_epoch(run.sampler)
        batch_in_epoch = 0  # since the sampler's start
        epoch_batches = open_epoch(run.loader, state.offset > 0, state.rng)
        for micro_batches in grouped_batches(epoch_batches, run.accum):  # one optimizer step's batches
            if settle_gradient_buckets(run.model, micro_batches[0][0], device, run.precision) and run.meter.comm:
                run.meter.comm.skip_one()  # once per attempt
            run.clock.step_started()
            _train_step(cfg, env, device, run, state, micro_batches)
            run.clock.step_ended(state.step)
            run.seen.step(state.step, state.epoch, batch_in_epoch, len(micro_batches))
            batch_in_epoch += len(micro_batches)
            heartbeat()
            maybe_hang(env.rank, state.step)
            samples = state.offset + batch_in_epoch * per_batch
            state.stop = run.checkpointer.after_step(state.step, state.epoch, samples // per_batch,
                                                     lambda: _mean_across_ranks(state.loss, env.world_size),
                                                     last=state.step == cfg.trainer.steps, samples=samples)
            run.meter.set_aside()
            if state.step == cfg.trainer.steps or state.stop:
                break
        state.epoch, state.offset, state.rng = state.epoch + 1, 0, None
    run.checkpointer.finish()  # a background save completes before the worker reports or exits
    run.clock.close()
    if state.in_flight is not None:  # the last record also says where the job's time went so far
        gathered, record = state.in_flight
        _log_window(cfg, run, gathered, {**record, **_goodput_so_far(env, run)})
    return state


def _goodput_so_far(env: DistEnv, run: _Run) -> Dict[str, Any]:
    """Rank 0's job-wide goodput up to now; the launcher's summary.json recounts it at the job's end."""
    started = _launch_started()
    if env.rank != 0 or started is None:
        return {}
    return job_goodput(run.run_dir, started, time.time(), Status.COMPLETED)


def _train_step(cfg: Any, env: DistEnv, device: torch.device, run: _Run, state: _LoopState,
                micro_batches: List[Any]) -> None:
    """One optimizer step and its metrics; the last log step's window is logged here, its rows having arrived."""
    t0 = time.perf_counter()
    meter = run.meter
    meter.start(micro_batches[0][0][0], sum(len(b[0][0]) for b in micro_batches))
    try:  # forward + backward as the strategy needs them, accumulation, clipping, optimizer step
        result = optimizer_step(run.model, run.optimizer, micro_batches, device, run.precision,
                                cfg.trainer.max_grad_norm, meter)
    except torch.OutOfMemoryError as e:
        raise OutOfMemory(oom_message(env.rank, device, state.step + 1, cfg)) from e
    state.loss = result.loss
    state.step += 1
    state.step_times.append(time.perf_counter() - t0)
    meter.end(counted=state.step > WARMUP_STEPS)
    if state.in_flight is not None:  # the last log step's figures have arrived during this step
        with meter.measuring():
            _log_window(cfg, run, *state.in_flight)
        state.in_flight = None
    logging = state.step % cfg.trainer.log_every == 0 or state.step == cfg.trainer.steps
    if result.grad_norm is None and (logging or state.times.grad_norm_first is None):
        with meter.measuring():  # not clipping: the norm is read for logging only
            result.grad_norm = grad_norm(run.model)
    state.times.add(result)
    maybe_fail(env.rank, state.step, env.attempt)
    state.window_steps += 1
    if state.first_step_at is None:
        state.first_step_at = time.time()
    if logging:
        _close_window(device, run, state)


def _close_window(device: torch.device, run: _Run, state: _LoopState) -> None:
    """End the metrics window at a log step; its record waits in flight for the ranks' rows, so no rank waits now."""
    with run.meter.measuring():  # counted in metrics_overhead_share
        elapsed = time.perf_counter() - state.window_start
        record = {
            "step": state.step,
            "epoch": state.epoch,
            "loss": None,  # from the gathered rows
            "samples_per_s": run.global_batch * state.window_steps / elapsed,
            "step_time_s": elapsed / state.window_steps,
            **state.times.window(state.window_steps, run.precision), **memory_stats(device),
        }
        # the loss rides along; the rows travel during the next step and are logged then
        state.in_flight = (run.meter.gather(float(state.loss)), record)
        state.window_start, state.window_steps = time.perf_counter(), 0


def _log_window(cfg: Any, run: _Run, gathered: Gathered, record: Dict[str, Any]) -> None:
    """Log a closed window once its rows are here: the loss is the mean over ranks."""
    rows = gathered.rows()
    record["loss"] = float(rows[:, 0].mean())
    if run.meter.detailed:
        record.update(window_metrics(rows, cfg.metrics.straggler_fraction, record["samples_per_s"], run.meter))
    run.loggers.log(record)


def _finish(cfg: Any, env: DistEnv, device: torch.device, backend: str, run: _Run, state: _LoopState) -> Dict[str, Any]:
    """The run's result, logged as its summary; it holds collectives, so every rank calls it."""
    figures = job_figures(run.meter, state.step - WARMUP_STEPS if state.step > WARMUP_STEPS else state.step)
    if state.step_times or run.start.resumed is None:
        final_loss = _mean_across_ranks(state.loss.detach(), env.world_size)
    else:  # a finished run started again: nothing left to train
        final_loss = run.start.resumed.position.loss
    checksum = param_checksum(run.model)
    checksums = _gather_objects(checksum, env.world_size)
    footprint = {**state_bytes(run.model, run.optimizer), "peak_memory_bytes": run.memory.peak_bytes(),
                 **memory_stats(device),
                 "activation_bytes": activation_bytes(run.model, run.dataset, run.layout.batch_size, device,
                                                      run.precision)}
    footprints = _gather_objects(footprint, env.world_size)
    steady = state.step_times[WARMUP_STEPS:] or state.step_times
    median = statistics.median(steady) if steady else None
    samples_per_s = run.global_batch / median if median else None
    result = {
        "rank": env.rank,
        "world_size": env.world_size,
        "backend": backend,
        "device_type": device.type,
        "strategy": cfg.trainer.strategy,
        "model": cfg.model.name,
        "steps": state.step,
        "epochs_started": state.epoch + 1,
        "global_batch_size": run.global_batch,
        "samples_per_s": samples_per_s,
        "step_time_s_median": median,
        "final_loss": final_loss,
        "param_checksum": checksum,
        "param_checksums": checksums,
        "time_to_first_step_s": _since_launch(_first_step_at(env, run, state)),
        "restart_count": env.restart_count,
        "resumed_from_step": run.start.resumed.position.step if run.start.resumed else None,
        "stopped_by": signal.Signals(STOP.signum).name if STOP.signum else None,
        **_strategy_figures(cfg, run.layout, footprints, samples_per_s, run.memory.kind),
        **figures,
        **feature_summary(cfg, run.layout, run.precision, state.times, state.step_times, median), **run.auto,
        "checkpoint_async": run.checkpointer.is_async, "checkpoint_staged_bytes": run.checkpointer.staged_bytes,
        **_goodput_so_far(env, run),
    }
    run.loggers.log_summary({**result, **_ending(cfg, state)})
    run.loggers.close()
    return result


def _ending(cfg: Any, state: _LoopState) -> Dict[str, Any]:
    """How this attempt ended, for the W&B run's summary (summary.json has the launcher's word): a requeued job's
    run says "preempted" and when while it waits, and "completed" once its last attempt ends."""
    if state.step >= cfg.trainer.steps or STOP.signum is None:
        return {"status": str(Status.COMPLETED)}
    if STOP.signum == signal.SIGUSR2:  # SLURM's warning: a preemption or a time limit (launcher.backends.slurm)
        return {"status": str(Status.PREEMPTED), "preempted_at": STOP.requested_wall}
    return {"status": str(Status.INTERRUPTED)}


def _gather_objects(value: Any, world: int) -> List[Any]:
    """Every rank's value, in rank order (a collective)."""
    values: List[Any] = [None] * world
    dist.all_gather_object(values, value)
    return values


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


def _first_step_at(env: DistEnv, run: _Run, state: _LoopState) -> Optional[float]:
    """When the launch's first step ended; after a restart, when it started (rank 0's goodput records keep the
    first attempt's), so start-up stays the command's, not the restart's."""
    if env.attempt == 0:
        return state.first_step_at
    first_started = first_step_of_launch(run.run_dir, _launch_started())
    return first_started if first_started is not None else state.first_step_at


def _launch_started() -> Optional[float]:
    start = os.environ.get(START_TIME)
    return float(start) if start else None


def _since_launch(at: Optional[float]) -> Optional[float]:
    start = _launch_started()
    if at is None or start is None:
        return None
    return at - start


def main(argv: List[str]) -> int:
    """torchrun entry point: `key=value` overrides as arguments, results on rank 0's stdout."""
    cfg = read_config(argv)
    result = train(cfg, run_dir_from_env())
    if result["rank"] == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
