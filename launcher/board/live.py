"""A running run's header: its step now, its throughput and when it will end (ETA), from the step rate.

The rate is the job's steps per second since its first steps, never since its start: start-up (processes, the
process group, the model, a checkpoint) and the first steps (a compile, cold caches) would make a fresh run's
ETA minutes for a job that ends seconds later. Rank 0's attempt record (launcher.runtime.goodput, rewritten every
step) says its step and when that step ended; the board keeps what each poll saw, so the rate is measured over the
steps past WARM_STEPS within the last RATE_WINDOW_S (a run that slows down shows it); a script's rows add the times
of their steps. Until it has seen a step past those, no ETA is shown, unless the attempt is LATE_STEPS along (a
board opened late): its rate is then since the attempt's first step. Standard library only.
"""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Tuple

from launcher.board.events import attempt_records
from launcher.runtime.schema import Status

WARM_STEPS = 3
LATE_STEPS = 30  # a board opened this far into an attempt may count from its first step: the first are a small share
RATE_WINDOW_S = 120.0
SEEN_PER_ATTEMPT = 512
MAX_ATTEMPTS_KEPT = 256  # the board's memory of runs it has shown: the oldest attempt is forgotten first

_lock = threading.Lock()
_seen: Dict[Tuple[str, str, int], Deque[Tuple[float, int]]] = {}


def live_header(run_dir: Path, status: Any, steps: Optional[int], metrics: List[Dict[str, Any]]) -> Dict[str, Any]:
    """{step, step_rate (steps/s), rate_steps (the steps it is measured over), eta_s, samples_per_s, steps_per_s}
    while the run runs; {} once it ended (its summary says how fast it was)."""
    attempts = attempt_records(run_dir) if status == Status.RUNNING else []
    if not attempts:
        return {}
    launch, attempt, record = attempts[-1]
    first_at, until = record.get("first_step_at"), record.get("active_until")
    start, step = record.get("start_step", 0), record.get("step")
    if not (isinstance(first_at, float) and isinstance(until, float) and isinstance(start, int) and isinstance(step, int)):
        return {}  # the attempt has not stepped yet (the record's fields are the schema's: floats and ints)
    seen = observed((str(run_dir), launch, attempt), (until, step), script_steps(metrics, attempt))
    rate, over = step_rate(seen, (first_at, start))
    newest = last_row(metrics)
    header: Dict[str, Any] = {"step": step, "step_rate": rate, "rate_steps": over,
                              "samples_per_s": newest.get("samples_per_s"), "steps_per_s": newest.get("steps_per_s")}
    if rate and steps and steps > step:
        header["eta_s"] = (steps - step) / rate
    return header


def observed(key: Tuple[str, str, int], now: Tuple[float, int], rows: List[Tuple[float, int]]) -> List[Tuple[float, int]]:
    """(time, step) of the attempt: what earlier polls saw, the script's rows, and now."""
    with _lock:
        seen = _seen.get(key)
        if seen is None:
            while len(_seen) >= MAX_ATTEMPTS_KEPT:
                del _seen[next(iter(_seen))]
            seen = _seen[key] = deque(maxlen=SEEN_PER_ATTEMPT)
        if not seen or seen[-1] != now:
            seen.append(now)
        return sorted(set(seen) | set(rows))


def script_steps(metrics: List[Dict[str, Any]], attempt: int) -> List[Tuple[float, int]]:
    """A script's rows of this attempt as (time, the attempt's step): the steps its record counts."""
    return [(float(r["time"]), int(r["attempt_step"])) for r in metrics
            if r.get("attempt") == attempt and isinstance(r.get("time"), (int, float))
            and isinstance(r.get("attempt_step"), int)]


def step_rate(seen: List[Tuple[float, int]], first: Tuple[float, int]) -> Tuple[Optional[float], int]:
    """(steps per second, over how many steps) from the oldest observation past the warm-up and within the window
    of the newest (else, LATE_STEPS into the attempt, from its first step) to the newest; (None, 0) without one."""
    newest = max(seen, key=lambda o: (o[1], o[0]))
    start = first[1]
    bases = [o for o in seen if o[1] >= start + WARM_STEPS and newest[0] - o[0] <= RATE_WINDOW_S and o[1] < newest[1]]
    base = min(bases) if bases else first if newest[1] - start >= LATE_STEPS else None
    if base is None:
        return None, 0
    steps, seconds = newest[1] - base[1], newest[0] - base[0]
    return (steps / seconds, steps) if steps > 0 and seconds > 0 else (None, 0)


def last_row(metrics: List[Dict[str, Any]]) -> Dict[str, Any]:
    return metrics[-1] if metrics else {}
