"""A resumed job ends bitwise where the uninterrupted one does at 3 and 4 ranks, not only at 2.

With two ranks every all-reduce adds a + b, which is the same float either way round; from three
ranks on, the order of the additions changes the result, and DDP's first step of each attempt
used to reduce in a different bucket layout than the steps after it (trainers.stepping.
settle_gradient_buckets). The drift began at 1e-8 and grew chaotically, so the checks here are
equality, of every rank's checksum and of the final loss. SLURM requeues at 4 ranks are checked
in tests/test_slurm_requeue.py.
"""

import pytest

from tests.helpers import QUIET, only_run_dir, read_summary, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 40


def job(world):
    return ["--gpus", str(world), f"trainer.steps={STEPS}", "checkpoint.every_steps=8", "trainer.log_every=8", *QUIET]


@pytest.fixture(scope="module", params=[3, 4], ids=["3-ranks", "4-ranks"])
def reference(request, tmp_path_factory):
    world = request.param
    out = tmp_path_factory.mktemp(f"reference{world}")
    result = run_launcher([*job(world), f"output_dir={out}", "run_id=reference"], cwd=out, timeout=240)
    assert result.returncode == 0, result.stderr
    return world, read_summary(out / "reference")


def assert_bitwise_the_same(summary, reference):
    world, expected = reference
    assert summary["status"] == "completed" and summary["steps"] == STEPS and summary["world_size"] == world
    assert summary["param_checksums"] == expected["param_checksums"]
    assert summary["final_loss"] == expected["final_loss"]


@pytest.fixture(scope="module")
def restarted_then_resumed(reference, tmp_path_factory):
    """One job of 20 steps whose last rank fails at step 13 and is restarted from step 8, then `resume`d to STEPS:
    both tests' interruptions (each starts an attempt, whose first step once drifted) in two launches, not three.
    Its first launch's summary is read before the resume; a drift at either shows in the final weights."""
    world, _ = reference
    tmp = tmp_path_factory.mktemp(f"restarted-then-resumed{world}")
    first = run_launcher([*job(world), f"output_dir={tmp}", "trainer.steps=20", "--max-restarts", "1"], cwd=tmp,
                         timeout=240, env={"LAUNCHER_INJECT_FAULT": f"rank={world - 1},step=13"})
    assert first.returncode == 0, first.stderr
    run_dir = only_run_dir(tmp)
    restarted = read_summary(run_dir)
    resumed = run_launcher(["resume", str(run_dir), f"trainer.steps={STEPS}"], cwd=tmp, timeout=240)
    return restarted, resumed, run_dir


def test_a_restarted_job_ends_with_the_uninterrupted_parameters(reference, restarted_then_resumed):
    restarted, resumed, run_dir = restarted_then_resumed
    assert restarted["status"] == "completed" and restarted["steps"] == 20, restarted
    assert restarted["restarts"] == 1 and restarted["resumed_from_step"] == 8, restarted
    assert resumed.returncode == 0, resumed.stderr
    assert_bitwise_the_same(read_summary(run_dir), reference)


def test_a_resumed_run_ends_with_the_uninterrupted_parameters(reference, restarted_then_resumed):
    _, resumed, run_dir = restarted_then_resumed
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 20
    assert_bitwise_the_same(summary, reference)
