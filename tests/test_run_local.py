"""Real multi-process runs of the built-in trainer on CPU with gloo."""

import json
import subprocess
from pathlib import Path
from typing import Tuple

import pytest

from tests.helpers import QUIET, only_run_dir, read_metrics, read_summary, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


STEPS = 40


def ddp_job(workers: int, out: Path, seed: int = 3) -> subprocess.CompletedProcess:
    return run_launcher(["--gpus", str(workers), f"output_dir={out}", f"trainer.steps={STEPS}", "trainer.log_every=5",
                         "data.record_shards=true", "trainer.lr=3e-3", f"seed={seed}", *QUIET], cwd=out)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory) -> Tuple[subprocess.CompletedProcess, Path]:
    """The 2-worker job with seed 3: the run the directory test checks and the same-seed test repeats (one launch,
    ~10 CPU-s, less)."""
    out = tmp_path_factory.mktemp("two-workers")
    return ddp_job(2, out), out


@pytest.mark.parametrize("workers", [2, 4])
def test_ddp_job_trains_and_fills_the_run_directory(tmp_path, workers, request):
    steps = STEPS
    result, out = request.getfixturevalue("two_workers") if workers == 2 else (ddp_job(workers, tmp_path), tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"no CUDA device: running {workers} CPU workers with gloo" in result.stderr
    run_dir = only_run_dir(out)
    assert str(run_dir) in result.stderr.splitlines()[-1]  # the closing line names the run directory

    for name in ("config.yaml", "plan.json", "metrics.jsonl", "summary.json", "logs/launcher.log"):
        assert (run_dir / name).is_file(), name
    for rank in range(workers):
        assert f"rank {rank}/{workers}" in (run_dir / "logs" / f"rank-{rank}.log").read_text()

    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert (summary["world_size"], summary["nodes"], summary["gpus_per_node"]) == (workers, 1, workers)
    assert (summary["backend"], summary["device_type"], summary["strategy"], summary["model"]) == ("gloo", "cpu", "ddp", "mlp")
    assert summary["steps"] == steps and summary["global_batch_size"] == 16 * workers
    assert summary["restarts"] == 0
    assert summary["samples_per_s"] > 0 and summary["step_time_s_median"] > 0
    assert 0 < summary["time_to_first_step_s"] < summary["wall_s"]
    # every replica ends with identical parameters
    assert len(summary["param_checksums"]) == workers
    assert len(set(summary["param_checksums"])) == 1
    assert summary["param_checksum"] == summary["param_checksums"][0]

    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(5, steps + 1, 5))
    assert all({"step", "loss", "samples_per_s", "step_time_s"} <= set(m) for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"] * 0.9, "the loss must fall"
    assert summary["final_loss"] == pytest.approx(metrics[-1]["loss"])

    # the sampler gives every rank a disjoint shard and together they cover the dataset
    shards = [json.loads((run_dir / "shards" / f"rank-{r}.json").read_text()) for r in range(workers)]
    seen = [i for shard in shards for i in shard]
    assert len(seen) == len(set(seen)), "shards overlap"
    assert set(seen) == set(range(1024)), "shards do not cover the dataset"

    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["world_size"] == workers and plan["backend"] == "gloo"


def test_same_seed_same_result_and_seed_matters(tmp_path, two_workers):
    first, out = two_workers  # seed 3
    assert first.returncode == 0, first.stderr
    checksums = [read_summary(only_run_dir(out))["param_checksum"]]
    for seed, sub in ((3, "b"), (4, "c")):
        out = tmp_path / sub
        out.mkdir()
        result = ddp_job(2, out, seed)
        assert result.returncode == 0, result.stderr
        checksums.append(read_summary(only_run_dir(out))["param_checksum"])
    assert checksums[0] == checksums[1]
    assert checksums[0] != checksums[2]


def test_dry_run_prints_config_and_plan_and_starts_nothing(tmp_path):
    result = run_launcher(["--gpus", "3", f"output_dir={tmp_path / 'out'}", "--dry-run", "trainer.steps=7"], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "steps: 7" in result.stdout
    plan = json.loads(result.stdout.split("# launch plan\n", 1)[1])
    assert plan["workers_per_node"] == 3 and plan["backend"] == "gloo"
    assert plan["worker_env"]["OMP_NUM_THREADS"] and plan["command"][0] == "<built-in trainer>"
    assert not (tmp_path / "out").exists()


def test_help_explains_flags_with_examples(tmp_path):
    result = run_launcher(["--help"], cwd=tmp_path, timeout=30)
    assert result.returncode == 0
    for words in ("--nodes", "--gpus", "--config", "--dry-run", "examples:", "train.py --lr 0.1"):
        assert words in result.stdout
