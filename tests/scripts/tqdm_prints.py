"""Every rank prints lines and drives a tqdm progress bar at the same time (tests/interleaving.py).

    tqdm_prints.py OUT_DIR [STEPS]

Rank R prints "rank R line I" on stdout every 3 steps and redraws its bar, "rank R: ...", on stderr
(tqdm's default) at every step. Each rank also keeps a copy of what it wrote to each stream, byte for
byte, in OUT_DIR/rank-R.out and OUT_DIR/rank-R.err, for comparing with the launcher's log.
"""

import os
import sys
import time

from tqdm import tqdm


class Copy:
    """A stream that also appends what it is given to a file."""

    def __init__(self, stream, path: str) -> None:
        self.stream, self.copy = stream, open(path, "w", encoding="utf-8", newline="")

    def write(self, text: str) -> int:
        self.copy.write(text)
        self.copy.flush()
        return self.stream.write(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def main(out: str, steps: int) -> None:
    rank = int(os.environ["RANK"])
    sys.stdout = Copy(sys.stdout, os.path.join(out, f"rank-{rank}.out"))
    sys.stderr = Copy(sys.stderr, os.path.join(out, f"rank-{rank}.err"))
    for i in tqdm(range(steps), desc=f"rank {rank}", mininterval=0, ascii=True, ncols=70):
        time.sleep(0.02)
        if i % 3 == 0:
            print(f"rank {rank} line {i}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 60)
