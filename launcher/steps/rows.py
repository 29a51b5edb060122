"""A script's step records as the job's view (pure): one metrics.jsonl row per record of rank 0, with every rank's
latest record beside it, and the figures summary.json gets.

A row's fields are launcher.runtime.schema.ROW's: the ones made here (step, throughput, step times, stragglers), and
each step-record field's job value and per-rank list as the schema declares them (rows=, per_rank=; memory, and any
field a developer adds there). Rows follow the built-in trainer's metrics.jsonl where a field means the same; `step`
counts the launch's optimizer steps across restarts (W&B needs it to grow), `attempt_step` the attempt's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from launcher.runtime.schema import ROW, SHARED, STEP
from launcher.runtime.stragglers import Lagging, compute_straggler, median, stragglers, verdict

KEEP = 8  # records kept per rank
SLACK_S = 0.5  # a rank's record this much older than rank 0's is the window before
WAIT_S = 2.0  # a row waits at most this long for a rank that writes nothing


class JobRows:
    """Records in, rows out: add() each record as it arrives (ranks in any order), then take() the rows ready.

    Ranks write their records about a second apart each, at nearly the same moments (their steps are in step): a
    row of rank 0's record waits until every rank has written one at least as new (or a while, or the end), and
    takes from each rank the record nearest in time.
    """

    def __init__(self, straggler_fraction: float, world_size: int, per_node: int = 0) -> None:
        self.fraction, self.world_size, self.per_node = straggler_fraction, world_size, per_node
        self.lagging = Lagging()  # the rank the others wait for, once it lagged a few windows in a row
        self.history: Dict[int, List[Dict[str, Any]]] = {}  # this attempt's latest records per rank
        self.pending: List[Dict[str, Any]] = []  # rank 0's records without a row yet
        self.ended: List[Dict[str, Any]] = []  # rows of an attempt that ended, not taken yet
        self.attempt = 0
        self.before = 0  # rank 0's steps in earlier attempts
        self.offsets: Dict[int, int] = {0: 0}  # each attempt's `before`
        self.step0 = 0  # rank 0's steps in this attempt so far

    def add(self, record: Dict[str, Any]) -> None:
        if record["attempt"] < self.attempt:
            return  # a late line of an attempt that ended
        if record["attempt"] > self.attempt:
            self.ended += self.take(final=True)
            self.attempt, self.before, self.step0, self.history = record["attempt"], self.before + self.step0, 0, {}
            self.offsets[self.attempt] = self.before
        kept = self.history.setdefault(record["rank"], [])
        kept.append(record)
        del kept[:-KEEP]
        if record["rank"] == 0:
            self.step0 = record["step"]
            if record["steps"] or record.get("logged") or record.get("per_rank"):
                self.pending.append(record)

    def series_row(self, entry: Dict[str, Any]) -> Dict[str, Any]:
        """One launcher.log call (schema.SERIES) as the job's W&B gets it: at its step (the launch's steps across
        restarts, as the rows count them; a step=N of the caller's own as given), rank 0's values by their names,
        a per_rank call's as <name>/rank<k>."""
        step = entry["step"] if entry.get("own_step") else self.offsets.get(entry["attempt"], self.before) + entry["step"]
        suffix = f"/rank{entry['rank']}" if entry.get("per_rank") else ""
        return {"step": step, **{f"{k}{suffix}": v for k, v in entry["values"].items()}}

    def named_straggler(self, compute: List[float], step_s: float) -> Dict[str, Any]:
        """The row's straggler by what each rank computes (step times are all the slowest rank's); named once it
        lagged a few windows in a row (launcher.runtime.stragglers.Lagging)."""
        found = stragglers(compute, self.fraction)
        rank = self.lagging.see_window(compute, step_s, self.fraction)
        found["straggler_rank"] = rank
        middle = median(compute)
        if rank is not None and middle > 0:
            found["straggler"] = verdict(rank, compute[rank] / middle, self.per_node)
        return found

    @staticmethod
    def launcher_figures(row: Dict[str, Any]) -> Dict[str, Any]:
        """A row less the script's launcher.log values (the job's W&B run has each call at its own step: a row's,
        the window's last, at the row's step, would be a second point, at a later step)."""
        return {k: v for k, v in row.items() if k in ROW.fields and k not in SHARED}

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
            row["samples_per_s"] = sum(s / r["window_s"] for s, r in zip(samples, mine) if r)
        per_rank_time = [r.get("step_time_s") if r else None for r in mine]
        row["step_time_s_per_rank"] = per_rank_time
        row["steps_per_rank"] = [r["step"] if r else None for r in mine]
        row.update(measured(mine))
        compute = row.get("compute_s_per_rank")
        if isinstance(compute, list) and len(compute) > 1 and None not in compute and None not in per_rank_time:
            row.update(self.named_straggler(compute, median(per_rank_time)))  # type: ignore[arg-type]
        elif len(per_rank_time) > 1 and None not in per_rank_time:
            row.update(stragglers(per_rank_time, self.fraction))  # type: ignore[arg-type]
        ours = ROW.fields  # a launcher.log key that is one of ours is kept as logged/<key>
        for key, value in (first.get("logged") or {}).items():
            row[f"logged/{key}" if key in ours and key not in SHARED else key] = value
        for key in sorted({k for r in mine if r for k in (r.get("per_rank") or {})}):
            row[f"{key}_per_rank"] = [(r.get("per_rank") or {}).get(key) if r else None for r in mine]
        return row


