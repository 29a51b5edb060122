"""Does torch's FlopCounterMode see the backward pass of our training step on this device?

    python bench/mfu_probe.py          (CUDA if present, else CPU)

MFU (trainers/metrics/mfu.py) counts one step's forward+backward FLOPs with FlopCounterMode. Backward is
about twice forward for a transformer, so a count that is ~1x forward missed the backward. Each case prints
fwd+bwd / forward; ~3.0 is right. Cases add what the trainer does around the step one at a time: DDP, the
extra backward outside the count that settles DDP's buckets before the first step (trainers/stepping.py),
bf16 autocast.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def count(fn) -> int:
    with FlopCounterMode(display=False) as mode:
        fn()
    return int(mode.get_total_flops())


def main() -> int:
    from launcher.trainers.models import GPT, loss_fn

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29581")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    x = torch.randint(0, 1000, (4, 128), device=device)
    y = torch.randint(0, 1000, (4, 128), device=device)

    def model(ddp: bool):
        m = GPT(1000, 256, 2, 4, 128).to(device)
        return torch.nn.parallel.DistributedDataParallel(m) if ddp else m

    def step(m, autocast=False):
        def run():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = loss_fn(m(x), y)
            loss.backward()
        return run

    def forward(m):
        def run():
            with torch.no_grad():
                m(x)
        return run

    plain = model(False)
    fwd = count(forward(plain))
    cases = {}
    cases["plain, first backward"] = count(step(model(False)))
    m = model(False)
    step(m)()
    cases["plain, after a backward outside"] = count(step(m))
    cases["DDP, first backward"] = count(step(model(True)))
    m = model(True)
    step(m)()
    cases["DDP, after a backward outside (settle)"] = count(step(m))
    m = model(True)
    step(m, True)()
    cases["DDP + bf16 autocast, after settle"] = count(step(m, True))
    from launcher.trainers.precision import Precision
    from launcher.trainers.stepping import settle_gradient_buckets

    m = model(True)
    precision = Precision("bf16", device, "ddp")
    settle_gradient_buckets(m, (x, y), device, precision)
    cases["DDP + bf16, the trainer's own settle"] = count(step(m, True))
    print(f"device {device} torch {torch.__version__}; forward {fwd:,} FLOPs")
    for name, flops in cases.items():
        print(f"{name:42} {flops / fwd:5.2f} x forward")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
