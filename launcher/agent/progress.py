"""What the hang watchdog judges: each local rank's progress so far, and when its silence is a hang (pure).

Progress is a beat of the rank's heartbeat file (launcher.runtime.beats): heartbeat(), the built-in
trainer's steps, or any optimizer step of a plain script (the worker bootstrap's global
optimizer-step hook). A rank is hung when it has been silent for longer than it is allowed:

    allowed = max(watchdog.timeout_s, its start-up, SLOWEST_FACTOR x the longest between two progresses so far)

where its start-up is the time from the worker's start to its first progress (imports, rendezvous,
a first compile, a first evaluation), so a script whose steps, or evaluations between steps, are
slower than the timeout is never stopped once one of them was seen. A rank that never made progress is judged only by
watchdog.start_timeout_s (launcher.agent.watchdog), never by this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List

from launcher.runtime.beats import DONE_AT

SLOWEST_FACTOR = 2.0  # a step may take twice as long as the slowest seen before it is a hang


@dataclass(frozen=True)
class RankBeat:
    rank: int
    local_rank: int
    pid: int
    thread: int  # ident of the worker's main thread
    beat_at: float  # wall-clock time of the last beat; 0 = never beat, DONE_AT = finished
    started_at: float = 0.0  # wall-clock time the worker process started


@dataclass
class RankProgress:
    """One worker's progress as the watchdog has seen it over its polls."""

    started_at: float
    last_beat: float = 0.0  # 0 = never made progress
    first_s: float = 0.0  # from the start to the first progress
    longest_gap_s: float = 0.0  # the longest between two progresses after the first
    done: bool = False  # finished (or tearing down): never judged again

    def see(self, beat_at: float) -> None:
        if beat_at == DONE_AT and self.last_beat:  # disarmed after progress: finished, not hung
            self.done = True
        if self.done or beat_at <= self.last_beat or beat_at == DONE_AT:
            return
        if self.last_beat:
            self.longest_gap_s = max(self.longest_gap_s, beat_at - self.last_beat)
        else:
            self.first_s = max(0.0, beat_at - self.started_at)
        self.last_beat = beat_at

    def allowed_s(self, timeout_s: float) -> float:
        return max(timeout_s, self.first_s, SLOWEST_FACTOR * self.longest_gap_s)

    def silent_s(self, now: float) -> float:
        return now - self.last_beat if self.last_beat else 0.0


class Progress:
    """Every local rank's RankProgress, keyed by pid (a restarted attempt's workers start afresh)."""

    def __init__(self) -> None:
        self.by_pid: Dict[int, RankProgress] = {}

    def update(self, ranks: Iterable[RankBeat]) -> None:
        for r in ranks:
            self.by_pid.setdefault(r.pid, RankProgress(started_at=r.started_at)).see(r.beat_at)

    def of(self, r: RankBeat) -> RankProgress:
        return self.by_pid.setdefault(r.pid, RankProgress(started_at=r.started_at))

    def stuck(self, ranks: List[RankBeat], timeout_s: float, now: float, share: float = 1.0) -> List[RankBeat]:
        """Ranks that made progress, then were silent for longer than share x what they are allowed; longest first."""
        found = []
        for r in ranks:
            p = self.of(r)
            if p.last_beat and not p.done and p.silent_s(now) > share * p.allowed_s(timeout_s):
                found.append(r)
        return sorted(found, key=lambda r: self.of(r).last_beat)

    def never_started(self, ranks: List[RankBeat]) -> List[RankBeat]:
        """Live ranks with no progress yet."""
        return [r for r in ranks if not self.of(r).last_beat and not self.of(r).done]

    def any_progress(self, ranks: List[RankBeat]) -> bool:
        return any(self.of(r).last_beat for r in ranks)


def stuck_ranks(ranks: List[RankBeat], silent_s: float, now: float) -> List[RankBeat]:
    """Ranks that have beaten and then been silent for longer than silent_s, longest first (one look, no history)."""
    stuck = [r for r in ranks if r.beat_at > DONE_AT and now - r.beat_at > silent_s]
    return sorted(stuck, key=lambda r: r.beat_at)
