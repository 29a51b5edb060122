"""Scaling figures of a user's script's sweep, from its runs' summary.json files (launcher.steps.rows).

The launcher cannot set a script's batch, so a script's sweep is weak scaling by construction: each
worker keeps whatever batch the script uses. What the script did is checked, where its DataLoader could
be read, from each run's global_batch_size: the same per-worker batch at every size is weak scaling; the
same global batch (a script dividing it by WORLD_SIZE) is strong scaling, and says so; neither is flagged.

Efficiency comes from samples/s where every run has it (throughput_N / (N/N0 x throughput_N0), true of
weak and strong scaling alike), else from steps/s, which at an unchanged per-worker batch should stay
flat as workers are added (steps/s_N / steps/s_N0): that basis assumes weak scaling and the report says so.
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.commands.scale_report import peak_memory, plausibility, rounds_range, spread, throughputs

SCRIPT_COLUMNS = ("world_size", "nodes", "gpus_per_node", "batch_per_worker", "global_batch", "steps_per_s",
                  "steps_spread", "samples_per_s", "spread", "step_time_s_median", "speedup", "scaling_efficiency",
                  "peak_memory_mb")
# Per-worker batches within this fraction of each other are the same batch: a DataLoader's short last
# batch of an epoch pulls the measured mean a little below the batch size, differently at each size.
SAME_BATCH = 0.05
BASIS_WORDS = {"samples_per_s": "samples/s", "steps_per_s": "steps/s"}


def efficiency_basis(rounds: Sequence[Sequence[Dict[str, Any]]]) -> str:
    """samples_per_s where every run so far measured it, else steps_per_s (always measured)."""
    known = all(s.get("samples_per_s") for runs in rounds for s in runs)
    return "samples_per_s" if known else "steps_per_s"


def ideal_ratio(basis: str, workers: int, base_workers: int) -> float:
    """How much the basis figure should grow from the base size: samples/s with the workers; steps/s not at all."""
    return workers / base_workers if basis == "samples_per_s" else 1.0


def script_rows(points: Sequence[Any], rounds: Sequence[Sequence[Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """One row per size (smallest first), efficiency and speedup against the smallest size."""
    basis = efficiency_basis(rounds)
    pairs = sorted(zip(points, rounds), key=lambda pr: pr[0].world_size)
    base_point, base_runs = pairs[0]
    base_all = throughputs(base_runs, basis)
    base_value = statistics.median(base_all)
    base_batch = _batch_per_worker(_middle(base_runs, basis), base_point.world_size)
    rows = []
    for point, runs in pairs:
        every = throughputs(runs, basis)
        ratio = ideal_ratio(basis, point.world_size, base_point.world_size)
        efficiency = _ratio(statistics.median(every), ratio * base_value)
        low, high = _ratio(min(every), ratio * max(base_all)), _ratio(max(every), ratio * min(base_all))
        summary = _middle(runs, basis)
        batch = _batch_per_worker(summary, point.world_size)
        steps = throughputs(runs, "steps_per_s")
        samples = throughputs(runs) if all(s.get("samples_per_s") for s in runs) else None
        memory, kind = peak_memory(summary)
        rows.append({
            "world_size": point.world_size, "nodes": point.nodes, "gpus_per_node": point.gpus,
            "batch_per_worker": batch, "global_batch": summary.get("global_batch_size"),
            "steps_per_s": statistics.median(steps), "steps_spread": spread(steps), "steps_per_s_rounds": steps,
            "samples_per_s": statistics.median(samples) if samples else None,
            "spread": spread(samples) if samples else None,
            "samples_per_s_rounds": [s.get("samples_per_s") for s in runs],
            "rounds": len(runs), "step_time_s_median": summary.get("step_time_s_median"),
            "speedup": efficiency * point.world_size / base_point.world_size,
            "scaling_efficiency": efficiency, "efficiency_from": basis, "efficiency_range": [low, high],
            "peak_memory_mb": memory, "peak_memory_kind": kind,
            "samples_note": summary.get("samples_note"), "run_id": summary.get("run_id"),
            "flag": plausibility(efficiency, (low, high), round(batch or 0), round(base_batch or 0),
                                 rounds_range(base_all, BASIS_WORDS[basis], base_point.world_size)),
        })
    return rows


def batch_check(rows: Sequence[Dict[str, Any]]) -> Tuple[str, Optional[str]]:
    """(scaling kind, a note or None) from the measured batches: weak, strong (the global batch kept) or mixed."""
    unknown = [r for r in rows if r["batch_per_worker"] is None]
    if unknown:
        sizes = ", ".join(str(r["world_size"]) for r in unknown)
        why = next((r["samples_note"] for r in unknown if r.get("samples_note")), "no DataLoader batch was seen")
        return "weak", (f"the per-worker batch could not be read at {sizes} worker(s) ({why}): efficiency is from "
                        "steps/s and assumes the script keeps its per-worker batch at every size (weak scaling)")
    per_worker = [r["batch_per_worker"] for r in rows]
    if _all_same(per_worker):
        return "weak", None
    path = " -> ".join(f"{b:g}" for b in per_worker)
    if _all_same([r["global_batch"] for r in rows]):
        return "strong", (f"strong scaling, not weak: the script keeps its global batch ({rows[0]['global_batch']} "
                          f"samples per step at every size; per worker {path}), so each worker does less work as "
                          "workers are added; efficiency is samples/s at that fixed global batch")
    return "mixed", (f"the per-worker batch changed ({path}) and so did the global batch: the sizes did different "
                     "work per step; compare their samples/s with that in mind")


def _batch_per_worker(summary: Dict[str, Any], world_size: int) -> Optional[float]:
    total = summary.get("global_batch_size")
    world = summary.get("world_size") or world_size
    return None if total is None else round(total / world, 1)


def _all_same(values: Sequence[float]) -> bool:
    return max(values) - min(values) <= SAME_BATCH * max(values)


def _middle(runs: Sequence[Dict[str, Any]], basis: str) -> Dict[str, Any]:
    """The round whose basis figure is the median one: its step time, batch and memory go in the row."""
    ordered = sorted(runs, key=lambda s: float(s.get(basis) or 0.0))
    return ordered[len(ordered) // 2]


def _ratio(value: float, ideal: float) -> float:
    return value / ideal if ideal > 0 else 0.0


def footnote(basis: str) -> str:
    """The line under a script's table: how its efficiency was computed."""
    if basis == "samples_per_s":
        formula = "samples/s_N / (N / N0 x samples/s_N0)"
    else:
        formula = "steps/s_N / steps/s_N0 (samples/s could not be read at every size)"
    return (f"Efficiency = {formula} against the smallest size N0, from the median of each size's rounds; "
            "batch/worker and global batch are measured from the script's DataLoader (global_batch_size in each "
            "run's summary.json); spread = (largest - smallest) / median of a size's rounds, the figure --spread "
            "bounds; peak memory is CUDA max allocated on GPU, process RSS on CPU.")
