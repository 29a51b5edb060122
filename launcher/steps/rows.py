"""A script's step records as the job's view (pure): one metrics.jsonl row per record of rank 0, with every rank's
latest record beside it, and the figures summary.json gets.

Rows follow the built-in trainer's metrics.jsonl where a field means the same (step, loss, samples_per_s,
step_time_s, rss_peak_mb, cuda_peak_mb, the *_per_rank lists, step_time_spread, slowest_rank, straggler_rank);
`step` counts the launch's optimizer steps across restarts (W&B needs it to grow), `attempt_step` the attempt's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from launcher.trainers.metrics.stragglers import stragglers

# Fields of ours in a row: a launcher.log key with one of these names is kept as logged/<key>.
OWN = ("step", "attempt", "attempt_step", "time", "steps_per_s", "step_time_s", "samples_per_s", "rss_peak_mb",
       "cuda_peak_mb", "step_time_s_per_rank", "steps_per_rank", "rss_mb_per_rank", "cuda_peak_mb_per_rank",
       "step_time_spread", "slowest_rank", "slowest_rank_lag", "straggler_rank")
KEEP = 8  # records kept per rank
SLACK_S = 0.5  # a rank's record this much older than rank 0's is the window before
WAIT_S = 2.0  # a row waits at most this long for a rank that writes nothing


class JobRows:
    """Records in, rows out: add() each record as it arrives (ranks in any order), then take() the rows ready.

    Ranks write their records about a second apart each, at nearly the same moments (their steps are in step): a
    row of rank 0's record waits until every rank has written one at least as new (or a while, or the end), and
    takes from each rank the record nearest in time.
    """

    def __init__(self, straggler_fraction: float, world_size: int) -> None:
        self.fraction, self.world_size = straggler_fraction, world_size
        self.history: Dict[int, List[Dict[str, Any]]] = {}  # this attempt's latest records per rank
        self.pending: List[Dict[str, Any]] = []  # rank 0's records without a row yet
        self.ended: List[Dict[str, Any]] = []  # rows of an attempt that ended, not taken yet
        self.attempt = 0
        self.before = 0  # rank 0's steps in earlier attempts
        self.step0 = 0  # rank 0's steps in this attempt so far

    def add(self, record: Dict[str, Any]) -> None:
        if record["attempt"] < self.attempt:
            return  # a late line of an attempt that ended
        if record["attempt"] > self.attempt:
            self.ended += self.take(final=True)
            self.attempt, self.before, self.step0, self.history = record["attempt"], self.before + self.step0, 0, {}
        kept = self.history.setdefault(record["rank"], [])
        kept.append(record)
        del kept[:-KEEP]
        if record["rank"] == 0:
            self.step0 = record["step"]
            if record["steps"] or record.get("logged") or record.get("per_rank"):
                self.pending.append(record)

    def take(self, final: bool = False) -> List[Dict[str, Any]]:
        """Rows of the pending rank-0 records that are ready (all of them when final)."""
        rows, waiting, self.ended = self.ended, [], []
        newest = max((r["t"] for kept in self.history.values() for r in kept), default=0.0)
        for first in self.pending:
            caught_up = all(self.history.get(rank, [{"t": -1.0}])[-1]["t"] >= first["t"] - SLACK_S
                            for rank in range(self.world_size))
            if final or caught_up or newest - first["t"] > WAIT_S:
                rows.append(self.row(first))
            else:
                waiting.append(first)
        self.pending = waiting
        return rows

    def row(self, first: Dict[str, Any]) -> Dict[str, Any]:
        ranks = max(self.world_size, max(self.history) + 1)
        mine = [nearest(self.history.get(rank, []), first["t"]) for rank in range(ranks)]
        row: Dict[str, Any] = {"step": self.before + first["step"], "attempt": first["attempt"],
                               "attempt_step": first["step"], "time": first["t"]}
        if "step_time_s" in first and first["window_s"] > 0:
            row["steps_per_s"] = first["steps"] / first["window_s"]
            row["step_time_s"] = first["step_time_s"]
        samples = [r.get("samples") if r and "step_time_s" in r and r["window_s"] > 0 else None for r in mine]
        if samples and None not in samples:
            row["samples_per_s"] = sum(s / r["window_s"] for s, r in zip(samples, mine) if r)  # type: ignore[operator]
        per_rank_time = [r.get("step_time_s") if r else None for r in mine]
        row["step_time_s_per_rank"] = per_rank_time
        row["steps_per_rank"] = [r["step"] if r else None for r in mine]
        peaks(row, mine)
        if len(per_rank_time) > 1 and None not in per_rank_time:
            row.update(stragglers(per_rank_time, self.fraction))  # type: ignore[arg-type]
        for key, value in (first.get("logged") or {}).items():
            row[f"logged/{key}" if key in OWN else key] = value
        for key in sorted({k for r in mine if r for k in (r.get("per_rank") or {})}):
            row[f"{key}_per_rank"] = [(r.get("per_rank") or {}).get(key) if r else None for r in mine]
        return row


def nearest(records: List[Dict[str, Any]], t: float) -> Optional[Dict[str, Any]]:
    """A rank's record written nearest to t (within a window), if any."""
    best = min(records, key=lambda r: abs(r["t"] - t), default=None)
    return best if best is not None and abs(best["t"] - t) <= WAIT_S else None


