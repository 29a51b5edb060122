"""`resume` refuses what it cannot do in one line, with a hint, without touching the run directory."""

import hashlib

import pytest

from tests.helpers import run_launcher

pytestmark = pytest.mark.timeout(120)

RECORDED = """\
nodes: 1
gpus: 2
model:
  hidden: 64
trainer:
  steps: 20
"""


def snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def runs(tmp_path):
    """A run directory with a recorded config but no checkpoint, and a directory that is no run."""
    run = tmp_path / "launcher_runs" / "20260101-000000-abcdef"
    (run / "logs").mkdir(parents=True)
    (run / "config.yaml").write_text(RECORDED)
    (run / "plan.json").write_text("{}")
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "not-a-run" / "notes.txt").write_text("hello")
    return tmp_path


@pytest.mark.parametrize("argv, words", [
    (["resume", "no-such-run"], "no run 'no-such-run': pass a run directory or a run id under launcher_runs/"),
    (["resume", "not-a-run"], "is not a launcher run directory (no config.yaml and plan.json)"),
    (["resume", "20260101-000000-abcdef"], "has no usable checkpoint in"),
    (["resume", "launcher_runs/20260101-000000-abcdef", "model.hidden=128"],
     "model.hidden cannot change on resume (the checkpoint holds a model of the recorded shape)"),
    (["resume", "launcher_runs/20260101-000000-abcdef", "gpus=4"], "gpus cannot change on resume (data positions and RNG states"),
    (["resume", "launcher_runs/20260101-000000-abcdef", "trainer.strategy=fsdp"], "trainer.strategy cannot change on resume"),
    (["resume", "launcher_runs/20260101-000000-abcdef", "trainer.steps"], "is not key=value"),
    (["resume", "launcher_runs/20260101-000000-abcdef", "trainer.steps=lots"], "wrong type for 'trainer.steps'"),
    (["resume"], "the following arguments are required: RUN"),
])
def test_bad_resume_is_one_line_and_changes_nothing(runs, argv, words):
    before = snapshot(runs)
    result = run_launcher(argv, cwd=runs, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(runs) == before


def test_resume_of_a_run_at_its_last_step_says_how_to_go_further(runs):
    from tests.test_checkpoint import save_steps  # a real checkpoint, written by the real code
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        save_steps(runs / "launcher_runs" / "20260101-000000-abcdef" / "checkpoints", [20])
    finally:
        dist.destroy_process_group()
    result = run_launcher(["resume", "20260101-000000-abcdef"], cwd=runs, timeout=60)
    assert result.returncode == 2
    assert "is already at step 20 of trainer.steps=20: to train longer, resume with trainer.steps=40" in result.stderr
