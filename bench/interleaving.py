"""Prints and progress bars of every rank on one console: the launcher against torchrun, measured.

    python bench/interleaving.py [--ranks 3] [--steps 45] [--rounds 3]

Each round runs tests/scripts/tqdm_prints.py under the launcher, torchrun and torchrun --tee 3 and prints,
for each, the share of console rows (as a terminal shows them) and of pieces (between any two \\r or \\n, as
a pipe shows them) that mix ranks or hold a broken line, and how many prints came out whole
(tests/interleaving.py says how; tests/test_console.py asserts ours is no worse).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.interleaving import compare  # noqa: E402  (after the sys.path line, on purpose)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=45)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    for i in range(args.rounds):
        for how, mix in compare(args.ranks, args.steps).items():
            print(f"round {i} {how:17s} {mix}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
