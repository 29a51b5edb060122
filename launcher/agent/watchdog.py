"""Agent side of the hang watchdog: a thread in each node's launcher that catches stuck ranks.

A local rank that made progress (launcher.runtime.beats: heartbeat(), the built-in trainer's steps,
a plain script's optimizer steps) and then stays silent for longer than it is allowed
(launcher.agent.progress) is hung; a rank that has made none watchdog.start_timeout_s after it
started while sitting in init_process_group is a stuck start. Either way the watchdog dumps every
local rank's stacks into <run_dir>/stacks/ (launcher.agent.stacks), names the ranks and where they
are, stops the job (the agent shuts down, hung workers are killed) and the run ends with
HangError: exit 1, summary status "hung". In a multi-node job a node that fires on a hang first tells the others
(Peers), which dump and stop their ranks too; no node stops its ranks before every node has said its stacks are
dumped (bounded): the ranks elsewhere that wait on a hung one fail the moment it is killed.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Protocol, Set, TypeVar

from launcher.agent import flight
from launcher.agent.progress import SLOWEST_FACTOR, Progress, RankBeat, stuck_ranks
from launcher.agent.rundir_guard import run_dir_guarded
from launcher.agent.spec import AgentSpec
from launcher.agent.stacks import (DUMP_WAIT_S, NATIVE_WAIT_S, dump_loader_workers, dump_native, dump_stacks,
                                   in_collective, in_data_loader, in_setup, innermost_frame, trigger_nccl_dumps,
                                   where)
from launcher.agent.watching import watched_by
from launcher.runtime.beats import BEAT_INTERVAL_S, read_beat
from launcher.errors import HangError

log = logging.getLogger("launcher")
T = TypeVar("T")

KILL_AFTER_S = 0.3  # let the agent's shutdown start first, so it does not restart the killed workers
CAUSE = "not in init_process_group"  # in a stuck start's verdict: the ranks the others wait for
WAITING = "all in a collective, waiting for another node"  # in a multi-node hang's verdict: its ranks wait, they are not the cause
FIRED_FIRST = "watchdog fired first"  # in the verdict of a node that stopped because another node's watchdog fired
ACK_WAIT_S = DUMP_WAIT_S + NATIVE_WAIT_S  # from firing on a hang, how long a node waits for the others' stacks before it stops
STILL_BEATING_S = 4 * BEAT_INTERVAL_S  # stopping with another node's hang: a rank silent for longer is stuck with it


class Peers(Protocol):
    """The job's other nodes (launcher.backends.peer_flags): flags on the nodes' store that every node's watchdog
    sets and reads. Every call is cheap and never raises; a value not signed with the job's secret is no flag."""

    def flag_stuck_start(self) -> None:
        """A rank here has waited in init_process_group past watchdog.start_timeout_s."""

    def stuck_start_flagged(self) -> bool:
        """Whether some node flagged a stuck start."""

    def flag_hang(self) -> None:
        """This node's watchdog fired on a hang: the other nodes dump their ranks' stacks and stop too."""

    def hang_flagged(self) -> Optional[int]:
        """The node whose watchdog flagged a hang, where another node did."""

    def ack_hang(self) -> None:
        """This node's ranks' stacks are dumped (or it has no rank left)."""

    def wait_for_acks(self, wait_s: float) -> int:
        """Wait up to wait_s for every other node's ack; how many did not come."""


def local_ranks(run_dir: Path, children: Dict[int, float]) -> List[RankBeat]:
    """The registered ranks that are live worker processes of this launcher, on this host.

    children: {pid: when it started} of this launcher's descendants.
    """
    host, found = socket.gethostname(), []
    for path in sorted((run_dir / "heartbeats").glob("rank-*")):
        record = read_beat(path)
        if record is None or record.get("host") != host or record.get("pid") not in children:
            continue
        pid = int(record["pid"])
        found.append(RankBeat(int(record["rank"]), int(record["local_rank"]), pid, int(record["thread"]),
                              float(record["beat_at"]), children[pid]))
    return found


