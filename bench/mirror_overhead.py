"""What copying the other nodes' files to the head costs (launcher.backends.mirror): the same 2-node x 2-worker
job (4 ranks, a DDP script whose every rank prints a line per step) run on this machine as two node agents,
once with one shared output folder (the head's token is seen: nothing is copied, the baseline) and once with
a folder per node (node 1's logs and step records copied to the head while it runs). Rounds alternate.

    python bench/mirror_overhead.py [--rounds N] [--steps S]

Prints each run's median step time (summary.json's step_time_s_median: every rank's records), the ratio
copied/shared of their medians, and the sender's own cost measured in-process: the CPU seconds one
look-and-batch of 2 ranks' growing files takes, per second of job (it runs once a second), and the head's writes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Tuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SCRIPT = """
import os, time, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(int(os.environ["BENCH_STEPS"])):
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    print(f"rank {rank} step {step} loss {loss.item():.4f} " + "x" * 100, flush=True)
dist.destroy_process_group()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_job(root: Path, script: Path, shared: bool, steps: int) -> float:
    """The job's median step time (s): 2 node agents on 127.0.0.1, one output folder or one each."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), WANDB_MODE="disabled", BENCH_STEPS=str(steps))
    outs = [root / "shared"] * 2 if shared else [root / "node0", root / "node1"]
    procs = [subprocess.Popen([sys.executable, "-m", "launcher", "--nodes", "2", "--gpus", "2", "--node-rank", str(k),
                               "--master-addr", "127.0.0.1", "--master-port", str(port), f"output_dir={outs[k]}",
                               "wandb.mode=disabled", str(script)], cwd=root, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for k in range(2)]
    texts = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("a node failed:\n" + "\n".join(t[-2000:] for t in texts))
    [run_dir] = [p for p in outs[0].iterdir() if p.is_dir()]
    if not shared:  # the copy really happened: node 1's ranks' logs are in the head's folder
        assert all((run_dir / "logs" / f"rank-{r}.log").stat().st_size > 0 for r in (2, 3)), "nothing was copied"
    summary = json.loads((run_dir / "summary.json").read_text())
    for out in set(outs):
        subprocess.run(["rm", "-rf", str(out)], check=True)
    return float(summary["step_time_s_median"])


def copy_cost(seconds: int = 20) -> Tuple[float, float]:
    """CPU seconds per second of job of the sender's look-and-batch and of the head's writing of the batches,
    for 2 ranks each printing 1000 lines/s (128 KB/s) and a step record a second."""
    from launcher.backends.mirror_files import Copies, Tails

    with tempfile.TemporaryDirectory() as run_dir, tempfile.TemporaryDirectory() as head_dir:
        for folder in ("logs", "steps", "nodes", "stacks"):
            os.mkdir(os.path.join(run_dir, folder))
        tails, copies, line = Tails(run_dir), Copies(head_dir), b"rank 2 step 10 loss 2.3026 " + b"x" * 100 + b"\n"
        sent = applied = 0.0
        for _ in range(seconds):
            for rank in (2, 3):
                with open(os.path.join(run_dir, "logs", f"rank-{rank}.log"), "ab") as f:
                    f.write(line * 1000)
                with open(os.path.join(run_dir, "steps", f"rank-{rank}.jsonl"), "ab") as f:
                    f.write(b'{"step": 1, "t": 1.0}\n')
            while True:
                t0 = time.process_time()
                blob = tails.batch()
                sent += time.process_time() - t0
                if blob is None:
                    break
                t0 = time.process_time()
                copies.apply(blob)
                applied += time.process_time() - t0
        copied = [Path(d, "logs", "rank-2.log").read_bytes() for d in (run_dir, head_dir)]
        assert copied[0] == copied[1], "the head's copy differs from the node's file"
        return sent / seconds, applied / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    send, apply = copy_cost()
    print(f"copying 2 ranks that print 1000 lines/s each: the sender's look-and-batch {send * 1000:.3f} ms CPU per "
          f"second of job ({send * 100:.3f}% of one core), the head's writes {apply * 1000:.3f} ms "
          f"({apply * 100:.3f}%)", flush=True)
    results = {"shared": [], "copied": []}  # type: dict
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = root / "chatty_ddp.py"
        script.write_text(SCRIPT)
        for k in range(args.rounds):
            for kind in (("shared", "copied") if k % 2 == 0 else ("copied", "shared")):
                results[kind].append(one_job(root, script, kind == "shared", args.steps))
                print(f"round {k + 1} {kind}: step time median {results[kind][-1] * 1000:.2f} ms", flush=True)
    med = {kind: statistics.median(values) for kind, values in results.items()}
    print(f"median step time: shared folder (nothing copied) {med['shared'] * 1000:.2f} ms, "
          f"folder per node (node 1 copied to the head) {med['copied'] * 1000:.2f} ms")
    print(f"ratio copied/shared: {med['copied'] / med['shared']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
