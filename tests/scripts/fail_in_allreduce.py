"""Rank 1 raises ValueError mid-training while rank 0 waits for it in an all_reduce, whose knock-on error
(gloo's connection closed by peer) rank 0 then raises (tests/test_failed_runs.py).

    fail_in_allreduce.py [FAILING_ATTEMPTS]

Rank 1 fails in the first FAILING_ATTEMPTS attempts (TORCHELASTIC_RESTART_COUNT below it; default: every
attempt), at step 5 of 20; an attempt it does not fail in completes.
"""

import os
import sys
import time

import torch
import torch.distributed as dist


def main(failing_attempts: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    fails = rank == 1 and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) < failing_attempts
    total = torch.ones(1)
    for step in range(20):
        if fails and step == 5:
            time.sleep(0.5)  # rank 0 is in the all_reduce of step 5 by now
            raise ValueError(f"boom on rank 1 at step {step}")
        dist.all_reduce(total)
        print(f"step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 30)
