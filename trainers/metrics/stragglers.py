"""How far apart the ranks' step times are, and which rank lags (pure, torch-free: the launcher uses it for scripts)."""

from __future__ import annotations

from typing import Any, Dict, List


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
