"""Where the trainer's per-step time goes beyond a hand-written DDP step, in one job.

    python -m torch.distributed.run --nproc-per-node 2 bench/step_costs.py [BLOCKS] [STEPS]

Every variant trains the same DDP MLP on the same batch size; blocks of STEPS steps alternate
between variants (rotating the order each round) and each variant's median per-step time is
printed as a ratio to the hand-written step's, in the same processes. Each row adds one of the
trainer's per-step pieces, so a regression shows up as the piece that got slower.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from launcher.trainers.checkpoint.checkpointer import Checkpointer  # noqa: E402
from launcher.trainers.data import grouped_batches, teacher_dataset  # noqa: E402
from launcher.trainers.metrics.steps import StepMeter, attach_comm_timer, window_metrics  # noqa: E402
from launcher.trainers.models import MLP  # noqa: E402
from launcher.trainers.precision import Precision  # noqa: E402
from launcher.trainers.stepping import optimizer_step  # noqa: E402

BATCH = 32


class _Cfg:
    """The few config fields Checkpointer reads (checkpointing off: only its per-step agreement)."""

    class checkpoint:  # noqa: N801
        every_steps, every_seconds, keep, dir = 0, 300.0, 2, None

    output_dir = None


def main() -> None:
    args = [int(a) for a in sys.argv[1:3]]
    blocks, steps = (args + [8, 100][len(args):])[:2]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = teacher_dataset(8192, 256, 10, 0)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, drop_last=True)
    plain = DDP(MLP(256, 512, 4, 10))
    hooked = DDP(MLP(256, 512, 4, 10))
    comm = attach_comm_timer(hooked, world)
    device = torch.device("cpu")
    precision = Precision("fp32", device, "ddp")

    def batches():  # endless
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            yield from grouped_batches(loader, 1)
            epoch += 1

    stream = batches()

    def handwritten(model: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[], None]:
        def step() -> None:
            (x, y), _ = next(stream)[0]
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return step

    def trainer_step(model: torch.nn.Module, opt: torch.optim.Optimizer, meter: StepMeter = None,
                     extras: List[Callable[[int], None]] = ()) -> Callable[[], None]:
        count = iter(range(1, 10**9))

        def step() -> None:
            group = next(stream)
            if meter is not None:
                meter.start(group[0][0][0], BATCH)
            optimizer_step(model, opt, group, device, precision, 0.0, meter)
            i = next(count)
            if meter is not None:
                meter.end()
            for extra in extras:
                extra(i)
        return step

    opt_plain = torch.optim.AdamW(plain.parameters(), lr=1e-3)
    opt_hooked = torch.optim.AdamW(hooked.parameters(), lr=1e-3)
    meter = StepMeter(device, world, True, comm)
    checkpointer = Checkpointer(_Cfg, None, rank, world, device, plain, opt_plain)

    def agree(i: int) -> None:
        checkpointer.after_step(i, 0, i, lambda: 0.0, last=False)

    def log_window(i: int) -> None:
        if i % 10 == 0:
            rows = meter.gather(0.0)
            window_metrics(rows, 0.2, 1.0, meter)

    variants: Dict[str, Callable[[], None]] = {
        "handwritten": handwritten(plain, opt_plain),
        "optimizer_step": trainer_step(plain, opt_plain),
        "+stop_agreement": trainer_step(plain, opt_plain, extras=[agree]),
        "+comm_timing": trainer_step(hooked, opt_hooked),
        "+step_meter": trainer_step(hooked, opt_hooked, meter),
        "+log_window/10": trainer_step(hooked, opt_hooked, meter, [log_window]),
        "all_of_the_above": trainer_step(hooked, opt_hooked, meter, [agree, log_window]),
    }
    for run in variants.values():  # warm up every path (DDP bucket rebuild, allocator)
        for _ in range(5):
            run()
    names = list(variants)
    times: Dict[str, List[float]] = {name: [] for name in names}
    for b in range(blocks):
        for name in names[b % len(names):] + names[:b % len(names)]:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                variants[name]()
            times[name].append((time.perf_counter() - t0) / steps)
    if rank == 0:
        base = statistics.median(times["handwritten"])
        rows = {name: {"step_ms": 1000 * statistics.median(v), "ratio": statistics.median(v) / base} for name, v in times.items()}
        for name, row in rows.items():
            print(f"{name:18s} {row['step_ms']:7.3f} ms  x{row['ratio']:.3f}")
        print(json.dumps(rows))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
