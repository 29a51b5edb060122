"""GPU benchmark: the built-in trainer on one CUDA device against the same job on this machine's CPU.

    python bench/gpu.py [--quick] [--json OUT.json]

Every row is one `python -m launcher --gpus 1` run. CPU rows hide CUDA (CUDA_VISIBLE_DEVICES="")
and are the baseline of the ratio column: speed-up = GPU samples/s / CPU samples/s for the same
model, batch and strategy, both measured in this invocation. MFU and CUDA memory come from the
run's own summary.json (FLOPs counted by FlopCounterMode over the device's datasheet peak).
Without CUDA the script says so and exits 0 having run nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent

GPT_SMALL = ["model.name=gpt"]  # defaults: width 512, 4 blocks, 32 tokens, ~12.7M parameters
GPT_LARGE = ["model.name=gpt", "model.hidden=1024", "model.depth=12", "model.heads=16", "model.seq_len=512",
             "model.vocab=32000"]
# (name, model, batch, GPU extra, CPU steps or 0 for no CPU baseline)
CASES = (
    ("mlp_default_fp32", [], 256, ["trainer.precision=fp32"], 200),
    ("gpt_small_fp32", GPT_SMALL, 32, ["trainer.precision=fp32"], 20),
    ("gpt_small_bf16", GPT_SMALL, 32, ["trainer.precision=bf16"], 20),
    ("gpt_large_bf16_ddp", GPT_LARGE, 16, ["trainer.precision=bf16"], 3),
    ("gpt_large_bf16_fsdp", GPT_LARGE, 16, ["trainer.precision=bf16", "trainer.strategy=fsdp"], 0),
    ("gpt_large_bf16_compile", GPT_LARGE, 16, ["trainer.precision=bf16", "trainer.compile=true"], 0),
    ("gpt_large_bf16_actckpt", GPT_LARGE, 16, ["trainer.precision=bf16", "trainer.activation_checkpointing=true"], 0),
    ("cnn_default_bf16", ["model.name=cnn"], 256, ["trainer.precision=bf16"], 20),
)
KEEP = ("samples_per_s", "tokens_per_s", "step_time_s_median", "mfu_percent", "mfu_note", "flops_per_step", "precision", "final_loss",
        "cuda_peak_allocated_bytes_per_rank", "cuda_reserved_bytes_per_rank", "peak_memory_bytes_per_rank",
        "time_to_first_step_s", "compile_time_s", "wall_s", "comm_share")


def run(out: Path, model: List[str], batch: int, steps: int, extra: List[str], cpu: bool) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_"))}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "launcher", "--gpus", "1", f"output_dir={out}", "wandb.mode=disabled",
           f"trainer.steps={steps}", f"trainer.log_every={max(1, steps // 4)}", f"data.batch_size={batch}",
           f"data.dataset_size={max(8192, batch * 64)}", "checkpoint.every_seconds=0", "checkpoint.every_steps=0", *model, *extra]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["(no stderr)"])[-1][:300], "rc": done.returncode}
    summary = json.loads(next(out.glob("*/summary.json")).read_text())
    return {k: summary[k] for k in KEEP if k in summary}


def gib(values: Optional[List[int]]) -> str:
    return f"{max(values) / 2**30:.2f}" if values else "-"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer GPU steps")
    parser.add_argument("--json", type=Path, default=BENCH / "gpu_results.json")
    parser.add_argument("--only", default="", help="comma-separated case names")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench/gpu.py: no CUDA device here; nothing to measure")
        return 0
    gpu_steps = 60 if args.quick else 200
    wanted = set(filter(None, args.only.split(",")))
    rows: List[Dict[str, Any]] = []
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cpus": os.cpu_count(), "rows": rows}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for i, (name, model, batch, extra, cpu_steps) in enumerate(CASES):
            if wanted and name not in wanted:
                continue
            row: Dict[str, Any] = {"name": name, "batch": batch}
            row["gpu"] = run(Path(tmp) / f"g{i}", model, batch, gpu_steps, extra, cpu=False)
            if cpu_steps:
                cpu_extra = [e for e in extra if not e.startswith("trainer.precision")] + ["trainer.precision=fp32"]
                row["cpu"] = run(Path(tmp) / f"c{i}", model, batch, cpu_steps, cpu_extra, cpu=True)
            rows.append(row)
            print(json.dumps(row), flush=True)
            # written after every case: a check stopped at its time limit keeps the cases that finished
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{result['device']}, torch {result['torch']}, {result['cpus']} CPU cores; CPU rows fp32, all cores")
    print(f"{'case':26} {'GPU samples/s':>13} {'CPU samples/s':>13} {'speed-up':>9} {'MFU %':>7} {'peak GiB':>9} {'ms/step':>8}")
    for row in rows:
        g, c = row["gpu"], row.get("cpu", {})
        if "error" in g:
            print(f"{row['name']:26} GPU run failed: {g['error']}")
            continue
        speed = f"{g['samples_per_s'] / c['samples_per_s']:.1f}x" if c.get("samples_per_s") else "-"
        mfu = f"{g['mfu_percent']:.1f}" if g.get("mfu_percent") is not None else "-"
        print(f"{row['name']:26} {g['samples_per_s']:13.1f} {c.get('samples_per_s', 0):13.1f} {speed:>9} {mfu:>7} "
              f"{gib(g.get('cuda_peak_allocated_bytes_per_rank')):>9} {1000 * g['step_time_s_median']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
