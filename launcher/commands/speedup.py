"""`doctor --speedup`: the same small model, the same number of steps, on the CPU and on each visible
accelerator; prints each device's throughput and its speed-up over the CPU.

Single process, no process group: it measures the device, not the launcher. Dispatch from the
doctor command with ``return run_speedup(argv)`` when ``--speedup`` is given.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Dict, List, Optional

import torch

from launcher.trainers.models import MLP, loss_fn

WARMUP_STEPS = 5  # first steps pay for allocation, kernel selection and cuDNN/cuBLAS autotuning


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m launcher doctor --speedup",
                                description="Time the same small model on the CPU and on each accelerator.")
    p.add_argument("--speedup", action="store_true", help="(the switch that selects this check)")
    p.add_argument("--steps", type=int, default=30, help="timed training steps per device (default 30)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per step (default 256)")
    p.add_argument("--hidden", type=int, default=1024, help="MLP width (default 1024: about 3.4M parameters)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def visible_devices() -> List[str]:
    """The CPU first, then every accelerator torch can see."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append("mps")
    return devices


def time_device(device_name: str, steps: int, batch_size: int, hidden: int) -> Dict[str, Any]:
    """Train an MLP for WARMUP_STEPS + steps on one device; the timed part is the last `steps`."""
    torch.manual_seed(0)
    device = torch.device(device_name)
    model = MLP(256, hidden, 4, 10).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(batch_size, 256, device=device)
    y = torch.randint(0, 10, (batch_size,), device=device)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    for _ in range(WARMUP_STEPS):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    seconds = time.perf_counter() - t0
    return {"device": device_name, "name": _device_name(device), "steps": steps, "seconds": seconds,
            "samples_per_s": steps * batch_size / seconds}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _device_name(device: Any) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"CPU, {torch.get_num_threads()} threads"
    return device.type


def run_speedup(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv or [])
    if args.steps < 1 or args.batch_size < 1 or args.hidden < 1:
        print("error: --steps, --batch-size and --hidden must be at least 1", flush=True)
        return 2
    devices = visible_devices()
    results = [time_device(d, args.steps, args.batch_size, args.hidden) for d in devices]
    cpu = results[0]["samples_per_s"]
    for r in results:
        r["speedup_vs_cpu"] = r["samples_per_s"] / cpu
    if args.json:
        print(json.dumps({"results": results, "accelerators": len(results) - 1}))
        return 0
    print(f"same MLP (hidden {args.hidden}, batch {args.batch_size}), {args.steps} timed steps after {WARMUP_STEPS} warm-up:")
    for r in results:
        print(f"  {r['device']:<8} {r['name']:<32} {r['samples_per_s']:>12,.0f} samples/s   {r['speedup_vs_cpu']:6.1f}x CPU")
    if len(results) == 1:
        print("no accelerator visible (torch.cuda.is_available() is False): the CPU figure alone; "
              "on a GPU machine install a CUDA build of torch to compare")
    return 0


def main(argv: List[str]) -> int:
    """Stand-alone entry point, the same as `doctor --speedup`."""
    return run_speedup(argv)


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
