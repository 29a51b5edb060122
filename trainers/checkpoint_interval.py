"""checkpoint.every_steps=auto: the save interval that loses the least expected time (Young/Daly).

Saving every T seconds costs C/T of the time (C: how long a save blocks the loop) and loses T/2 on
average at each failure (one every M seconds, checkpoint.mtbf_s); the sum is least at T = sqrt(2 C M).
"""

from __future__ import annotations

import math
from typing import Tuple


def young_daly_steps(save_s: float, step_s: float, mtbf_s: float) -> Tuple[int, str]:
    """Steps between saves, and the reason in words, from measured save and step times."""
    interval_s = math.sqrt(2 * max(save_s, 1e-6) * mtbf_s)
    steps = max(1, round(interval_s / max(step_s, 1e-6)))
    reason = (f"a save blocks the loop {save_s:.3f}s, a step takes {step_s:.4f}s, checkpoint.mtbf_s={mtbf_s:g}: "
              f"saving every {interval_s:.1f}s = {steps} steps (Young/Daly: sqrt(2 x save cost x MTBF))")
    return steps, reason
