"""A user's own script, unchanged, gets what the built-in trainer gets: steps, step times, samples/s, memory per rank,
time to first step, goodput, metrics.jsonl, one W&B run (offline), and launcher.log() values; and the same script
runs under torchrun, where launcher.log() does nothing.

Real runs of tests/scripts/ddp_loader.py (a DDP tutorial's shape with a DataLoader), checked against what the
script itself counted (its result.json).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import List

import pytest

from tests.helpers import NO_WANDB, REPO, only_run_dir, read_metrics, read_summary, run_bounded, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = REPO / "tests" / "scripts" / "ddp_loader.py"
BATCH, SAMPLES = 16, 1024
ENV = {"OMP_NUM_THREADS": "1"}


def launch(tmp_path: Path, launch_args: List[str], script_args: List[str] = (), expect: int = 0) -> Path:
    """ddp_loader.py SCRIPT_ARGS under the launcher; its run directory (the script's own output in tmp_path/out)."""
    (tmp_path / "out").mkdir(exist_ok=True)
    shutil.copy(SCRIPT, tmp_path / "ddp_loader.py")
    done = run_launcher([*launch_args, f"output_dir={tmp_path / 'runs'}", "ddp_loader.py", "--out",
                         str(tmp_path / "out"), *script_args], cwd=tmp_path, timeout=240, env=ENV)
    assert done.returncode == expect, done.stderr[-3000:]
    return only_run_dir(tmp_path / "runs")


def result(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "out" / "result.json").read_text())


def wandb_runs(folder: Path) -> List[Path]:
    return sorted(folder.glob("wandb/offline-run-*"))


def trainers_figures(run_dir: Path, steps: int) -> None:
    """What the built-in trainer's summary and metrics.jsonl hold, for a 2-rank run of `steps` optimizer steps."""
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == steps
    assert summary["samples_per_s"] > 0
    assert summary["steps_per_s"] > 0 and 0 < summary["step_time_s_median"] < 5
    assert 0 < summary["time_to_first_step_s"] < summary["wall_s"]
    assert 0 < summary["goodput"] <= 1 and summary["badput_s"]["startup"] > 0 and summary["restarts"] == 0
    assert summary["rss_peak_mb"] > 50 and len(summary["step_time_s_per_rank"]) == 2
    rows = read_metrics(run_dir)
    assert rows[-1]["step"] == steps and all(b["step"] >= a["step"] for a, b in zip(rows, rows[1:]))
    timed = [r for r in rows if "steps_per_s" in r]
    assert timed and all(len(r["step_time_s_per_rank"]) == 2 and len(r["rss_mb_per_rank"]) == 2 for r in timed)
    assert all(r["samples_per_s"] > 0 for r in timed) and "step_time_spread" in timed[-1]
    runs = wandb_runs(run_dir)
    assert len(runs) == 1 and runs[0].name.endswith((run_dir / "wandb_run_id").read_text().strip())
    history = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"steps_per_s" in history and b"step_time_s" in history and b"goodput" in history


def test_a_plain_script_on_two_nodes_gets_the_trainers_figures_from_every_rank_and_one_wandb_run(tmp_path):
    """Two nodes of one worker: every rank's figures reach the one record (the single-node run below is checked for
    the same figures)."""
    run_dir = launch(tmp_path, ["--nodes", "2", "--gpus", "1"], ["--epochs", "2"])
    steps = result(tmp_path)["steps"]
    assert steps == 2 * SAMPLES // 2 // BATCH  # 2 epochs of this rank's half, one step per batch
    trainers_figures(run_dir, steps)
    summary = read_summary(run_dir)
    assert summary["global_batch_size"] == 2 * BATCH
    assert summary["final_loss"] is None  # nothing logged a loss: unknown, not made up


