"""A disk that fills, for real (a small tmpfs as output_dir): during a checkpoint save, one line naming the
path and the free space, exit 1, the previous checkpoint intact, no temporary directory, a summary; while
metrics, the goodput record and the W&B offline run are written, the same one line and no traceback from the launcher."""

import subprocess
from pathlib import Path

import pytest

from tests.helpers import only_run_dir, read_summary, run_launcher
from launcher.runtime.checkpoints import list_checkpoints, verify

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# ~0.3M parameters: model + AdamW state ~3.6 MB a checkpoint; the 6 MB disk holds one, not two.
MODEL = ["model.hidden=512", "model.depth=2", "model.in_dim=32", "data.dataset_size=1024", "data.batch_size=16"]


def mounted(tmp_path: Path, size: str):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()}): needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    yield from mounted(tmp_path, "6m")


@pytest.fixture
def disk_for_logs_only(tmp_path):
    yield from mounted(tmp_path, "400k")  # the run directory and its metrics fit; the default model's checkpoint does not


@pytest.fixture
def tiny_disk(tmp_path):
    yield from mounted(tmp_path, "48k")  # the run directory's first files fit; a few steps of metrics do not


def test_a_full_disk_during_a_checkpoint_ends_the_job_in_one_line(small_disk: Path):
    done = run_launcher(["--gpus", "2", f"output_dir={small_disk}", "trainer.steps=40", "checkpoint.every_steps=10",
                         "checkpoint.keep=5", "wandb.mode=disabled", *MODEL], cwd=small_disk.parent, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    named = [line for line in out.splitlines() if line.startswith("error:") and "disk full" in line]
    assert len(named) == 1 and str(small_disk) in named[0] and "free there" in named[0], out
    assert "Traceback" not in out, out  # every rank ends in one line
    run_dir = only_run_dir(small_disk)
    saved = list_checkpoints(run_dir / "checkpoints")
    assert [p.name for p in saved] == ["step-00000010"] and verify(saved[0]) is None, out
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")], out
    summary = read_summary(run_dir)
    assert summary["status"] == "failed" and "disk full" in summary["error"], summary


def test_a_full_disk_while_logging_metrics_ends_the_job_in_one_line(tiny_disk: Path):
    done = run_launcher(["--gpus", "2", f"output_dir={tiny_disk}", "trainer.steps=2000", "wandb.mode=offline"],
                        cwd=tiny_disk.parent, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    run_dir = only_run_dir(tiny_disk)
    said = [line for line in out.splitlines() if "disk full while writing" in line]  # metrics or the goodput record
    assert len(said) == 1 and f"{run_dir}/" in said[0] and "free there" in said[0], out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "rank 0 failed" in errors[0] and "disk is full" in errors[0], out
    launcher_lines = [line for line in out.splitlines() if not line.startswith("[rank")]
    assert not [line for line in launcher_lines if "Traceback" in line or line.startswith("  File ")], out
    assert not [p for p in run_dir.rglob("*.tmp")], "a half-written file was left behind"
    if (run_dir / "summary.json").exists():  # only if it fitted
        assert read_summary(run_dir)["status"] == "failed"
    else:
        assert "summary.json not written" in out, out


def test_a_first_checkpoint_that_does_not_fit_does_not_claim_an_earlier_one(disk_for_logs_only: Path):
    done = run_launcher(["--gpus", "2", f"output_dir={disk_for_logs_only}", "trainer.steps=20", "wandb.mode=disabled",
                         "checkpoint.every_steps=0"],  # the first save is the last step's
                        cwd=disk_for_logs_only.parent, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "disk full while saving checkpoint step 20" in errors[0], out
    assert "no earlier checkpoint was saved" in errors[0] and "intact" not in errors[0], out
    run_dir = only_run_dir(disk_for_logs_only)
    assert list_checkpoints(run_dir / "checkpoints") == [] and not list((run_dir / "checkpoints").iterdir()), out
    assert read_summary(run_dir)["status"] == "failed", out
