"""Fault injection for tests of restarts: LAUNCHER_INJECT_FAULT=rank=R,step=S[,attempt=A].

Rank R raises at step S in restart attempt A (default 0 only, so the restarted job goes on).
An environment variable rather than a config key: it is not part of a job's recorded config.
"""

from __future__ import annotations

import os
from typing import Dict, Optional

ENV = "LAUNCHER_INJECT_FAULT"


class InjectedFault(RuntimeError):
    """Raised on purpose by a test; never in a normal run."""


def parse(text: str) -> Dict[str, int]:
    fields = dict(item.split("=", 1) for item in text.split(",") if "=" in item)
    return {"rank": int(fields["rank"]), "step": int(fields["step"]), "attempt": int(fields.get("attempt", 0))}


def maybe_fail(rank: int, step: int, attempt: int, spec: Optional[str] = None) -> None:
    spec = os.environ.get(ENV) if spec is None else spec
    if not spec:
        return
    fault = parse(spec)
    if (fault["rank"], fault["step"], fault["attempt"]) == (rank, step, attempt):
        raise InjectedFault(f"injected fault on rank {rank} at step {step} (attempt {attempt})")
