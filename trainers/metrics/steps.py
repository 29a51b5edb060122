"""Per-step metrics on every rank (phase times, communication, memory, CPU), aggregated on rank 0.

Each rank times its own steps; at log steps one all_gather brings every rank's window to all
ranks, and rank 0's loggers report the job-wide view: means, the slowest rank, peaks.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

from launcher.runtime import torch_private
from launcher.runtime.stragglers import stragglers
from .footprint import rss_peak_bytes
from .mfu import FlopCount, mfu_figures

# Per-rank figures gathered at each log step, in this order (only the loss when not detailed).
PHASES = ("data", "forward", "backward", "optimizer")
GATHERED = ("loss", "step", *PHASES, "comm", "rss_mb", "cpu_percent", "cuda_peak_mb")
MB = 1024.0 * 1024.0


class CommTimer:
    """DDP's gradient all-reduce time per step, from DDP's own runtime statistics.

    DDP's reducer records, in C++, when the first bucket's all-reduce starts and when the last one
    completes (CPU clocks, or CUDA events on GPU); sampling every iteration costs nothing measurable.
    A Python communication hook measured the same span but cost 3-6% of a small model's step on
    2 cores (bench/step_costs.py): its callbacks run for every bucket and contend for the GIL.
    The reducer publishes an iteration's figures at the next forward, so each reading is the
    previous step's: window and job means are over the steps read.
    """

    def __init__(self, model: Any) -> None:
        torch_private.ddp_sample_runtime_stats_every_step(model)
        self._logger = model.logger
        self._iteration = -1
        self._skip = False

    def skip_one(self) -> None:
        """The iteration just run is not a training step (trainers.stepping.settle_gradient_buckets): its
        all-reduce, which also waits for the slowest rank to arrive, is left out of the figures."""
        self._skip = True

    def take(self) -> Optional[float]:
        """Seconds the newest recorded step spent in its gradient all-reduce; None when none is new."""
        data = torch_private.ddp_runtime_stats(self._logger)
        iteration = data.get("iteration", -1)
        if iteration == self._iteration:
            return None
        self._iteration = iteration
        if self._skip:
            self._skip = False
            return None
        return max(0, data.get("backward_comm_time", 0)) / 1e9


def attach_comm_timer(model: torch.nn.Module, world_size: int) -> Optional[CommTimer]:
    """Time DDP's gradient all-reduce; None for models that are not DDP (their share is unknown)."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or world_size < 2:
        return None
    return CommTimer(model)


def count_tokens(x: Any) -> Optional[int]:
    """Tokens in a batch when the inputs are token ids (an integer tensor of shape [batch, seq, ...])."""
    if isinstance(x, torch.Tensor) and x.ndim >= 2 and not x.is_floating_point() and not x.is_complex():
        return int(x.numel())
    return None


