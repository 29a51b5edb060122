"""Ctrl-C over a plain script's whole job: SIGINT to the launcher's process group at every phase, counted.

    python bench/ctrl_c.py [--rounds 50] [--seed 0] [--json bench/ctrl_c.json]

Each round runs `python -m launcher --gpus 2 tests/scripts/ctrl_c_train.py` and sends SIGINT to its whole
process group, as a terminal's Ctrl-C does, at a random moment of one phase (start-up, workers, init,
steps, end: tests/ctrl_c_rounds.py), the phases taken in turn. It prints each round, then how many leaked
a launcher frame onto the console and how many ended otherwise than with the launcher's `interrupted`
line and exit 130 (or completed, when the job had finished). bench/early_interrupt.py is the launcher's
first 1.5 s only, for the built-in trainer too; tests/test_ctrl_c.py runs a few rounds of this one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.ctrl_c_rounds import PHASES, one_round  # noqa: E402  (after the sys.path line, on purpose)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0, help="a round not over by then is a hang")
    p.add_argument("--json", default="", help="write every round (output included) here")
    args = p.parse_args()
    rng, phases, rounds = random.Random(args.seed), list(PHASES), []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="ctrl-c-") as tmp:
            r = one_round(Path(tmp), phases[i % len(phases)], rng, args.timeout)
        rounds.append(r)
        print(f"{i:3d} {r.phase:8s} +{r.delay_s:.3f}s exit {r.code:4d} {r.verdict}", flush=True)
        if r.verdict != "clean":
            print("    | " + r.output[-1500:].replace("\n", "\n    | "), flush=True)
    leaked = [r for r in rounds if r.leaked]
    bugs = [r for r in rounds if r.verdict != "clean"]
    print(f"{len(rounds)} rounds: {len(leaked)} leaked a launcher frame, {len(bugs)} not clean; "
          f"leaks by phase {dict(Counter(r.phase for r in leaked))}, exits {dict(Counter(r.code for r in rounds))}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rounds], indent=1) + "\n")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
