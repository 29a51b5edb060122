"""A torchrun-style script for tests/test_backend_contract.py: records what each rank sees.

    contract.py --out DIR [--fail-rank K [--peers-late S | --exit-code N]] [--block]

Every rank prints "contract: hello from rank <RANK>", joins a gloo process group, all-reduces
RANK + 1 and writes DIR/seen-<RANK>.json with its torchrun environment, its pid and the
all-reduce result, then meets the others in a barrier. --fail-rank K: rank K raises
RuntimeError("contract: rank K fails on purpose") instead of reaching the barrier (its peers then
fail there, as the peers of a crashed rank do); with --peers-late S they first compute for S seconds, so
the launcher must stop them before they see it (a rank that crashes while the others train); with --exit-code N
rank K ends with sys.exit(N) instead (no error of its own to record) and the others fail on it gone. --block:
each rank writes DIR/ready-<RANK> (with its pid) and then all-reduces every 0.2 s, like a training loop,
until it is stopped (for the Ctrl-C contract; it gives up after 600 s).
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_NAME", "ROLE_RANK",
       "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, sort_keys=True)
    os.replace(tmp, path)  # a reader never sees half a record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--peers-late", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=0)
    parser.add_argument("--block", action="store_true")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    print(f"contract: hello from rank {rank}", flush=True)  # lands in this rank's log only
    dist.init_process_group("gloo")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    seen = {k: os.environ.get(k) for k in ENV}
    seen.update(pid=os.getpid(), host=socket.gethostname(), allreduce=total.item(),
                pg_rank=dist.get_rank(), pg_world_size=dist.get_world_size())
    write_json(os.path.join(args.out, f"seen-{rank}.json"), seen)
    if rank == args.fail_rank and args.exit_code:
        raise SystemExit(args.exit_code)
    if rank == args.fail_rank:
        raise RuntimeError(f"contract: rank {rank} fails on purpose")
    if args.fail_rank >= 0:
        time.sleep(args.peers_late)
    if args.block:  # like a training loop: a collective every 0.2 s, until the job is stopped
        write_json(os.path.join(args.out, f"ready-{rank}"), {"pid": os.getpid()})
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            dist.all_reduce(torch.ones(1))
            time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
