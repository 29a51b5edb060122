"""Where a script's step time goes on this rank: computing, or waiting in collectives for the other ranks. Stdlib only;
executed into a worker's progress namespace before progress.py (launcher.worker.progress.WORKER_FILES).

Every rank of a synchronous job steps at the slowest rank's pace, so step times cannot name it; the time each rank
takes before it joins the step's collective, and the time it then waits for the others, can. Two sources:
- a DistributedDataParallel model the training loop holds (found as the DataLoader is, in the calling frames'
  locals and their `self`, at the first step and then at most once a minute): its reducer's own clock of each
  iteration (launcher.runtime.torch_private.ddp_runtime_stats, read at each step: ~7 us). A rank's own work is
  from the previous iteration's gradient all-reduce ending to its gradients being ready (the optimizer step, data,
  forward and backward, a sleep or a throttled CPU alike); its wait is from then to the all-reduce ending, which
  is when the last rank's gradients arrived;
- any other collective (all_reduce, barrier, FSDP's all-gathers, ...): a thread samples the training thread's
  frames every SAMPLE_S and counts the samples that sit in torch.distributed's collectives or their waits.
A window's compute per step is DDP's own work (else the step less the wait), its wait DDP's plus the sampled share.
"""

import os
import sys
import threading
import time
import weakref

TYPE_CHECKING = False  # typing's, without importing typing into a worker (loaders.py's)
if TYPE_CHECKING:
    from typing import Any
if "torch_private" not in globals():  # imported by the launcher; a worker's bootstrap gives its own copy
    from launcher.runtime import torch_private
if "frame_values" not in globals():
    from launcher.worker.loaders import frame_values

SAMPLE_S = 0.01  # the sampler's period: ~20 us a look, 0.2% of a core
DDP_RESEARCH_S = 60.0
# torch.distributed's functions that block until the other ranks take part (or a collective's wait)
COLLECTIVES = frozenset({"all_reduce", "barrier", "monitored_barrier", "broadcast", "all_gather", "all_gather_object",
                         "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
                         "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "broadcast_object_list",
                         "all_reduce_coalesced", "batch_isend_irecv"})
DISTRIBUTED = f"{os.sep}torch{os.sep}distributed{os.sep}"


class Waits:
    """Per window: take() -> (wait seconds per step, its source) or None before the first step or with no steps."""

    def __init__(self) -> None:
        self.ddp: "Any" = None  # weakref to the training loop's DistributedDataParallel model
        self.ddp_searched_at = float("-inf")
        self.ddp_iteration = -1
        self.ddp_comm_end = 0  # the last iteration's all-reduce end (ns, the reducer's wall clock)
        self.ddp_work_s = self.ddp_wait_s = 0.0  # the window's own work and waits, over ddp_steps iterations
        self.ddp_steps = 0
        self.thread_id: "Any" = None  # the training thread's
        self.sampler: "Any" = None
        self.halt = threading.Event()
        self.samples = self.waiting = 0

    def step(self, frame_depth: int = 2) -> None:
        """At each optimizer step, on the training thread."""
        if self.thread_id is None:
            self.thread_id = threading.get_ident()
            self.sampler = threading.Thread(target=self.sample, name="launcher-waits", daemon=True)
            self.sampler.start()
        model: "Any" = self.ddp() if self.ddp is not None else None
        if model is None:
            now = time.monotonic()
            if now - self.ddp_searched_at < DDP_RESEARCH_S:
                return
            self.ddp_searched_at = now
            model = find_ddp(sys._getframe(frame_depth))
            if model is None:
                return
            torch_private.ddp_sample_runtime_stats_every_step(model)
            self.ddp = weakref.ref(model)
        try:
            stats = torch_private.ddp_runtime_stats(model.logger)
        except Exception:  # noqa: BLE001  (a figure must never fail a training step)
            self.ddp = None
            return
        iteration = stats.get("iteration", -1)
        if iteration == self.ddp_iteration or iteration < 0:
            return
        ready, done = stats.get("backward_compute_time_end", 0), stats.get("backward_comm_time_end", 0)
        if iteration == self.ddp_iteration + 1 and 0 < self.ddp_comm_end <= ready <= done:  # one iteration on
            self.ddp_work_s += (ready - self.ddp_comm_end) / 1e9
            self.ddp_wait_s += (done - ready) / 1e9
            self.ddp_steps += 1
        self.ddp_iteration, self.ddp_comm_end = iteration, done

    def sample(self) -> None:
        """The sampler thread: where the training thread is, every SAMPLE_S, until close()."""
        while not self.halt.wait(SAMPLE_S):
            frame = sys._current_frames().get(self.thread_id)
            self.samples += 1
            depth = 0
            while frame is not None and depth < 40:
                code = frame.f_code
                if DISTRIBUTED in code.co_filename and (code.co_name in COLLECTIVES or "wait" in code.co_name):
                    self.waiting += 1
                    break
                frame, depth = frame.f_back, depth + 1

    def close(self) -> None:
        """The script returned: the sampler ends before the interpreter does (a daemon thread still running as the
        process exits took it down with SIGABRT, 1 exit in 20)."""
        self.halt.set()
        if self.sampler is not None:
            self.sampler.join(1.0)

    def take(self, step_time_s: "float | None") -> "dict":
        """The window's figures for its step record, and a fresh window."""
        out: "dict" = {}
        share = self.waiting / self.samples if self.samples else None
        self.samples = self.waiting = 0
        work = self.ddp_work_s / self.ddp_steps if self.ddp_steps else None
        ddp_wait = self.ddp_wait_s / self.ddp_steps if self.ddp_steps else 0.0
        self.ddp_work_s, self.ddp_wait_s, self.ddp_steps = 0.0, 0.0, 0
        if step_time_s is None or (share is None and work is None):
            return out
        wait = min(step_time_s, ddp_wait + (share or 0.0) * step_time_s)
        out["wait_s"] = wait
        out["compute_s"] = min(work, step_time_s) if work is not None else step_time_s - wait
        return out


def find_ddp(frame: "Any") -> "Any":
    """A DistributedDataParallel model in the calling frames (their locals, and their `self`'s attributes)."""
    ddp_type = getattr(sys.modules.get("torch.nn.parallel.distributed"), "DistributedDataParallel", None)
    if ddp_type is None:
        return None
    while frame is not None:
        for value in frame_values(frame):  # loaders.py's: a function frame's snapshot emptied again at once
            if isinstance(value, ddp_type):
                return value
        frame = frame.f_back
    return None
