"""The test-only fault injection (trainers.faults.inject): which step of which attempt each action hits, and that the
hooks reach a Ray job's node agents (through its runtime_env) with nothing else of the submitting environment."""

import time

import pytest

from launcher.backends.ray.job import runtime_env
from launcher.config.schema import load_config
from trainers.faults import inject


def test_a_slow_rank_sleeps_from_its_step_on_in_its_attempt_only(monkeypatch):
    monkeypatch.setattr(inject, "SLOW_STEP_S", 0.2)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    spec = "rank=1,step=5,action=slow"

    def took(rank, step, attempt):
        start = time.monotonic()
        inject.maybe_fail(rank, step, attempt, spec)
        return time.monotonic() - start

    assert took(1, 4, 0) < 0.1 and took(0, 9, 0) < 0.1 and took(1, 9, 1) < 0.1
    assert took(1, 5, 0) >= 0.2 and took(1, 900, 0) >= 0.2


def test_a_slurm_requeue_is_a_later_attempt(monkeypatch):
    monkeypatch.setattr(inject, "SLOW_STEP_S", 0.2)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    start = time.monotonic()
    inject.maybe_fail(0, 7, 0, "rank=0,step=5,action=slow")  # the first attempt's slow rank is not slow after a requeue
    assert time.monotonic() - start < 0.1
    with pytest.raises(inject.InjectedFault):
        inject.maybe_fail(0, 7, 0, "rank=0,step=7,attempt=1")


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match="action=crawl"):
        inject.maybe_fail(0, 1, 0, "rank=0,step=1,action=crawl")


def test_a_ray_job_forwards_the_test_hooks_and_no_other_variable_to_its_nodes():
    cfg = load_config(overrides=["ray.ship_code=false"])  # nothing shipped: the runtime_env is the variables alone
    hooks = {"LAUNCHER_INJECT_FAULT": "rank=0,step=20,action=slow", "LAUNCHER_TEST_SAVE_DELAY_S": "3,step=10"}
    submitting = {**hooks, "LAUNCHER_RDZV_SECRET": "s3cret", "HF_TOKEN": "hf_abc", "LAUNCHER_RUN_DIR": "/elsewhere",
                  "PATH": "/usr/bin", "LAUNCHER_TEST_HANG_RANK": ""}
    assert runtime_env(cfg, submitting) == {"env_vars": hooks}
    assert runtime_env(cfg, {"LAUNCHER_RDZV_SECRET": "s3cret", "HF_TOKEN": "hf_abc"}) is None
