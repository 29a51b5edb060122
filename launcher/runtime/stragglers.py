"""How far apart the ranks' step times are, and which rank lags (pure: the built-in trainer's rows and a
script's, launcher.steps.rows)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

SUSTAIN = 2  # windows in a row a rank must lag by STRONG before it is named (about 2 s of a script's records)
PERSIST = 3  # windows in a row for a lesser lag: a loaded 2-core machine gave one rank of a uniform run 2.5-3.8x the
             # others' compute for 2 windows (twice in CI's runs); a slowed rank computed 3.5-18x theirs
LAGS = 3.0  # a rank computing this many times the median rank's lags, however much of the step is waiting anyway
STRONG = 5.0  # times the median rank's compute
HOLDS = 0.5  # or, at LAGS or more, the others wait for it this much of their step: a loaded machine slowed the other
             # ranks of CI's run to 3.6x a sleeping rank's lag, which held them half the step; noise held them 0.37
WAITS = 0.85  # or, at LAGS or more, the median rank waits this much of its step: a rank throttled to 5% of a CPU is
             # slow in the all-reduce too, so the others computed 2-12% of their step (noise: 13-18%) while it
             # computed 3.4-18x theirs, holding them a tenth of the step in compute and the rest in the collective


def median(values: List[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def compute_straggler(compute: List[float], step_s: float, fraction: float) -> Optional[int]:
    """The rank the others wait for, by what each computes of a step: the longest, where its extra over the median
    rank costs the others more than `fraction` of their step (a rank that computes 30% more of a step that is mostly
    waiting anyway holds nobody up)."""
    if len(compute) < 2 or step_s <= 0:
        return None
    slowest, middle = max(range(len(compute)), key=lambda r: compute[r]), median(compute)
    # (a rank throttled by a CPU limit is slow in the all-reduce too: much of its lag shows as waiting, not compute)
    lags = compute[slowest] - middle > fraction * step_s or (middle > 0 and compute[slowest] >= LAGS * middle)
    return slowest if lags else None


def compute_ratio(compute: List[float]) -> float:
    """The slowest rank's compute over the median rank's."""
    middle = median(compute) if len(compute) > 1 else 0.0
    return max(compute) / middle if middle > 0 else 0.0


def lags_strongly(compute: List[float], step_s: float) -> bool:
    """Whether the slowest rank's lag is past doubt in one window: STRONG times the median rank's compute, or LAGS
    times it while the others wait for it HOLDS of their step, or while the median rank waits WAITS of its step."""
    ratio = compute_ratio(compute)
    if ratio >= STRONG:
        return True
    if ratio < LAGS or step_s <= 0:
        return False
    middle = median(compute)
    return max(compute) - middle >= HOLDS * step_s or middle <= (1 - WAITS) * step_s


def verdict(rank: int, ratio: float, per_node: int) -> str:
    """The line that names a straggler, by what it computes (a script's ranks step together: compute, not step time)."""
    node = f" (node {rank // per_node})" if per_node > 0 else ""
    return f"rank {rank}{node} computes {ratio:.1f}x longer than the median rank"


class Lagging:
    """A rank named only once it lagged SUSTAIN windows in a row strongly (PERSIST by less), and cleared once it has
    not for SUSTAIN: a loaded machine's noise names nobody, and a rank that holds the others up is named in ~2 s."""

    def __init__(self) -> None:
        self.candidate: Optional[int] = None
        self.count = self.strong = self.calm = 0
        self.named: Optional[int] = None

    def see(self, lagging: Optional[int], strong: bool = True) -> Optional[int]:
        if lagging is not None and lagging == self.candidate:
            self.count += 1
            self.strong = self.strong + 1 if strong else 0
        else:
            self.candidate, self.count = lagging, 1 if lagging is not None else 0
            self.strong = 1 if lagging is not None and strong else 0
        if self.candidate is not None and (self.strong >= SUSTAIN or self.count >= PERSIST):
            self.named, self.calm = self.candidate, 0
        elif self.named is not None and lagging != self.named:
            self.calm += 1
            if self.calm >= SUSTAIN:
                self.named, self.calm = None, 0
        return self.named

    def see_window(self, compute: List[float], step_s: float, fraction: float) -> Optional[int]:
        """A window's compute per rank and its step time: the rank named after it."""
        return self.see(compute_straggler(compute, step_s, fraction), lags_strongly(compute, step_s))


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
