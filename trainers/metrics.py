"""Per-step metrics on every rank (phase times, communication, memory, CPU), aggregated on rank 0.

Each rank times its own steps; at log steps one all_gather brings every rank's window to all
ranks, and rank 0's loggers report the job-wide view: means, the slowest rank, peaks.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from trainers.mfu import FlopCount, mfu_figures

# Per-rank figures gathered at each log step, in this order.
PHASES = ("data", "forward", "backward", "optimizer")
GATHERED = ("step", *PHASES, "comm", "rss_mb", "cpu_percent", "cuda_peak_mb")
MB = 1024.0 * 1024.0


class CommTimer:
    """A DDP communication hook that averages gradients exactly like DDP's built-in all-reduce and
    records when each bucket's all-reduce starts and completes.

    The reported communication time is the span from the first bucket's launch to the last
    bucket's completion in a step: with buckets overlapping backward, that is the wall time the
    network was busy, never more than the step.
    """

    def __init__(self, world_size: int, group: Optional[Any] = None) -> None:
        self.world_size = world_size
        self.group = group
        self._first: Optional[float] = None
        self._last: Optional[float] = None

    def all_reduce_mean(self, tensor: torch.Tensor) -> "torch.futures.Future[torch.Tensor]":
        """Average tensor across ranks (sum of tensor / world), timed; returns a future of it."""
        start = time.perf_counter()
        if self._first is None:
            self._first = start
        tensor.div_(self.world_size)  # the same arithmetic as DDP's default hook
        fut = dist.all_reduce(tensor, group=self.group, async_op=True).get_future()

        def done(f: "torch.futures.Future[List[torch.Tensor]]") -> torch.Tensor:
            self._last = time.perf_counter()
            return f.value()[0]

        return fut.then(done)

    def release(self) -> None:
        """Drop the process group on the main thread once training is done. Otherwise the last
        reference may go with a finished future's callback on gloo's own thread, whose destructor
        then joins itself and aborts the worker ("Resource deadlock avoided")."""
        self.group = None

    def take(self) -> float:
        """Communication seconds since the last call (0 when nothing was sent)."""
        span = (self._last - self._first) if self._first is not None and self._last is not None else 0.0
        self._first = self._last = None
        return max(0.0, span)


def _timed_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string annotations
    return state.all_reduce_mean(bucket.buffer())


def attach_comm_timer(model: torch.nn.Module, world_size: int) -> Optional[CommTimer]:
    """Time DDP's gradient all-reduce with a comm hook; None for models that are not DDP."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or world_size < 2:
        return None
    timer = CommTimer(world_size, model.process_group)
    model.register_comm_hook(timer, _timed_allreduce_hook)
    return timer


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

    def __init__(self, device: torch.device, world_size: int, detailed: bool, comm: Optional[CommTimer] = None) -> None:
        self.device, self.world_size, self.detailed, self.comm = device, world_size, detailed, comm
        self._cuda = device.type == "cuda"
        self._step: Dict[str, float] = {}
        self._window: Dict[str, float] = {}
        self._window_steps = 0
        self.totals: Dict[str, float] = {name: 0.0 for name in ("step", *PHASES, "comm")}
        self._rss_peak = 0.0
        self._last_end: Optional[float] = None
        self._mark = 0.0
        self.samples = 0
        self.tokens: Optional[int] = None
        self.steady_from = self.steady_until = time.perf_counter()
        self.steady_steps = 0
        self.flops = FlopCount(enabled=detailed and self._cuda)
        self._reset_window()
        if detailed:
            import psutil

            self._psutil = psutil
            self._process = psutil.Process()
            psutil.cpu_percent(interval=None)  # the first call only starts the measurement window

    def _reset_window(self) -> None:
        self._window = {name: 0.0 for name in ("step", *PHASES, "comm")}
        self._window_steps = 0

    def start(self, x: Any, samples: int) -> None:
        if not self.detailed:
            return
        now = self._now()
        self.samples, self.tokens = samples, count_tokens(x)
        self._step = {"data": now - self._last_end if self._last_end is not None else 0.0}
        self._step_start = now if self._last_end is None else self._last_end
        self._mark = now
        self.flops.begin()

    def phase(self, name: str) -> None:
        if not self.detailed:
            return
        if name == "backward":
            self.flops.finish()
        now = self._now()
        self._step[name] = self._step.get(name, 0.0) + now - self._mark
        self._mark = now

    def end(self, counted: bool = True) -> None:
        """Close the step; counted=False leaves it out of the job totals (warm-up steps)."""
        now = self._now() if self.detailed else time.perf_counter()
        # Steady-state wall clock, everything included (data, metrics, logging): what bench/ compares.
        if counted:
            self.steady_steps += 1
            self.steady_until = now
        else:
            self.steady_from, self.steady_steps = now, 0
        if not self.detailed:
            return
        self._step["step"] = now - self._step_start
        self._step["comm"] = self.comm.take() if self.comm else 0.0
        for name, value in self._step.items():
            self._window[name] += value
            if counted:
                self.totals[name] += value
        self._window_steps += 1
        self._last_end = now

    def _now(self) -> float:
        if self._cuda:
            torch.cuda.synchronize(self.device)  # phase times on GPU need the queued work finished
        return time.perf_counter()

    def gather(self) -> Optional[torch.Tensor]:
        """Every rank's window means as a [world, len(GATHERED)] tensor (a collective: call on all ranks)."""
        if not self.detailed:
            return None
        steps = max(1, self._window_steps)
        self._rss_peak = max(self._rss_peak, self._process.memory_info().rss / MB)
        cuda_peak = torch.cuda.max_memory_allocated(self.device) / MB if self._cuda else 0.0
        cpu = float(self._psutil.cpu_percent(interval=None))
        row = [self._window[k] / steps for k in ("step", *PHASES, "comm")] + [self._rss_peak, cpu, cuda_peak]
        self._reset_window()
        rows = gather_rows(row, self.world_size, self.device)
        self._last_end = self._now()  # logging time is not the next step's data wait
        return rows


