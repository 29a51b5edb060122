"""Where a run's time went, for the run page: each step's phases, each rank's compute and wait, the run's badput.

- Phases (the built-in trainer's metrics.jsonl rows, means over the ranks per log step): data, forward, backward,
  optimizer, and DDP's gradient all-reduce. The all-reduce runs during backward (DDP overlaps them), so it is
  shown as the part of backward the step spent in it, and backward as the rest: the stack is the step.
- Ranks (a script's: launcher/worker/waits.py): what each rank computes of a step and how long it waits for
  the others in collectives; the rank the others wait for computes longest. summary.json's job means once the
  run ended, else the mean of its newest rows.
- Badput (summary.json): the run's wall time, as kept steps and each cause of the rest, start-up, restart and
  membership time by phase (launcher.runtime.goodput).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

PHASE_FIELDS = (("data", "time_data_s"), ("forward", "time_forward_s"), ("backward", "time_backward_s"),
                ("optimizer", "time_optimizer_s"), ("comm", "time_comm_s"))
RECENT_ROWS = 10  # a running script's compute and wait per rank: its newest rows' mean


def time_breakdown(metrics: List[Dict[str, Any]], summary: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    return {"phases": phases(metrics), "ranks": rank_times(metrics, summary), "badput": badput(summary)}


def phases(metrics: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """{steps, data, forward, backward, comm, optimizer, step} in seconds per step, one value per log row; None
    without the trainer's phase times. step is the ranks' mean step time, as the phases are their means."""
    rows = [r for r in metrics if isinstance(r.get("time_forward_s"), (int, float)) and isinstance(r.get("step"), int)]
    if not rows:
        return None
    out: Dict[str, Any] = {"steps": [r["step"] for r in rows]}
    for name, field in PHASE_FIELDS:
        out[name] = [_number(r.get(field)) for r in rows]
    # the all-reduce within backward: at most all of it (its span can end after backward's last gradient)
    out["comm"] = [min(c, b) if c is not None and b is not None else None for c, b in zip(out["comm"], out["backward"])]
    out["backward"] = [b - c if c is not None and b is not None else b for b, c in zip(out["backward"], out["comm"])]
    out["step"] = [_mean(r.get("step_time_s_per_rank")) or _number(r.get("step_time_s")) for r in rows]
    return out


def rank_times(metrics: List[Dict[str, Any]], summary: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """{compute, wait (seconds per step, each rank's), straggler (words or None), what}; None without them."""
    source = summary or {}
    compute, wait = source.get("compute_s_per_rank"), source.get("wait_s_per_rank")
    what = "mean over the run"
    if not (_numbers(compute) and _numbers(wait)):
        rows = [r for r in metrics if _numbers(r.get("compute_s_per_rank")) and _numbers(r.get("wait_s_per_rank"))]
        rows = rows[-RECENT_ROWS:]
        if not rows:
            return None
        ranks = min(len(r["compute_s_per_rank"]) for r in rows)
        compute = [sum(r["compute_s_per_rank"][k] for r in rows) / len(rows) for k in range(ranks)]
        wait = [sum(r["wait_s_per_rank"][k] for r in rows) / len(rows) for k in range(ranks)]
        what, source = f"mean of the newest {len(rows)} records", rows[-1]
    straggler = source.get("straggler") if isinstance(source.get("straggler"), str) else None
    rank = source.get("straggler_rank") if isinstance(source.get("straggler_rank"), int) else None
    return {"compute": compute, "wait": wait, "straggler": straggler, "straggler_rank": rank, "what": what}


def badput(summary: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """{wall_s, goodput, parts: [{cause, phase, s}]}: kept steps first (where there were any), then each cause that
    cost anything, by phase where the run split it; None before the run ended."""
    causes = (summary or {}).get("badput_s")
    if not isinstance(causes, dict):
        return None
    split = (summary or {}).get("badput_phases_s") or {}
    kept = float((summary or {}).get("goodput_s") or 0.0)
    parts = [{"cause": "kept steps", "phase": "", "s": kept}] if kept > 0 else []
    for cause, seconds in causes.items():
        if not isinstance(seconds, (int, float)) or seconds <= 0:
            continue
        phases_of = split.get(cause)
        named = {p: s for p, s in phases_of.items() if isinstance(s, (int, float)) and s > 0} \
            if isinstance(phases_of, dict) else {}
        if not named:
            parts.append({"cause": cause, "phase": "", "s": float(seconds)})
        for phase, s in named.items():
            parts.append({"cause": cause, "phase": phase, "s": float(s)})
    wall = (summary or {}).get("goodput_wall_s") or (summary or {}).get("wall_s")
    return {"wall_s": wall, "goodput": (summary or {}).get("goodput"), "parts": parts}


def _number(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mean(values: Any) -> Optional[float]:
    return sum(values) / len(values) if _numbers(values) else None


def _numbers(values: Any) -> bool:
    return isinstance(values, list) and bool(values) and all(_number(v) is not None for v in values)
