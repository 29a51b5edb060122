"""A user's script that imports its own modules named like the launcher's folders (tests/test_user_modules.py).

    user_modules.py --out DIR      (or python -m userjob.user_modules --out DIR)

Each of trainers, tests, cluster and configs must be the user's own (a module whose NAME says where it
lies); rank K writes DIR/rank-K.json with those names and every sys.path entry.
"""

import json
import os
import sys

import torch.distributed as dist

import cluster
import configs
import tests
import trainers


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    seen = {"modules": {m.__name__: m.NAME for m in (trainers, tests, cluster, configs)}, "path": sys.path,
            "pythonpath": os.environ.get("PYTHONPATH"), "world_size": dist.get_world_size()}
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(seen, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