class StepMeter:
    """Times one rank's steps: data wait, forward, backward, optimizer, communication.

    Call ``start(x, samples)`` when a batch arrives, ``phase(name)`` after each part and
    ``end()`` after the optimizer step. With ``detailed`` off nothing is timed or sampled, so a
    run without instrumentation pays nothing (bench/ compares the two).
    """

    def __init__(self, device: torch.device, world_size: int, detailed: bool, comm: Optional[CommTimer] = None,
                 compute_dtype: Optional[torch.dtype] = None) -> None:
        self.device, self.world_size, self.detailed, self.comm = device, world_size, detailed, comm
        self._cuda = device.type == "cuda"
        self._step: Dict[str, float] = {}
        self._window: Dict[str, float] = {}
        self._window_steps = 0
        self.totals: Dict[str, float] = {name: 0.0 for name in ("step", *PHASES, "comm")}
        self.comm_steps = 0  # steps whose communication time was read (CommTimer reads lag a step)
        self._last_end: Optional[float] = None
        self._mark = 0.0
        self.samples = 0
        self.tokens: Optional[int] = None
        self.steady_from = self.steady_until = time.perf_counter()
        self.steady_steps = 0
        self.overhead_s = 0.0  # seconds spent measuring and logging in the steady state (measuring())
        self.flops = FlopCount(enabled=detailed and self._cuda, dtype=compute_dtype)
        self._reset_window()
        if detailed:
            import psutil

            self._psutil = psutil
            psutil.cpu_percent(interval=None)  # the first call only starts the measurement window

    def _reset_window(self) -> None:
        self._window = {name: 0.0 for name in ("step", *PHASES, "comm")}
        self._window_steps = self._window_comm_steps = 0

    def start(self, x: Any, samples: int) -> None:
        if not self.detailed:
            return
        now = self._now()
        self.samples, self.tokens = samples, count_tokens(x)
        self._step = {"data": now - self._last_end if self._last_end is not None else 0.0}
        self._step_start = now if self._last_end is None else self._last_end
        self._mark = now
        self.flops.begin()
        self.overhead_s += time.perf_counter() - now

    def phase(self, name: str) -> None:
        if not self.detailed:
            return
        if name == "backward":
            self.flops.finish()
        now = self._now()
        self._step[name] = self._step.get(name, 0.0) + now - self._mark
        self._mark = time.perf_counter()
        self.overhead_s += self._mark - now

    def end(self, counted: bool = True) -> None:
        """Close the step; counted=False leaves it out of the job totals (warm-up steps)."""
        now = self._now() if self.detailed else time.perf_counter()
        # Steady-state wall clock, everything included (data, metrics, logging): what bench/ compares.
        if counted:
            self.steady_steps += 1
            self.steady_until = now
        else:
            self.steady_from, self.steady_steps, self.overhead_s = now, 0, 0.0
        if not self.detailed:
            return
        self._step["step"] = now - self._step_start
        for name, value in self._step.items():
            self._window[name] += value
            if counted:
                self.totals[name] += value
        self._window_steps += 1
        comm = self.comm.take() if self.comm else None
        if comm is not None:
            self._window["comm"] += comm
            self._window_comm_steps += 1
            if counted:
                self.totals["comm"] += comm
                self.comm_steps += 1
        self._last_end = time.perf_counter()
        self.overhead_s += self._last_end - now

    def set_aside(self) -> None:
        """Leave the time since the last step ended (a checkpoint save, the stop agreement) out of the next step.

        The next step's data wait ran from the last step's end: a save between them was counted as waiting
        for data, and in the mean step time that MFU divides by (a 2.6 GB save every few steps made an H100's
        MFU read 5.6% where its steps ran at 21%). Saves are goodput's checkpoint time, not the step's."""
        if self.detailed:
            self._last_end = self._now()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Count the time inside as measuring and logging overhead (a log step's gather and loggers)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.overhead_s += time.perf_counter() - t0

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize(self.device)  # phase times on GPU need the queued work finished
        return time.perf_counter()

    def gather(self, loss: float = float("nan")) -> Gathered:
        """Every rank's loss and window means as [world, len(GATHERED)] rows, or just the losses
        ([world, 1]) when not detailed: one asynchronous collective per log step (call it on all
        ranks); the training loop reads the rows a step later, so no rank waits for the others."""
        row = [loss]
        if not self.detailed:
            return Gathered(torch.tensor(row, dtype=torch.float64, device=self.device), self.world_size)
        steps = max(1, self._window_steps)
        means = {k: self._window[k] / steps for k in ("step", *PHASES)}
        means["comm"] = self._window["comm"] / max(1, self._window_comm_steps)  # over the steps read (CommTimer)
        rss_peak = rss_peak_bytes() / MB
        cuda_peak = torch.cuda.max_memory_allocated(self.device) / MB if self._cuda else 0.0
        cpu = float(self._psutil.cpu_percent(interval=None))
        row += list(means.values()) + [rss_peak, cpu, cuda_peak]
        self._reset_window()
        gathered = Gathered(torch.tensor(row, dtype=torch.float64, device=self.device), self.world_size)
        self._last_end = self._now()  # logging time is not the next step's data wait
        return gathered


class Gathered:
    """An all_gather of one float row per rank, in flight; ``rows()`` waits for it."""

    def __init__(self, local: torch.Tensor, world_size: int) -> None:
        self._parts = [local] if world_size == 1 else [torch.zeros_like(local) for _ in range(world_size)]
        self._work = None if world_size == 1 else dist.all_gather(self._parts, local, async_op=True)

    def rows(self) -> torch.Tensor:
        """[world, len(row)] on the CPU."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return torch.stack(self._parts).cpu()


def gather_rows(row: List[float], world_size: int, device: torch.device) -> torch.Tensor:
    """all_gather one float row per rank into a [world, len(row)] CPU tensor (a collective)."""
    return Gathered(torch.tensor(row, dtype=torch.float64, device=device), world_size).rows()


def window_metrics(rows: torch.Tensor, straggler_fraction: float, samples_per_s: float,
                   meter: StepMeter) -> Dict[str, Any]:
    """Rank 0's view of one logging window: phase means over ranks, peaks, the slowest rank."""
    col = dict(zip(GATHERED, zip(*rows.tolist())))  # plain floats: a handful of ranks, no tensor ops needed
    step_mean = sum(col["step"]) / len(col["step"])
    out: Dict[str, Any] = {f"time_{name}_s": sum(col[name]) / len(col[name]) for name in (*PHASES, "comm")}
    out["comm_share"] = out["time_comm_s"] / step_mean if step_mean > 0 else 0.0
    out["rss_peak_mb"] = max(col["rss_mb"])
    out["cpu_percent"] = max(col["cpu_percent"])
    # each rank's own figures too: the board's heatmap shows which rank lags, and when
    out["step_time_s_per_rank"] = list(col["step"])
    out["rss_mb_per_rank"] = list(col["rss_mb"])
    if meter.device.type == "cuda":
        out["cuda_peak_mb"] = max(col["cuda_peak_mb"])
        out["cuda_peak_mb_per_rank"] = list(col["cuda_peak_mb"])
    out.update(stragglers(list(col["step"]), straggler_fraction))
    if meter.tokens and meter.samples:
        out["tokens_per_s"] = samples_per_s * meter.tokens / meter.samples
    out.update(mfu_figures(meter.flops, step_mean, meter.device))
    return out


def overhead_share(meter: StepMeter) -> Optional[float]:
    """Steady-state time spent measuring and logging, as a share of the steady wall time."""
    wall = meter.steady_until - meter.steady_from
    return meter.overhead_s / wall if meter.steady_steps and wall > 0 else None


def steady_wall_s(meter: StepMeter) -> Optional[float]:
    """Seconds per step after warm-up by the wall clock, logging and metrics included."""
    if meter.steady_steps == 0:
        return None
    return (meter.steady_until - meter.steady_from) / meter.steady_steps


def job_figures(meter: StepMeter, counted_steps: int) -> Dict[str, Any]:
    """Job-wide figures over the steady-state steps for rank 0's result (a collective: call on all ranks)."""
    share = gather_rows([overhead_share(meter) or 0.0], meter.world_size, meter.device)
    wall = {"step_time_s_wall": steady_wall_s(meter), "metrics_overhead_share": float(share.max())}  # the slowest rank's
    if not meter.detailed:
        return {**wall, "metrics_note": "metrics.detailed=false: phase times, memory and CPU were not measured"}
    rows = meter.gather().rows()
    n = max(1, counted_steps)
    per_step = {name: meter.totals[name] / n for name in ("step", *PHASES)}
    per_step["comm"] = meter.totals["comm"] / max(1, meter.comm_steps)
    means = gather_rows([per_step[k] for k in ("step", *PHASES, "comm")], meter.world_size, meter.device).mean(dim=0)
    out: Dict[str, Any] = {f"time_{name}_s": float(means[i + 1]) for i, name in enumerate((*PHASES, "comm"))}
    # only DDP's gradient all-reduce is timed (CommTimer); elsewhere the share is unknown, not zero
    out["comm_share"] = float(means[-1] / means[0]) if meter.comm is not None and float(means[0]) > 0 else None
    out["rss_peak_mb"] = float(rows[:, GATHERED.index("rss_mb")].max())
    if meter.device.type == "cuda":
        out["cuda_peak_mb"] = float(rows[:, GATHERED.index("cuda_peak_mb")].max())
    out.update(mfu_figures(meter.flops, float(means[0]), meter.device))
    return {**wall, **out}
