"""A user's script that imports its own modules named like the launcher's folders (tests/test_user_modules.py).

    user_modules.py --out DIR      (or python -m userjob.user_modules --out DIR)

Each of trainers, tests, cluster and configs must be the user's own (a module whose NAME says where it
lies); rank K writes DIR/rank-K.json with those names, every sys.path entry and the world size torchrun's
environment gives. It imports no torch: what a worker finds on its path does not depend on it, and each
torchrun worker would spend ~2.5 CPU-s importing it (the launcher's workers start with it imported).
"""

import json
import os
import sys

import cluster
import configs
import tests
import trainers


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1]
    seen = {"modules": {m.__name__: m.NAME for m in (trainers, tests, cluster, configs)}, "path": sys.path,
            "pythonpath": os.environ.get("PYTHONPATH"), "world_size": int(os.environ["WORLD_SIZE"])}
    with open(os.path.join(out, f"rank-{os.environ['RANK']}.json"), "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
