"""How figures print, one rounding per kind of figure, so that the console line, `ls`, `sweep`, `status` and the
trainers' step lines agree: loss to 4 decimals, throughput whole, seconds to 0.1 s, shares as whole percents.

Here (in the worker-side package) because the trainers print the same figures as the launcher.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

# (unit, seconds) from the largest: an age prints in the largest unit it has one of
AGE_UNITS = (("d", 86400), ("h", 3600), ("m", 60))


def loss(value: Optional[float], missing: str = "") -> str:
    """2.180667817592621 -> '2.1807'."""
    return missing if value is None else f"{value:.4f}"


def rate(value: Optional[float], missing: str = "") -> str:
    """Samples (or tokens) per second: whole numbers; the decimals are noise between two runs."""
    return missing if value is None else f"{value:.0f}"


def seconds(value: Optional[float], missing: str = "") -> str:
    """13.84 -> '13.8s'."""
    return missing if value is None else f"{value:.1f}s"


def share(value: Optional[float], missing: str = "") -> str:
    """A fraction as a whole percent: 0.913 -> '91%'."""
    return missing if value is None else f"{value:.0%}"


def age(value_s: Optional[float]) -> str:
    """How long ago, in its largest unit: 5400 -> '2h' (rounded), 42 -> '42s'."""
    if value_s is None:
        return ""
    for unit, size in AGE_UNITS:
        if value_s >= size:
            return f"{value_s / size:.0f}{unit}"
    return f"{value_s:.0f}s"


def first_line(text: object) -> str:
    """A message's first line, stripped; '' for none. Torch's store errors carry a C++ stack trace after it,
    YAML's errors and a command's stderr more lines: those are for a log file, not a one-line error."""
    lines = str(text).strip().splitlines() if text is not None else []
    return lines[0].strip() if lines else ""


def clock(wall: Optional[float], dated: bool = False) -> str:
    """A wall time as local time: '00:46:28' today, '2026-11-27 00:46:28' another day (or dated: always, for a line
    kept in a record); '' for none."""
    if wall is None:
        return ""
    import time

    same_day = time.localtime(wall)[:3] == time.localtime()[:3]
    return time.strftime("%H:%M:%S" if same_day and not dated else "%Y-%m-%d %H:%M:%S", time.localtime(wall))


def preemption(summary: Dict[str, Any]) -> str:
    """A preempted run's state in words, from its summary.json: 'preempted at 00:46:28 (SIGUSR2); requeued: ...'."""
    when = f"preempted at {clock(summary.get('preempted_at'))} ({summary.get('stopped_by') or 'a signal'})"
    requeued = summary.get("requeued")
    if requeued is None:
        return f"{when}; its scheduler decides whether it runs again"
    if requeued:
        return f"{when}; requeued: it resumes from its newest checkpoint when its scheduler starts it again"
    return first_line(summary.get("error")) or f"{when}; not requeued"
