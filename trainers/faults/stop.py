"""Stop requests: a signal sets a flag, the loop checkpoints and stops at the next step boundary.

Ctrl-C / SIGTERM reach every worker through the agent, which forwards the signal it got to each
worker's process group (workers lead their own, as torchrun's do: launcher.worker.bootstrap). A
handler only sets a flag, because a collective cannot be left half-done; the ranks agree on it at a
step boundary (``StepSignals.exchange``, one step after it arrived), save a checkpoint and return. A
worker that does not get there within the grace period exits anyway, and a second signal exits at
once.
A SLURM preemption (USR2) uses the same path: ``install((signal.SIGUSR2,), grace_s)``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any, Iterable, Optional, Tuple

import torch
import torch.distributed as dist

# SIGUSR2: SLURM's warning before a time limit or preemption (submitit's checkpoint signal).
DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2)
REPEAT_WINDOW_S = 2.0  # a signal repeated within this is the same request, not the user insisting


class StopRequest:
    """Set by a signal handler (or by code, e.g. a preemption notice); read at step boundaries."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self.requested_wall: Optional[float] = None  # when it came (wall time): a preemption's time, for W&B
        self._grace_s = 10.0
        self._requested_at = 0.0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int) -> None:
        """Ask the loop to checkpoint and stop; exit unconditionally after the grace period."""
        if self.signum is not None:
            return
        self.signum = signum
        self._requested_at, self.requested_wall = time.monotonic(), time.time()
        threading.Thread(target=self._deadline, args=(signum, self._grace_s), daemon=True).start()

    def install(self, signals: Iterable[int] = DEFAULT_SIGNALS, grace_s: float = 10.0) -> None:
        """Route these signals to request(); main thread only (Python's rule for handlers)."""
        self._grace_s = grace_s
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signum is not None:
            # A stop can reach the worker twice within milliseconds (the agent's, and one sent to the worker's
            # group by someone else): only a later one is the user insisting.
            if time.monotonic() - self._requested_at > REPEAT_WINDOW_S:
                os._exit(128 + signum)
            return
        print(f"got {signal.Signals(signum).name}: checkpointing at the next step boundary "
              f"(up to {self._grace_s:.0f}s; signal again to stop at once)", flush=True)
        self.request(signum)

    @staticmethod
    def _deadline(signum: int, grace_s: float) -> None:
        time.sleep(grace_s)
        print(f"no clean stop within {grace_s:.0f}s of {signal.Signals(signum).name}: exiting", flush=True)
        os._exit(128 + signum)


    def exit_if_stopped(self) -> None:
        """After the loop stopped for a signal: leave now, with the signal's exit code.

        torch's process wrapper would otherwise wait for the agent to collect a result, which an
        agent that is shutting down never does, and the worker would sit until the grace period ends.
        """
        if self.signum is not None:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + self.signum)


STOP = StopRequest()  # one per worker process, like the signal handlers that set it


class StepSignals:
    """Every rank takes the same decision at the same step, without a blocking collective per step.

    Each step's flags go out in an asynchronous all-reduce that is read at the next step boundary:
    it travels while the next step computes, so agreeing costs no wait (a blocking all-reduce of two
    floats cost 5-6% of a small model's step on 2 cores, bench/step_costs.py). A request is acted on
    one step after it arrives, on every rank alike. ``settle()`` collects the last one in flight.
    """

    def __init__(self, world_size: int, device: torch.device) -> None:
        self._world = world_size
        self._device = device
        self._in_flight: Optional[Tuple[Any, torch.Tensor]] = None

    def exchange(self, stop: bool, time_due: bool) -> Tuple[bool, bool]:
        """(stop, checkpoint-by-time) agreed across ranks: true if it was true on any rank a step ago."""
        if self._world == 1:
            return stop, time_due
        flags = torch.tensor([float(stop), float(time_due)], device=self._device)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, async_op=True)
        agreed = self.settle()
        self._in_flight = (work, flags)
        return agreed

    def settle(self) -> Tuple[bool, bool]:
        """Wait for the flags in flight, if any, and return them: (False, False) when none were."""
        if self._in_flight is None:
            return False, False
        work, flags = self._in_flight
        self._in_flight = None
        work.wait()
        values = flags.tolist()
        return bool(values[0]), bool(values[1])
