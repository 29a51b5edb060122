"""NCCL's flight recorder, read back: which rank never joined the collective the others wait in.

On a hang the watchdog asks every NCCL rank for its trace (launcher.agent.stacks.trigger_nccl_dumps);
torch writes it to <run_dir>/stacks/nccl-trace-rank-<k>, a pickle of {"entries": [...], ...} with
one entry per recent collective (torch.distributed.flight_recorder documents the keys:
process_group, collective_seq_id, profiling_name, state, time_created_ns, ...). This module turns
the dumps of one node's ranks into one clause of the hang verdict:

    rank 3 never joined all_reduce #812 (ranks 0-2 waiting 61s)

Only ranks with a dump are judged: a rank of another node is neither named missing nor waiting here.
"""

from __future__ import annotations

import io
import pickle
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from launcher.agent.stacks import NCCL_PIPE_PREFIX as PIPE_PREFIX

TRACE_PREFIX = "nccl-trace-rank-"  # launcher.plan sets TORCH_NCCL_DEBUG_INFO_TEMP_FILE to stacks/<this>
DONE = "completed"


class _PlainData(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings and numbers only: a dump that names any class is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def collect(stacks_dir: Path, wait_s: float) -> Dict[int, Dict[str, Any]]:
    """The dumps of every rank that has a debug pipe here (NCCL ranks asked to dump), waiting up to wait_s
    for NCCL's watchdog thread to write them; whatever is readable by then."""
    asked = {p.name[len(PIPE_PREFIX):].split(".")[0] for p in stacks_dir.glob(f"{PIPE_PREFIX}*.pipe")}
    deadline = time.monotonic() + wait_s
    traces = read_traces(stacks_dir)
    while asked and not asked <= {str(r) for r in traces} and time.monotonic() < deadline:
        time.sleep(0.1)
        traces = read_traces(stacks_dir)
    return traces


def read_traces(stacks_dir: Path) -> Dict[int, Dict[str, Any]]:
    """{global rank: its dump} for every readable flight-recorder dump in stacks_dir."""
    traces = {}
    for path in stacks_dir.glob(f"{TRACE_PREFIX}*"):
        suffix = path.name[len(TRACE_PREFIX):]
        if not suffix.isdigit():
            continue  # the debug pipes (.pipe) and anything else
        try:
            dump = _PlainData(io.BytesIO(path.read_bytes())).load()
        except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError):
            continue  # not written yet, cut short, or not a dump
        if isinstance(dump, dict) and isinstance(dump.get("entries"), list):
            traces[int(suffix)] = dump
    return traces


def verdict(traces: Dict[int, Dict[str, Any]], now_ns: Optional[int] = None) -> Optional[str]:
    """'rank 3 never joined all_reduce #812 (ranks 0-2 waiting 61s)', or None when the dumps show no stuck collective."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    for group, by_rank in sorted(_collectives_by_group(traces).items()):
        found = _stuck(by_rank, now_ns)
        if found:
            return found if group in ("0", "default_pg") else f"{found} in process group {group}"
    return None


def _collectives_by_group(traces: Dict[int, Dict[str, Any]]) -> Dict[str, Dict[int, List[Dict[str, Any]]]]:
    groups: Dict[str, Dict[int, List[Dict[str, Any]]]] = {}
    for rank, dump in traces.items():
        for entry in dump["entries"]:
            if not isinstance(entry, dict) or not entry.get("collective_seq_id"):
                continue  # point-to-point operations have no collective sequence number
            pg = entry.get("process_group") or (entry.get("pg_id", 0), "")
            groups.setdefault(str(pg[0]), {}).setdefault(rank, []).append(entry)
    return groups


def _stuck(by_rank: Dict[int, List[Dict[str, Any]]], now_ns: int) -> Optional[str]:
    """The collective some ranks wait in, who waits and who never reached it.

    NCCL's recorder marks entries started and completed: the stuck one is the earliest not completed
    (ranks may have queued later ones behind it). Gloo's leaves every entry "scheduled": the stuck one
    is then the one after the last that every rank reached.
    """
    tracked = any(e.get("state") in ("started", DONE) for entries in by_rank.values() for e in entries)
    last = {rank: max(_seq(e) for e in entries) for rank, entries in by_rank.items()}
    if tracked:
        pending = [e for entries in by_rank.values() for e in entries if e.get("state") != DONE]
        if not pending:
            return None
        seq = _seq(min(pending, key=_seq))
    else:
        seq = min(last.values()) + 1
        if seq > max(last.values()):
            return None  # every rank reached the same collective: nothing tells whether it ended
    at = {rank: e for rank, entries in by_rank.items() for e in entries if _seq(e) == seq}
    if not at:
        return None  # the ring buffer has dropped it already
    waiting, missing = sorted(at), sorted(r for r in by_rank if last[r] < seq)
    created = min(int(e.get("time_created_ns") or now_ns) for e in at.values())
    name = str(next(iter(at.values())).get("profiling_name") or "a collective").split(":")[-1]
    waited = f"{_ranks(waiting)} waiting {max(0.0, (now_ns - created) / 1e9):.0f}s"
    if missing:
        return f"{_ranks(missing)} never joined {name} #{seq} ({waited})"
    return f"every rank joined {name} #{seq}, which has not completed ({waited}): a network or NCCL problem"


def _seq(entry: Dict[str, Any]) -> int:
    return int(entry.get("collective_seq_id") or 0)


def _ranks(ranks: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> 'ranks 0-2, 5'; [3] -> 'rank 3'."""
    spans: List[Tuple[int, int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], r)
        else:
            spans.append((r, r))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"rank {text}" if len(spans) == 1 and spans[0][0] == spans[0][1] else f"ranks {text}"
