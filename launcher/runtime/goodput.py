"""Goodput: the share of wall time spent on steps whose progress was kept, and where the rest went.

Rank 0 of each attempt keeps one small record in <run_dir>/goodput/ (GoodputClock); the agent adds one
for each failed attempt it saw (record_failure); job_goodput sums one launch's records along a single
timeline, plus the earlier launches' totals (a resumed or requeued run) from their summary.json. The records'
fields are launcher.runtime.schema's GOODPUT, FAILURE and ROUND; each is checked as it is read back.
Torch-free: the launcher imports it to write summary.json, the built-in trainer to keep its clock.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from launcher.runtime import formatting, safefs
from launcher.runtime.diskspace import disk_full, full_while_writing
from launcher.runtime.schema import EVICTED, FAILURE, GOODPUT, GOODPUT_DIR, GOODPUT_RECORD_BYTES, ROUND, SUMMARY, Status

# Where wall time goes besides kept steps, in the order the summary lists them.
# membership: an elastic job re-forming after a node left or joined (its re-rendezvous and restart), not a failure's
CAUSES = ("startup", "checkpoint", "failure_detection", "restart", "membership", "recompute", "hang", "shutdown")
# What an attempt does before its first step, each phase ending at the mark of its name (GoodputClock.mark):
# up to the worker's code running (launcher, rendezvous, fork; re-rendezvous and re-fork on a restart), its
# process group, building model, data and optimizer, loading the newest checkpoint, then the first step's start.
PHASES = ("launch", "process_group", "build", "reload", "first_step")
DIR, RECORD_BYTES = GOODPUT_DIR, GOODPUT_RECORD_BYTES  # a record is rewritten in place, padded: one pwrite per step
RECORDS = {"attempt": GOODPUT, "failure": FAILURE, "round": ROUND, "evicted": EVICTED}  # <launch>-<kind>-<n>.json


def launch_key(started: float) -> str:
    """Names one launch's records: the launcher's start time (launcher.runtime.env.START_TIME), in ms."""
    return str(int(started * 1000))


class GoodputClock:
    """The loop's timestamps on rank 0: steps, time blocked by saves, and the last step a checkpoint kept.

    Every rank may call it; only rank 0 of a launch with a run directory records anything.
    """

    def __init__(self, run_dir: Optional[str], started: Optional[float], attempt: int, rank: int) -> None:
        self._fd: Optional[int] = None
        self._path: Optional[Path] = None
        self.started, self.attempt = started, attempt  # the launch's start (wall clock) and this attempt's number
        self.first_step_at: Optional[float] = None
        self.active_until: Optional[float] = None  # the end of the last step or save wait
        self.step = 0
        self.start_step = 0
        self.block_s = 0.0  # seconds the loop waited for checkpoint saves
        self.kept: Optional[Dict[str, float]] = None  # {step, at, block_s} of the newest published checkpoint
        self.marks: Dict[str, float] = {}  # {phase: when it ended} before the first step (PHASES)
        if rank == 0 and run_dir and started is not None:
            path = Path(run_dir) / DIR / f"{launch_key(started)}-attempt-{attempt}.json"
            self._fd = safefs.open_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, root=str(run_dir))
            self._path = path

    def mark(self, phase: str, at: Optional[float] = None) -> None:
        """Phase `phase` (one of PHASES) of this attempt's start ended at `at` (now)."""
        self.marks[phase] = time.time() if at is None else at

    def resumed_at(self, step: int) -> None:
        self.start_step = self.step = step

    def step_started(self) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()

    def step_ended(self, step: int) -> None:
        self.step, self.active_until = step, time.time()
        self._write()

    def blocked(self, started: float, ended: float) -> None:
        """The loop waited from started to ended (time.time()) for a checkpoint save."""
        self.block_s += ended - started
        self.active_until = max(self.active_until or ended, ended)

    def snapshot(self) -> Dict[str, float]:
        """What a checkpoint taken now keeps, once it is published (see keep)."""
        return {"step": self.step, "at": self.active_until or time.time(), "block_s": self.block_s}

    def keep(self, snapshot: Dict[str, float]) -> None:
        """The checkpoint taken at snapshot is published: the steps up to it are kept."""
        self.kept = snapshot
        self._write()

    def close(self) -> None:
        """The loop is over: the record is complete (a later write would be a bug, and is dropped)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def record(self) -> Dict[str, Any]:
        return {"first_step_at": self.first_step_at, "active_until": self.active_until, "start_step": self.start_step,
                "step": self.step, "block_s": self.block_s, "kept": self.kept, "marks": self.marks}

    def _write(self) -> None:
        if self._fd is None:
            return
        data = json.dumps(self.record()).encode()
        try:
            os.pwrite(self._fd, data.ljust(RECORD_BYTES) if len(data) < RECORD_BYTES else data, 0)
        except OSError as e:
            full = disk_full(e)
            if full is None:
                raise
            assert self._path is not None
            raise full_while_writing("the goodput record", self._path, full) from None


def record_failure(run_dir: str, started: float, attempt: int, hang: bool = False) -> None:
    """The agent saw attempt `attempt` fail now (the first node to see it writes; a record is never replaced)."""
    path = Path(run_dir) / DIR / f"{launch_key(started)}-failure-{attempt}.json"
    try:
        fd = safefs.open_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=run_dir)
    except OSError:  # a planted link (safefs.PlantedLinkError) is never written through either
        return  # another node's, or a full disk: goodput then counts this gap as restart time
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"detected_at": time.time(), "hang": hang}, f)
    except OSError:  # a full disk: an empty record reads as none (_attempts)
        pass


def first_step_of_launch(run_dir: Optional[str], started: Optional[float]) -> Optional[float]:
    """When this launch first stepped, over all its attempts (rank 0's records); None before any step."""
    if not run_dir or started is None:
        return None
    firsts = [r["first_step_at"] for r in _attempts(Path(run_dir), launch_key(started), "attempt").values()
              if r.get("first_step_at") is not None]
    return min(firsts) if firsts else None


def kept_steps(run_dir: Path, started: float) -> List[Any]:
    """The step of the newest checkpoint each attempt of the launch that started at `started` says was published:
    what changes when the built-in trainer publishes one (launcher.objectstore.runrecord uploads the record then)."""
    attempts = _attempts(run_dir, launch_key(started), "attempt")
    return [(record.get("kept") or {}).get("step") for _, record in sorted(attempts.items())]


def _attempts(run_dir: Path, key: str, kind: str) -> Dict[int, Dict[str, Any]]:
    """{n: record} of one launch's records of a kind, each checked (RECORDS): empty, malformed or linked ones are
    left out."""
    found = {}
    for path in (run_dir / DIR).glob(f"{key}-{kind}-*.json"):
        try:
            record = RECORDS[kind].read(json.loads(safefs.read_bytes(str(path), root=str(run_dir)) or b"null"))
        except (OSError, ValueError, RecursionError):
            continue
        suffix = path.stem.rsplit("-", 1)[1]
        if record and suffix.isdigit():
            found[int(suffix)] = record
    return found


def account(started: float, ended: float, attempts: Dict[int, Dict[str, Any]], failures: Dict[int, Dict[str, Any]],
            status: Status, phases: Optional[Dict[str, Dict[str, float]]] = None,
            changes: Sequence[float] = ()) -> Dict[str, float]:
    """Seconds of one launch by cause, plus "good": they add up to ended - started by construction.

    One cursor walks the timeline: before an attempt's first step is start-up (no step yet) or restart;
    its loop is kept steps, checkpoint waits and steps after its last published checkpoint (recompute:
    lost, done again); from its last step to the agent seeing it fail is failure detection (hang where the
    job hung), and an attempt that failed before any step lost its whole start (restart, or start-up
    before the job's first step); after the last attempt is shutdown (hang for a hung job).
    phases: {"startup": {...}, "restart": {...}} to add the start of each attempt that stepped to, by PHASES.
    changes: when an elastic job's membership changed (membership_changes): a restart that re-formed the job
    then is membership time, not restart time.
    """
    seconds = {cause: 0.0 for cause in CAUSES}
    seconds["good"] = 0.0
    cursor, stepped = started, False
    last = max(attempts) if attempts else -1
    for n in sorted(set(attempts) | set(failures)):
        record = attempts.get(n, {})
        first, until = record.get("first_step_at"), record.get("active_until")
        ran = first is not None and until is not None and first >= cursor
        if first is not None and until is not None and ran:  # repeated: it narrows first and until
            restart = "membership" if any(cursor <= t <= first for t in changes) else "restart"
            seconds[restart if stepped else "startup"] += first - cursor
            if phases is not None:
                _split(phases.setdefault(restart if stepped else "startup", {}), cursor, first, record.get("marks") or {})
            stepped = True
            loop = until - first
            block = float(record.get("block_s", 0.0))
            kept = record.get("kept")
            if n == last and status == Status.COMPLETED:
                good = loop - block
            elif kept is not None:
                good = max(0.0, kept["at"] - first - kept["block_s"])
            else:
                good = 0.0
            seconds["checkpoint"] += block
            seconds["good"] += good
            seconds["recompute"] += loop - block - good
            cursor = until
        failure = failures.get(n)
        if failure is not None and failure["detected_at"] >= cursor:
            hang = failure.get("hang") or (status == Status.HUNG and n == max(failures))  # the watchdog stopped it
            # an attempt that failed before its first step spent its time starting: that start was lost
            cause = "hang" if hang else ("failure_detection" if ran else ("restart" if stepped else "startup"))
            seconds[cause] += failure["detected_at"] - cursor
            cursor = failure["detected_at"]
    tail = max(0.0, ended - cursor)
    seconds["hang" if status == Status.HUNG else ("shutdown" if stepped else "startup")] += tail
    return seconds


def _split(into: Dict[str, float], begin: float, first: float, marks: Dict[str, Any]) -> None:
    """Add begin..first (an attempt's start) to `into` by phase: each runs to its mark (clamped in order);
    the last, first_step, to the first step. A phase whose mark is missing merges into the next."""
    at = begin
    for phase in PHASES:
        end = first if phase == PHASES[-1] else marks.get(phase)
        if end is None:
            continue
        end = min(max(float(end), at), first)
        into[phase] = into.get(phase, 0.0) + end - at
        at = end


def previous_totals(run_dir: Path, started: float) -> Optional[Dict[str, Any]]:
    """The goodput figures of the launches before this one in the same run directory (resume, requeue)."""
    path = run_dir / "summary.json"
    try:
        if path.stat().st_mtime >= started:
            return None  # this launch's own
        summary = SUMMARY.read(json.loads(safefs.read_bytes(str(path), root=str(run_dir))))
    except (OSError, ValueError, RecursionError):
        return None
    return summary if isinstance(summary.get("badput_s"), dict) else None


def job_goodput(run_dir: Optional[str], started: float, ended: float, status: Status) -> Dict[str, Any]:
    """goodput, goodput_s, badput_s by cause and goodput_wall_s, job-wide: this launch and the earlier ones."""
    if not run_dir:
        return {}
    path = Path(run_dir)
    key = launch_key(started)
    phases: Dict[str, Dict[str, float]] = {"startup": {}, "restart": {}, "membership": {}}
    changes = membership_changes(path, started)
    seconds = account(started, ended, _attempts(path, key, "attempt"), _attempts(path, key, "failure"), status, phases,
                      [float(c["at"]) for c in changes if c.get("at") is not None])
    wall, launches = ended - started, 1
    previous = previous_totals(path, started)
    if previous is not None:
        wall += float(previous.get("goodput_wall_s") or 0.0)
        launches += int(previous.get("goodput_launches") or 1)
        seconds["good"] += float(previous.get("goodput_s") or 0.0)
        for cause in CAUSES:
            seconds[cause] += float(previous["badput_s"].get(cause) or 0.0)
        for cause, split in (previous.get("badput_phases_s") or {}).items():
            for phase, s in (split if cause in phases and isinstance(split, dict) else {}).items():
                phases[cause][phase] = phases[cause].get(phase, 0.0) + float(s or 0.0)
    for cause, split in phases.items():  # what no phase holds: attempts that died before their first step
        split["other"] = max(0.0, seconds[cause] - sum(v for k, v in split.items() if k != "other"))
    return {
        "goodput": seconds["good"] / wall if wall > 0 else None,
        "goodput_s": round(seconds["good"], 4),
        "badput_s": {cause: round(seconds[cause], 4) for cause in CAUSES},
        "badput_phases_s": {cause: {k: round(v, 4) for k, v in split.items()} for cause, split in phases.items()},
        "goodput_wall_s": round(wall, 4),
        "goodput_launches": launches,
        **({"membership_changes": changes} if changes else {}),
    }


def membership_changes(run_dir: Path, started: float) -> List[Dict[str, Any]]:
    """An elastic job's membership changes in this launch, oldest first: [{at, round, left, joined, nodes,
    world_size}], from the node agents' records of each rendezvous round (launcher.agent.membership). Where as many
    nodes joined as left and the world size stayed (hot spares took the lost nodes' places), `replaced` pairs
    them: [{left, by}]. Where the node left because it was slow (launcher.agent.eviction), `evicted` says which
    rank's node and why."""
    rounds = list(_attempts(run_dir, launch_key(started), "round").values())
    evictions = _attempts(run_dir, launch_key(started), "evicted")
    rounds.sort(key=lambda r: (int(r.get("round", 0)), float(r.get("at", 0))))
    changes = []
    for before, after in zip(rounds, rounds[1:]):
        left = sorted(set(before["nodes"]) - set(after["nodes"]))
        joined = sorted(set(after["nodes"]) - set(before["nodes"]))
        if left or joined:
            change = {"at": after.get("at"), "round": after.get("round"), "left": left, "joined": joined,
                      "nodes": len(after["nodes"]), "world_size": after.get("world_size")}
            if left and len(left) == len(joined) and after.get("world_size") == before.get("world_size"):
                change["replaced"] = [{"left": gone, "by": new} for gone, new in zip(left, joined)]  # a spare's
            evicted = evictions.get(int(before.get("round", -1)))
            if evicted and left:
                change["evicted"] = {"rank": evicted["rank"], "node": left[0] if len(left) == 1 else None,
                                     "why": evicted.get("why"), "lagged_s": evicted.get("lagged_s")}
            changes.append(change)
    return changes


def said_change(change: Dict[str, Any]) -> str:
    """One membership change as the board and W&B say it: 'membership change (left: H:P): 1 nodes, world size 1', or
    '(H:P replaced by H:Q)' where a spare took a lost node's place."""
    who = "; ".join([f"left: {', '.join(change['left'])}"] * bool(change["left"]) +
                    [f"joined: {', '.join(change['joined'])}"] * bool(change["joined"]))
    if change.get("replaced"):
        who = "; ".join(f"{r['left']} replaced by {r['by']}" for r in change["replaced"])
    if change.get("evicted"):
        who += f"; evicted as slow: {change['evicted'].get('why')}"
    return f"membership change ({who}): {change.get('nodes')} nodes, world size {change.get('world_size')}"


def format_goodput(figures: Dict[str, Any]) -> str:
    """'goodput 91% (lost: startup 4.1s, restart 2.0s)': the causes that cost anything, largest first. A resumed
    run's figures span all its launches, which the line says ('goodput 60% of 35.7s over 2 launches (lost: ...)')."""
    if figures.get("goodput") is None:
        return ""
    lost: List[str] = [f"{cause} {formatting.seconds(s)}"
                       for cause, s in sorted(figures["badput_s"].items(), key=lambda kv: -kv[1]) if s >= 0.05]
    launches = int(figures.get("goodput_launches") or 1)
    span = f" of {formatting.seconds(figures.get('goodput_wall_s'))} over {launches} launches" if launches > 1 else ""
    return f"goodput {formatting.share(figures['goodput'])}{span}" + (f" (lost: {', '.join(lost)})" if lost else "")
