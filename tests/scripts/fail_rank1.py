"""Rank 1 raises ValueError("boom") two frames deep; rank 0 returns (tests/test_torchrun_fidelity.py)."""

import os


def step() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("boom")


def main() -> None:
    step()


if __name__ == "__main__":
    main()
