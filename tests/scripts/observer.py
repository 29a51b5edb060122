"""Records what a torchrun-style script can observe about how it was started (tests/test_torchrun_fidelity.py).

    observer.py --out DIR [--spawn]

Each rank writes DIR/seen-<RANK>.json. With --spawn the script picks multiprocessing's spawn start
method on its first lines, as scripts that need it do; its DataLoader worker is then a fresh
interpreter that imports this file again as __mp_main__ (hence the __main__ guard), and each item
it loads says what it sees. One loader worker: what a worker sees does not depend on how many there
are, and each spawned one imports torch again (~2.5 CPU-s, under both launchers).
"""

import multiprocessing
import sys

if __name__ == "__main__" and "--spawn" in sys.argv:  # not in the children, which re-run this file
    multiprocessing.set_start_method("spawn")  # fails if whatever started us had already chosen one
START_METHOD = multiprocessing.get_start_method(allow_none=True)  # before anything below can choose one
NAME, SPEC, PACKAGE, LOADER = __name__, __spec__, __package__, type(__loader__).__name__

import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

PROJECT = ("launcher", "trainers", "cluster", "omegaconf", "psutil", "wandb", "submitit")


def project_modules() -> list:
    return sorted(m for m in sys.modules if m.startswith(PROJECT))


class Numbers(Dataset):
    """0.0 to 63.0, each with what the loader worker that loaded it sees: its __main__ and project modules."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple:
        return torch.tensor(float(i)), sys.modules["__main__"].__name__, ",".join(project_modules())


def main() -> None:
    out = sys.argv[sys.argv.index("--out") + 1]
    env = dict(os.environ)
    print("OUT-LINE", flush=True)
    print("ERR-LINE", file=sys.stderr, flush=True)
    dist.init_process_group("gloo")
    total, children = torch.zeros(()), set()
    for values, mains, projects in DataLoader(Numbers(), batch_size=8, num_workers=1):
        total += values.sum()
        children.update(zip(mains, projects))
    dist.all_reduce(total)
    seen = {
        "env": env, "path": sys.path, "argv": sys.argv, "name": NAME, "file": __file__, "loader": LOADER,
        "spec_is_none": SPEC is None, "package": PACKAGE, "start_method": START_METHOD, "cwd": os.getcwd(),
        "threads": torch.get_num_threads(), "loader_total": float(total), "children": sorted(children),
    }
    dist.destroy_process_group()
    seen["project_modules"] = project_modules()
    seen["modules"] = sorted(sys.modules)  # last: everything the script's run loaded, and whatever came before it
    with open(os.path.join(out, "seen-%s.json" % env["RANK"]), "w") as f:
        json.dump(seen, f, sort_keys=True)


if __name__ == "__main__":
    main()
