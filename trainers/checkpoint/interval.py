"""checkpoint.every_steps=auto: the save interval that loses the least expected time (Young/Daly).

Saving every T seconds costs C/T of the time (C: how long a save blocks the loop) and loses T/2 on
average at each failure (one every M seconds); the sum is least at T = sqrt(2 C M). M is
checkpoint.mtbf_s, or less where this job's own restarts have shown failures come more often.
"""

from __future__ import annotations

import math
from typing import Tuple


def young_daly_steps(save_s: float, step_s: float, mtbf_s: float, restarts: int = 0,
                     elapsed_s: float = 0.0) -> Tuple[int, str]:
    """Steps between saves, and the reason in words, from measured save and step times.

    restarts, elapsed_s: how often this job has restarted in how long since its launch; where that
    shows a shorter time between failures than mtbf_s, it is the one used.
    """
    mtbf_s, source = expected_mtbf(mtbf_s, restarts, elapsed_s)
    interval_s = math.sqrt(2 * max(save_s, 1e-6) * mtbf_s)
    steps = max(1, round(interval_s / max(step_s, 1e-6)))
    reason = (f"a save blocks the loop {save_s:.3f}s, a step takes {step_s:.4f}s, {source}: "
              f"saving every {interval_s:.1f}s = {steps} steps (Young/Daly: sqrt(2 x save cost x MTBF))")
    return steps, reason


def expected_mtbf(configured_s: float, restarts: int, elapsed_s: float) -> Tuple[float, str]:
    """The time between failures to plan for, and where it comes from."""
    if restarts > 0 and elapsed_s > 0:
        seen_s = elapsed_s / restarts
        if seen_s < configured_s:
            return seen_s, (f"MTBF {seen_s:.0f}s as this job has shown ({restarts} restart{'s' if restarts > 1 else ''} "
                            f"in {elapsed_s:.0f}s; checkpoint.mtbf_s={configured_s:g})")
    return configured_s, f"checkpoint.mtbf_s={configured_s:g}"
