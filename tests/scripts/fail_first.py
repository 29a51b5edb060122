"""One rank fails, its peers then fail on it gone, as in a real job: the launcher must blame the first
(tests/test_root_cause.py).

    fail_first.py RANK HOW

Every rank all-reduces for 20 steps; at step 5, rank RANK fails: HOW = exit (sys.exit(3)), raise (ValueError) or
kill (SIGKILL to itself). The others are in that step's all_reduce by then and fail on the closed connection.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main(failing: int, how: str) -> None:
    dist.init_process_group("gloo")
    total = torch.ones(1)
    for step in range(20):
        if dist.get_rank() == failing and step == 5:
            time.sleep(0.3)  # the others wait in step 5's all_reduce
            if how == "exit":
                sys.exit(3)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(f"rank {failing} fails on purpose at step {step}")
        dist.all_reduce(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
