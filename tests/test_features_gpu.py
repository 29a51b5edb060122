"""GPU-only behaviour of the training-loop switches: skipped without CUDA."""

import pytest
import torch

from tests.helpers import only_run_dir, read_metrics, read_summary, run_launcher
from launcher.trainers.metrics.mfu import peak_flops

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.is_available() is False)"),
]

QUICK = ["model.hidden=64", "model.depth=2", "model.in_dim=32", "data.dataset_size=1024", "data.batch_size=16",
         "trainer.steps=20", "trainer.log_every=5"]


def train(tmp_path, *overrides):
    result = run_launcher(["--gpus", "1", f"output_dir={tmp_path}", *overrides], cwd=tmp_path, timeout=240)
    return result, tmp_path


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_fp16_uses_a_gradient_scaler_on_cuda(tmp_path, strategy):
    result, out = train(tmp_path, *QUICK, "trainer.precision=fp16", f"trainer.strategy={strategy}")
    assert result.returncode == 0, result.stderr[-3000:]
    summary, metrics = read_summary(only_run_dir(out)), read_metrics(only_run_dir(out))
    assert summary["precision"] == "fp16" and summary["activation_dtype"] == "float16"
    assert summary["loss_scale"] and all("loss_scale" in m for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]


def test_auto_precision_pinned_memory_and_cuda_memory_figures(tmp_path):
    result, out = train(tmp_path, *QUICK, "data.num_workers=1")
    assert result.returncode == 0, result.stderr[-3000:]
    summary, metrics = read_summary(only_run_dir(out)), read_metrics(only_run_dir(out))
    assert summary["precision"] == ("bf16" if torch.cuda.is_bf16_supported() else "fp32")
    assert summary["pin_memory"] is True and summary["loader_num_workers"] == 1
    # MFU against the peak of the precision the matmuls ran in (bf16 runs were once set against fp32's)
    assert 0 < summary["mfu_percent"] <= 100, summary.get("mfu_note")
    expected = peak_flops(torch.cuda.get_device_name(0), "bf16" if summary["precision"] == "bf16" else "fp32")
    assert expected is None or summary["peak_flops"] == expected
    for key in ("cuda_allocated_bytes", "cuda_reserved_bytes", "cuda_peak_allocated_bytes", "rss_bytes"):
        assert all(m[key] > 0 for m in metrics), key
        assert summary[f"{key}_per_rank"][0] > 0, key


def test_cuda_out_of_memory_names_the_rank_the_memory_and_the_fix(tmp_path):
    # tiny weights (8 inputs, 10 classes) but one activation of 8192 x 2**24 values: 275 GB even in bf16
    result, _ = train(tmp_path, "model.depth=1", f"model.hidden={2**24}", "model.in_dim=8", "data.dataset_size=8192",
                      "data.batch_size=8192", "trainer.steps=2")
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]  # the last line: nothing (e.g. a resource-tracker warning) after it
    assert "rank 0" in line and "ran out of CUDA memory" in line
    assert "GiB allocated" in line and "data.batch_size" in line and "trainer.strategy=fsdp" in line


def test_async_checkpoints_of_cuda_state_resume_a_killed_rank_to_the_uninterrupted_weights(tmp_path):
    """The background writer stages CUDA tensors to host memory; a restart from it ends where a run never stopped does."""
    job = [*QUICK, "trainer.steps=20", "checkpoint.every_steps=5", "checkpoint.async_save=true", "wandb.mode=disabled"]
    (tmp_path / "reference").mkdir()
    reference, out = train(tmp_path / "reference", *job)
    assert reference.returncode == 0, reference.stderr[-3000:]
    result = run_launcher(["--gpus", "1", f"output_dir={tmp_path / 'restarted'}", "--max-restarts", "1", *job],
                          cwd=tmp_path, timeout=240, env={"LAUNCHER_INJECT_FAULT": "rank=0,step=13"})
    assert result.returncode == 0, result.stderr[-3000:]
    summary, uninterrupted = read_summary(only_run_dir(tmp_path / "restarted")), read_summary(only_run_dir(out))
    assert summary["restarts"] == 1 and summary["resumed_from_step"] in (5, 10) and summary["checkpoint_async"] is True
    assert summary["param_checksum"] == uninterrupted["param_checksum"]  # (10's write may still be in flight at 13)