def gather_rows(row: List[float], world_size: int, device: torch.device) -> torch.Tensor:
    """all_gather one float row per rank into a [world, len(row)] CPU tensor (a collective)."""
    local = torch.tensor(row, dtype=torch.float64, device=device)
    if world_size == 1:
        return local.reshape(1, -1).cpu()
    rows = [torch.zeros_like(local) for _ in range(world_size)]
    dist.all_gather(rows, local)
    return torch.stack(rows).cpu()


def window_metrics(rows: torch.Tensor, straggler_fraction: float, samples_per_s: float,
                   meter: StepMeter) -> Dict[str, Any]:
    """Rank 0's view of one logging window: phase means over ranks, peaks, the slowest rank."""
    col = {name: rows[:, i] for i, name in enumerate(GATHERED)}
    step_mean = float(col["step"].mean())
    out: Dict[str, Any] = {f"time_{name}_s": float(col[name].mean()) for name in (*PHASES, "comm")}
    out["comm_share"] = out["time_comm_s"] / step_mean if step_mean > 0 else 0.0
    out["rss_peak_mb"] = float(col["rss_mb"].max())
    out["cpu_percent"] = float(col["cpu_percent"].max())
    if meter.device.type == "cuda":
        out["cuda_peak_mb"] = float(col["cuda_peak_mb"].max())
    out.update(stragglers([float(t) for t in col["step"]], straggler_fraction))
    if meter.tokens and meter.samples:
        out["tokens_per_s"] = samples_per_s * meter.tokens / meter.samples
    out.update(mfu_figures(meter.flops, step_mean, meter.device))
    return out


def stragglers(step_times: List[float], fraction: float) -> Dict[str, Any]:
    """Spread of per-rank step time; names the slowest rank when it lags the median by more than fraction."""
    ordered = sorted(step_times)
    median = ordered[len(ordered) // 2] if len(ordered) % 2 else (ordered[len(ordered) // 2 - 1] + ordered[len(ordered) // 2]) / 2
    slowest = max(range(len(step_times)), key=lambda r: step_times[r])
    spread = (ordered[-1] - ordered[0]) / median if median > 0 else 0.0
    lag = step_times[slowest] / median - 1.0 if median > 0 else 0.0
    out: Dict[str, Any] = {"step_time_spread": spread, "slowest_rank": slowest, "slowest_rank_lag": lag}
    out["straggler_rank"] = slowest if lag > fraction else None
    return out


def steady_wall_s(meter: StepMeter) -> Optional[float]:
    """Seconds per step after warm-up by the wall clock, logging and metrics included."""
    if meter.steady_steps == 0:
        return None
    return (meter.steady_until - meter.steady_from) / meter.steady_steps


def job_figures(meter: StepMeter, counted_steps: int) -> Dict[str, Any]:
    """Job-wide figures over the steady-state steps for rank 0's result (a collective: call on all ranks)."""
    wall = {"step_time_s_wall": steady_wall_s(meter)}
    if not meter.detailed:
        return {**wall, "metrics_note": "metrics.detailed=false: phase times, memory and CPU were not measured"}
    rows = meter.gather()
    assert rows is not None
    n = max(1, counted_steps)
    per_step = {name: meter.totals[name] / n for name in ("step", *PHASES, "comm")}
    means = gather_rows([per_step[k] for k in ("step", *PHASES, "comm")], meter.world_size, meter.device).mean(dim=0)
    out: Dict[str, Any] = {f"time_{name}_s": float(means[i + 1]) for i, name in enumerate((*PHASES, "comm"))}
    # only DDP's gradient all-reduce is timed (its comm hook); elsewhere the share is unknown, not zero
    out["comm_share"] = float(means[-1] / means[0]) if meter.comm is not None and float(means[0]) > 0 else None
    out["rss_peak_mb"] = float(rows[:, GATHERED.index("rss_mb")].max())
    if meter.device.type == "cuda":
        out["cuda_peak_mb"] = float(rows[:, GATHERED.index("cuda_peak_mb")].max())
    out.update(mfu_figures(meter.flops, float(means[0]), meter.device))
    return {**wall, **out}
