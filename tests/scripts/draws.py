"""Draws from every global random generator a training script uses unseeded (tests/test_randomness.py).

    draws.py --out DIR [--seed N] [--fail-rank R]

Rank K writes DIR/draws-K-attempt-A.json (A: TORCHELASTIC_RESTART_COUNT) with torch.initial_seed(), a few
torch.rand values, a dropout mask, Python random and NumPy global draws. --seed seeds all three first, as a
reproducible script does. --fail-rank R: rank R raises on the first attempt (to be restarted).
"""

import json
import os
import random
import sys

import numpy as np
import torch


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1]
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
    rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    draws = {
        "file": __file__,  # as Python makes it: the working folder joined to the path given, not normalised
        "initial_seed": torch.initial_seed(),
        "torch": torch.rand(4).tolist(),
        "dropout": torch.nn.functional.dropout(torch.ones(16), 0.5).tolist(),
        "random": [random.random() for _ in range(4)],
        "numpy": np.random.rand(4).tolist(),
    }
    with open(os.path.join(out, f"draws-{rank}-attempt-{attempt}.json"), "w") as f:
        json.dump(draws, f)
    if "--fail-rank" in sys.argv and attempt == 0 and rank == int(sys.argv[sys.argv.index("--fail-rank") + 1]):
        raise SystemExit(3)


if __name__ == "__main__":
    main()