def peaks(row: Dict[str, Any], mine: List[Optional[Dict[str, Any]]]) -> None:
    """Memory: the job's peaks and each rank's figure."""
    rss = [r.get("rss_mb") if r else None for r in mine]
    if any(v is not None for v in rss):
        row["rss_mb_per_rank"] = rss
        row["rss_peak_mb"] = max(r.get("rss_peak_mb", r.get("rss_mb", 0.0)) for r in mine if r)
    cuda = [r.get("cuda_peak_mb") if r else None for r in mine]
    if any(v is not None for v in cuda):
        row["cuda_peak_mb_per_rank"] = cuda
        row["cuda_peak_mb"] = max(v for v in cuda if v is not None)


def summary_figures(records: List[Dict[str, Any]], started: float, straggler_fraction: float) -> Dict[str, Any]:
    """summary.json's figures for a script, from one launch's records (launcher.steps.records.read_launch)."""
    first = [r for r in records if r["rank"] == 0]
    if not first:
        return {"metrics_note": "no optimizer step was seen on rank 0: steps, throughput and goodput come from "
                                "torch.optim optimizer steps (launcher.log() values need one too)"}
    final_steps: Dict[int, int] = {}
    for r in first:
        final_steps[r["attempt"]] = max(final_steps.get(r["attempt"], 0), r["step"])
    timed = [r for r in first if "step_time_s" in r and r["window_s"] > 0]
    out: Dict[str, Any] = {"steps": sum(final_steps.values())}
    starts = [r["first_step_at"] for r in first if "first_step_at" in r]
    if starts:
        out["time_to_first_step_s"] = min(starts) - started
    if timed:
        out["steps_per_s"] = sum(r["steps"] for r in timed) / sum(r["window_s"] for r in timed)
        out["step_time_s_median"] = weighted_median([(r["step_time_s_median"], r["steps"]) for r in timed
                                                     if "step_time_s_median" in r])
    out.update(throughput(records))
    losses = [r["logged"]["loss"] for r in sorted(first, key=lambda r: r["t"]) if (r.get("logged") or {}).get("loss") is not None]
    out["final_loss"] = losses[-1] if losses else None
    for key in ("rss_peak_mb", "cuda_peak_mb"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key] = max(values)
    out.update(rank_spread(records, straggler_fraction))
    runs = [r["wandb"] for r in first if r.get("wandb")]
    if runs:
        out["wandb_run"] = {**runs[-1], "owner": "script"}
    return out


def throughput(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """samples/s (every rank's, summed) and the global batch, where every rank's DataLoader could be read."""
    ranks = sorted({r["rank"] for r in records})
    rates, batch = 0.0, 0.0
    for rank in ranks:
        timed = [r for r in records if r["rank"] == rank and "step_time_s" in r and r["window_s"] > 0]
        if not timed or any(r.get("samples") is None for r in timed):
            notes = [r["samples_note"] for r in records if r.get("samples_note")]
            return {"samples_per_s": None, "samples_note": f"rank {rank}: " + (notes[-1] if notes else "no timed steps")}
        rates += sum(r["samples"] for r in timed) / sum(r["window_s"] for r in timed)
        batch += sum(r["samples"] for r in timed) / max(1, sum(r["steps"] for r in timed))
    return {"samples_per_s": rates, "global_batch_size": round(batch)}


def rank_spread(records: List[Dict[str, Any]], fraction: float) -> Dict[str, Any]:
    """Each rank's mean step time over the job and how far apart they are."""
    times: List[float] = []
    for rank in range(max(r["rank"] for r in records) + 1):
        timed = [r for r in records if r["rank"] == rank and "step_time_s" in r]
        if not timed:
            return {}
        times.append(sum(r["step_time_s"] * r["steps"] for r in timed) / max(1, sum(r["steps"] for r in timed)))
    out: Dict[str, Any] = {"step_time_s_per_rank": times}
    if len(times) > 1:
        out.update(stragglers(times, fraction))
    return out


def weighted_median(pairs: List[tuple]) -> Optional[float]:
    """The value below which half of the weight lies."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    running = 0.0
    for value, weight in pairs:
        running += weight
        if running >= total / 2:
            return float(value)
    return None