class Watchdog(threading.Thread):
    """Polls this node's heartbeat files; on a hang or a stuck start, explains it and stops the job."""

    def __init__(self, run_dir: str, timeout_s: float, start_timeout_s: float = 0.0,
                 peers: Optional[Peers] = None) -> None:
        super().__init__(name="launcher-watchdog", daemon=True)
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.verdict: Optional[str] = None  # the explanation, once it fired
        self.progress = Progress()
        self._stop_event = threading.Event()
        self._poll_s = min(1.0, max(0.1, min(timeout_s, start_timeout_s or timeout_s) / 10))
        self._next_setup_look = 0.0
        self.peers = peers
        self._flagged_elsewhere = False  # a stuck start flagged by another node
        self._hang_on: Optional[int] = None  # the node whose hang this node stops with
        self._acked = False

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self._poll_s):
            ranks = local_ranks(self.run_dir, _children())
            self.progress.update(ranks)
            now = time.time()
            if self.progress.stuck(ranks, self.timeout_s, now):
                self._fire(ranks, None)
                return
            late = self._late_starters(ranks, now)
            if late or self._hang_elsewhere(ranks):
                self._fire(ranks, late or None)
                return

    def _late_starters(self, ranks: List[RankBeat], now: float) -> List[RankBeat]:
        """Ranks with no progress start_timeout_s after they started, once one of them, or a rank on
        another node (Peers), sits in init_process_group.

        Only set-up counts: a script that never steps an optimizer (inference, a custom loop) is never
        judged, and one stack dump per start_timeout_s is all it costs it.
        """
        if self.start_timeout_s <= 0:
            return []
        late = [r for r in self.progress.never_started(ranks) if now - r.started_at > self.start_timeout_s]
        if late and self.peers is not None and self.peers.stuck_start_flagged():
            self._flagged_elsewhere = True
            return late
        if not late or now < self._next_setup_look:
            return []
        self._next_setup_look = now + self.start_timeout_s
        frames = dump_stacks(self.run_dir, late)
        if not any(in_setup(frames[r.rank]) for r in late):
            return []
        if self.peers is not None:
            self.peers.flag_stuck_start()  # before this node stops: the rank the others wait for may be on another node
        return late

    def _hang_elsewhere(self, ranks: List[RankBeat]) -> bool:
        """Whether another node's watchdog fired on a hang: this node's ranks are then dumped and stopped with it,
        while they still wait on that node's. A node with no live rank left has nothing to dump and says so."""
        if self.peers is None or self._acked:
            return False
        node = self.peers.hang_flagged()
        if node is None:
            return False
        if not any(not self.progress.of(r).done for r in ranks):
            self.peers.ack_hang()
            self._acked = True
            return False
        self._hang_on = node
        return True

    def _fire(self, ranks: List[RankBeat], late: Optional[List[RankBeat]]) -> None:
        now = time.time()
        if late is None and self._hang_on is None and self.peers is not None:
            self.peers.flag_hang()  # first: the other nodes' ranks are dumped while they still wait on this node's
        ack_by = time.monotonic() + ACK_WAIT_S
        trigger_nccl_dumps(self.run_dir)
        frames = dump_stacks(self.run_dir, ranks)
        places = {rank: where(f) for rank, f in frames.items()}
        setup = {rank for rank, f in frames.items() if in_setup(f)}
        for r in ranks:  # a rank waiting for its data loader: where the loader's worker is, is the cause
            if in_data_loader(frames[r.rank]):
                inner = [innermost_frame(p.read_text(errors="replace")) for p in dump_loader_workers(self.run_dir, [r])]
                places[r.rank] = where(frames[r.rank], worker=next((i for i in inner if i), None))
        waiting = {rank for rank, f in frames.items() if in_collective(f)}
        self.verdict = with_recorder(self._explain(ranks, late, places, setup, waiting, now), flight.verdict(
            flight.collect(self.run_dir / "stacks", DUMP_WAIT_S)))  # NCCL ranks only; their dumps were asked for first
        log.error("watchdog: " + self._what_fired(late) + "; stacks dumped, stopping the job")
        note = dump_native(self.run_dir, ranks)
        if note:
            log.warning(f"watchdog: {note}")
        if self.peers is not None:
            self.peers.ack_hang()  # then, on a hang, no node stops its ranks before every node's are dumped
            missing = self.peers.wait_for_acks(max(0.0, ack_by - time.monotonic())) if late is None else 0
            if missing:
                log.warning(f"watchdog: {missing} other node(s) did not dump their ranks' stacks within {ACK_WAIT_S:g}s")
        log.debug(self.verdict)  # the launcher's log file; the console gets it as the run's error line
        if not self._stop_event.is_set():  # the agent still runs (a rank may have failed meanwhile, ending it)
            _thread.interrupt_main(signal.SIGTERM)  # the agent shuts down instead of restarting workers
            time.sleep(KILL_AFTER_S)
        for r in ranks:
            _kill_tree(r.pid)  # hung in a collective, a worker may never act on SIGTERM

    def _what_fired(self, late: Optional[List[RankBeat]]) -> str:
        if late is not None:
            return "ranks never started"
        return "ranks made no progress" if self._hang_on is None else f"node {self._hang_on}'s {FIRED_FIRST} on a hang"

    def _explain(self, ranks: List[RankBeat], late: Optional[List[RankBeat]], places: Dict[int, str], setup: Set[int],
                 waiting: Set[int], now: float) -> str:
        never = self.progress.never_started(ranks)
        stacks = f"stacks in {self.run_dir / 'stacks'}"
        if late is not None:
            return self._explain_start(ranks, never, places, setup) + "; " + stacks
        # One stuck rank soon stalls the rest in their next collective, and beats are coarse: every
        # rank silent for half its allowance counts as stuck; the odd place out is usually the cause. Stopping
        # with another node's hang, before its own allowance ran out: every rank that stopped beating.
        if self._hang_on is None:
            silent = self.progress.stuck(ranks, self.timeout_s, now, share=0.5)
        else:
            silent = [r for r in stuck_ranks(ranks, STILL_BEATING_S, now) if not self.progress.of(r).done]
        others = [r for r in ranks if r not in silent and r not in never]
        parts = [", ".join(f"rank {r.rank} stuck {self.progress.of(r).silent_s(now):.0f}s in {places[r.rank]}" for r in silent)]
        parts += ["still beating: " + ", ".join(f"rank {r.rank} in {places[r.rank]}" for r in others)] if others else []
        parts += ["never made progress: " + ", ".join(f"rank {r.rank} in {places[r.rank]}" for r in never)] if never else []
        if self.peers is not None and silent and all(r.rank in waiting for r in silent):
            parts.append(WAITING)  # where the others' verdicts name a rank outside one, theirs lead (nodes_verdict)
        detail = "; ".join([p for p in parts if p] + [stacks])
        if self._hang_on is not None:
            return f"hang (node {self._hang_on}'s {FIRED_FIRST}): {detail}"
        allowed = max(self.progress.of(r).allowed_s(self.timeout_s) for r in silent)
        why = "watchdog.timeout_s" if allowed <= self.timeout_s else f"its start-up, or {SLOWEST_FACTOR:g} x its slowest step"
        return f"hang: no progress for over {allowed:.0f}s ({why}): {detail}"

    def _explain_start(self, ranks: List[RankBeat], never: List[RankBeat], places: Dict[int, str], setup: Set[int]) -> str:
        """The ranks the others wait for lead: those not in init_process_group; then those waiting in it."""
        def named(rs: List[RankBeat]) -> str:
            return ", ".join(f"rank {r.rank} in {places[r.rank]}" for r in rs)
        cause = [r for r in never if r.rank not in setup]
        waiting = [r for r in never if r.rank in setup]
        began = [r for r in ranks if r not in never]
        parts = [f"stuck start: no progress within {self.start_timeout_s:g}s of starting (watchdog.start_timeout_s)"]
        parts += [f"{CAUSE}: {named(cause)}"] if cause else []
        if waiting:
            parts.append(f"waiting: {named(waiting)}")
        elif self._flagged_elsewhere:
            parts.append("waiting in init_process_group: ranks on another node")
        parts += [f"running: {named(began)}"] if began else []
        return "; ".join(parts)


