"""A slow node taken out of the job for a waiting hot spare (launcher.evict_slow_after_s).

The step rows in metrics.jsonl (the built-in trainer's rank 0, or a script's rows made by the launcher on rank 0's
node) name a straggler rank once it lagged a few windows in a row (launcher.runtime.stragglers). The agent of the
node that runs rank 0, where those rows are written, judges: when every row since one rank was first named has named
it for evict_slow_after_s, and a spare waits in the rendezvous, it says so on the round's store and records it.
Every agent looks for that word about once a second; the one whose workers hold that rank leaves (launcher.agent.
elastic): its workers stop, it takes itself out of the round, and the others, whose collectives fail on it, re-form
with the spare at the same world size. The word is on the round's store, so machines that share no run directory
work alike.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from launcher.runtime import env, safefs
from launcher.runtime.goodput import DIR, launch_key

log = logging.getLogger("launcher")
LOOK_S = 1.0  # how often an agent reads the new rows and the store
MAX_READ = 1 << 20  # bytes of new rows read at one look


class Evicted(Exception):
    """This node leaves the job for a spare: raised out of the agent's loop, which stops its workers."""


class Eviction:
    """One node agent's part: round_started() after each rendezvous round, look() at each look at the workers."""

    def __init__(self, run_dir: str, after_s: float, spares_waiting: Callable[[Any], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.after_s, self.spares_waiting, self.clock = run_dir, after_s, spares_waiting, clock
        self.rows = Path(run_dir) / "metrics.jsonl"
        self.store: Any = None
        self.round = 0
        self.ranks: frozenset = frozenset()
        self.judge = False  # this node runs rank 0: it reads the rows
        self.offset = 0
        self.named: Optional[int] = None  # the rank every row since `since` named
        self.since: Optional[float] = None
        self.why = ""
        self.said = False  # the word for this round is on the store
        self.next_look = 0.0

    def round_started(self, worker_group: Any, round_: int) -> None:
        """A new round: its store, this node's ranks in it; rows from before it judge nobody."""
        self.store, self.round = worker_group.store, round_
        self.ranks = frozenset(int(w.global_rank) for w in worker_group.workers)
        self.judge = 0 in self.ranks
        self.offset = self._size()
        self.named = self.since = None
        self.said = False
        self.next_look = self.clock() + LOOK_S

    def look(self, handler: Any) -> None:
        """Raises Evicted where the word on the store names one of this node's ranks."""
        now = self.clock()
        if self.store is None or now < self.next_look:
            return
        self.next_look = now + LOOK_S
        if self.judge and not self.said:
            self._judge(handler, now)
        word = self._word()
        rank = word.get("rank") if word is not None else None
        if isinstance(rank, int) and not isinstance(rank, bool) and rank in self.ranks:  # (True == 1: not a rank)
            raise Evicted(str(word.get("why") or "its ranks were the straggler")[:600])  # type: ignore[union-attr]

    @property
    def key(self) -> str:
        return f"launcher/evict/{self.round}"

    def _judge(self, handler: Any, now: float) -> None:
        for row in self._new_rows():
            rank = row.get("straggler_rank")
            if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
                if rank != self.named:
                    self.named, self.since = rank, now
                self.why = str(row.get("straggler") or f"rank {rank} is the straggler")[:300]
            else:
                self.named = self.since = None
        if self.named is None or self.since is None or now - self.since < self.after_s:
            return
        try:
            waiting = self.spares_waiting(handler)
        except Exception as e:  # noqa: BLE001  (a store gone: the next look asks again)
            log.debug(f"the spares waiting could not be read: {e!r}")
            return
        if waiting <= 0:
            return
        lagged = now - self.since
        why = (f"rank {self.named} was the straggler for {lagged:.0f}s ({self.why}), over "
               f"launcher.evict_slow_after_s={self.after_s:g}, and a spare waits to take its node's place")
        word = {"rank": self.named, "why": why, "round": self.round, "at": time.time(), "lagged_s": round(lagged, 1)}
        try:
            self.store.set(self.key, json.dumps(word))
        except (RuntimeError, ValueError) as e:
            log.debug(f"the eviction was not said on the store: {e!r}")
            return
        self.said = True
        log.warning(f"evicting the node of rank {self.named}: {why}")
        self._record(word)

    def _word(self) -> Optional[Dict[str, Any]]:
        try:
            if not self.store.check([self.key]):
                return None
            word = json.loads(self.store.get(self.key))
        except (RuntimeError, ValueError) as e:  # a store on an open port: what is not ours is no word
            log.debug(f"the eviction word could not be read: {e!r}")
            return None
        return word if isinstance(word, dict) else None

    def _size(self) -> int:
        try:
            return os.lstat(self.rows).st_size
        except OSError:
            return 0

    def _new_rows(self) -> List[Dict[str, Any]]:
        rows, self.offset = safefs.read_new_rows(str(self.rows), self.offset, root=self.run_dir, most=MAX_READ)
        return rows

    def _record(self, word: Dict[str, Any]) -> None:
        """goodput/<launch>-evicted-<round>.json beside the round records (launcher.runtime.goodput reads both)."""
        started = os.environ.get(env.START_TIME)
        if started is None:
            return
        path = Path(self.run_dir) / DIR / f"{launch_key(float(started))}-evicted-{self.round}.json"
        try:
            fd = safefs.open_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=self.run_dir)
            with os.fdopen(fd, "w") as f:
                json.dump(word, f)
        except OSError as e:
            log.debug(f"eviction record {path.name} not written: {e!r}")