def nearest(records: List[Dict[str, Any]], t: float) -> Optional[Dict[str, Any]]:
    """A rank's record written nearest to t (within a window), if any."""
    best = min(records, key=lambda r: abs(r["t"] - t), default=None)
    return best if best is not None and abs(best["t"] - t) <= WAIT_S else None


def measured(mine: List[Optional[Dict[str, Any]]]) -> Dict[str, Any]:
    """Each step-record field the schema puts in rows (memory, ...): the job's value and each rank's, where any
    rank has one."""
    out: Dict[str, Any] = {}
    for field in STEP.fields.values():
        if not (field.rows or field.per_rank):
            continue
        values = [r.get(field.name) if r else None for r in mine]
        chosen = [v for v in (values[:1] if field.rows == "rank0" else values) if v is not None]
        if field.rows and chosen:
            out[field.name] = combine(field.rows, chosen)
        if field.per_rank and any(v is not None for v in values):
            out[f"{field.name}_per_rank"] = values
    return out


def combine(how: str, values: List[Any]) -> Any:
    """A job's value of a field from its known values (in rank or time order) as the schema says: max, sum, the
    first (rank0: rank 0's) or the last (the newest)."""
    if how in ("max", "sum"):
        return max(values) if how == "max" else sum(values)
    return values[0] if how == "rank0" else values[-1]


def summary_figures(records: List[Dict[str, Any]], started: float, straggler_fraction: float,
                    per_node: int = 0) -> Dict[str, Any]:
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
    for field in STEP.fields.values():  # as the schema says (summary=): memory peaks, ...
        values = [r[field.name] for r in sorted(records, key=lambda r: r["t"]) if r.get(field.name) is not None]
        if field.summary and values:
            out[field.name] = combine(field.summary, values)
    out.update(rank_spread(records, straggler_fraction, per_node))
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


def rank_spread(records: List[Dict[str, Any]], fraction: float, per_node: int = 0) -> Dict[str, Any]:
    """Each rank's mean step time over the job, and what it computed and waited of it: the rank that computes
    longest is the one the others wait for (step times are all the slowest rank's)."""
    ranks = range(max(r["rank"] for r in records) + 1)
    out: Dict[str, Any] = {}
    for field in ("step_time_s", "compute_s", "wait_s"):
        means: List[float] = []
        for rank in ranks:
            timed = [r for r in records if r["rank"] == rank and field in r and "step_time_s" in r]
            if not timed:
                break
            means.append(sum(r[field] * r["steps"] for r in timed) / max(1, sum(r["steps"] for r in timed)))
        else:
            out[f"{field}_per_rank"] = means
    if "step_time_s_per_rank" not in out:
        return {}
    by = out.get("compute_s_per_rank") or out["step_time_s_per_rank"]
    if len(by) > 1:
        out.update(stragglers(by, fraction))
        if "compute_s_per_rank" in out:  # a script's: by what each rank computes of its step
            named = out["straggler_rank"] = compute_straggler(by, median(out["step_time_s_per_rank"]), fraction)
            if named is not None and median(by) > 0:
                out["straggler"] = verdict(named, by[named] / median(by), per_node)
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