def nodes_verdict(found: Dict[int, str]) -> str:
    """The job's verdict from every hung node's: 'node K: ...' joined by ' | ', the nodes that name the ranks
    the others wait for first: a stuck start's cause; then, of a hang, the nodes whose stuck ranks are not all
    waiting in a collective, and the node whose watchdog fired first before those that stopped with it. The head's
    own end, where it failed instead (its ranks' collectives failed when another node stopped its ranks), comes last."""
    def leads_last(k: int) -> Any:
        v = found[k]
        return (not v.startswith(("hang", "stuck start")), f"; {CAUSE}: " not in v, f"; {WAITING}" in v,
                f"'s {FIRED_FIRST})" in v, k)

    order = sorted(found, key=leads_last)
    return " | ".join(f"node {k}: {found[k]}" for k in order)


def with_recorder(verdict: str, recorded: Optional[str]) -> str:
    """The flight recorder's finding leads the verdict: it names the collective, not just where ranks wait."""
    if not recorded:
        return verdict
    kind, _, rest = verdict.partition(": ")
    return f"{kind}: {recorded} (NCCL flight recorder); {rest}"


def _children() -> Dict[int, float]:
    import psutil

    found = {}
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            found[p.pid] = p.create_time()
    return found


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = proc.children(recursive=True) + [proc]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def what_is_watched(spec: AgentSpec) -> str:
    """The one console line that says what the watchdog judges, for this job."""
    timeout, start = spec.watchdog_timeout_s, spec.watchdog_start_timeout_s
    if spec.kind == "trainer":
        progress = "training steps"
    else:
        progress = "optimizer steps (any torch.optim optimizer) and heartbeat() calls; ranks that never make one are not judged"
    start_part = f", or none within {start:g}s of starting while in init_process_group" if start > 0 else ""
    return (f"watchdog: progress = {progress}; hung = none for max({timeout:g}s, its start-up, "
            f"{SLOWEST_FACTOR:g} x its slowest step){start_part} (watchdog.timeout_s, watchdog.start_timeout_s)")


@contextlib.contextmanager
def node_watchdog(run_dir: str, timeout_s: float, start_timeout_s: float = 0.0,
                  peers: Optional[Peers] = None) -> Iterator[Optional[Watchdog]]:
    """Watch this node's ranks while the body runs; a hang turns whatever the body raised into HangError."""
    if timeout_s <= 0:
        yield None
        return
    with watched_by(Watchdog(run_dir, timeout_s, start_timeout_s, peers), HangError, DUMP_WAIT_S + NATIVE_WAIT_S + 2) as dog:
        yield dog


def run_watched(run_dir: str, spec: AgentSpec, launch: Callable[[], T], announce: bool = True,
                peers: Optional[Peers] = None) -> T:
    """launch() (this node's agent) under the watchdog spec sets (watchdog.*); peers: the other nodes of a
    multi-node job."""
    timeout_s = spec.watchdog_timeout_s
    if announce and timeout_s > 0:
        log.info(what_is_watched(spec))
    with run_dir_guarded(run_dir), node_watchdog(run_dir, timeout_s, spec.watchdog_start_timeout_s, peers):
        return launch()