def test_launcher_log_values_and_gradient_accumulation_and_the_same_script_under_torchrun(tmp_path):
    run_dir = launch(tmp_path, ["--gpus", "2"], ["--epochs", "2", "--accum", "2", "--launcher-log"])
    mine = result(tmp_path)
    trainers_figures(run_dir, mine["steps"])
    summary = read_summary(run_dir)
    assert summary["steps"] == mine["steps"] == 2 * SAMPLES // 2 // BATCH // 2
    assert summary["final_loss"] == mine["loss"]  # the last loss rank 0 logged, exactly
    assert summary["global_batch_size"] == 2 * BATCH * 2  # two batches per optimizer step on each rank
    rows = read_metrics(run_dir)
    logged = [r for r in rows if "loss" in r]
    assert logged and logged[-1]["loss"] == mine["loss"] and all(r["lr"] == 0.05 for r in logged)
    assert all(len(r["seen_per_rank"]) == 2 for r in rows if "seen_per_rank" in r)
    assert rows[-1]["seen_per_rank"] == [float(mine["steps"] * BATCH * 2)] * 2
    assert b"loss" in next(wandb_runs(run_dir)[0].glob("*.wandb")).read_bytes()
    # unchanged under torchrun: launcher.log() is a no-op there, the training the same
    theirs = tmp_path / "torchrun"
    (theirs / "out").mkdir(parents=True)
    done = run_bounded([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(SCRIPT), "--out",
                        str(theirs / "out"), "--epochs", "2", "--accum", "2", "--launcher-log"], theirs, 200, ENV, "torchrun")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((theirs / "out" / "result.json").read_text()) == mine
    assert not list(theirs.rglob("steps")) and not list(theirs.rglob("metrics.jsonl"))


def test_a_script_with_its_own_wandb_run_gets_the_launchers_figures_there_and_no_second_run(tmp_path):
    run_dir = launch(tmp_path, ["--gpus", "2"], ["--epochs", "2", "--wandb", "--sleep", "0.01"])
    theirs = result(tmp_path)["wandb_id"]
    assert wandb_runs(run_dir) == [] and not (run_dir / "wandb_run_id").exists()
    summary = read_summary(run_dir)
    assert summary["wandb_run"]["id"] == theirs and summary["wandb_run"]["owner"] == "script"
    runs = wandb_runs(tmp_path / "out")
    assert len(runs) == 1 and runs[0].name.endswith(theirs)
    history = next(runs[0].glob("*.wandb")).read_bytes()
    assert b"launcher/steps_per_s" in history and b"loss" in history


@pytest.mark.compat
def test_a_restarted_script_keeps_one_record_and_one_wandb_run(tmp_path):
    run_dir = launch(tmp_path, ["--gpus", "2", "--max-restarts", "1"], ["--epochs", "2", "--fail-rank", "1",
                                                                        "--fail-step", "10", "--launcher-log"])
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1 and summary["status"] == "completed"
    assert summary["steps"] >= 10 + result(tmp_path)["steps"]  # both attempts' steps, the first's up to its failure
    assert summary["badput_s"]["restart"] > 0 and 0 < summary["goodput"] < 1
    rows = read_metrics(run_dir)
    assert {r["attempt"] for r in rows} == {0, 1}
    assert all(b["step"] >= a["step"] for a, b in zip(rows, rows[1:]))  # one growing axis, for W&B
    assert len(wandb_runs(run_dir)) == 1
    assert result(tmp_path)["wandb_service_inherited"] is False  # the launcher's W&B service is not the restarted rank's


def test_metrics_scripts_false_records_nothing(tmp_path):
    run_dir = launch(tmp_path, ["--gpus", "2", "metrics.scripts=false", *NO_WANDB], ["--epochs", "1"])
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] is None
    assert not (run_dir / "steps").exists() and not (run_dir / "metrics.jsonl").exists()


def test_a_script_without_an_optimizer_says_so(tmp_path):
    (tmp_path / "infer.py").write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
                                       "dist.barrier()\ndist.destroy_process_group()\n")
    done = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", *NO_WANDB, "infer.py"], cwd=tmp_path, timeout=120,
                        env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = read_summary(only_run_dir(tmp_path / "runs"))
    assert summary["steps"] is None and summary["goodput"] is None and "optimizer" in summary["metrics_note"]
