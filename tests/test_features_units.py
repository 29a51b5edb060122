"""Training-loop feature switches: config and plan checks, the auto-batch search, gradient clipping."""

import math
import re

import pytest
import torch

from launcher.config.schema import load_config
from launcher.errors import ConfigError
from launcher.plan import Hardware, build_plan
from tests.helpers import run_launcher

CPU = Hardware(cuda_devices=0, cpu_cores=2)
GPU = Hardware(cuda_devices=2, cpu_cores=16)


def plan_for(overrides, hw=CPU):
    return build_plan(load_config(None, overrides), hw, "r", "/tmp/r")


def test_fp16_needs_cuda_and_the_error_names_the_alternative():
    with pytest.raises(ConfigError, match=r"fp16 needs CUDA.*trainer.precision=bf16 or fp32"):
        plan_for(["trainer.precision=fp16"])
    assert plan_for(["trainer.precision=fp16"], GPU).device_type == "cuda"
    assert plan_for(["trainer.precision=bf16"]).device_type == "cpu"  # CPU autocast supports bf16


def test_fp16_on_cpu_is_one_line_and_exit_code_2(tmp_path):
    result = run_launcher(["--gpus", "2", "trainer.precision=fp16", "--dry-run"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert "trainer.precision=bf16" in result.stderr


def test_pin_memory_on_cpu_is_ignored_with_a_note():
    assert "data.pin_memory=true ignored: no CUDA device to copy to" in plan_for(["data.pin_memory=true"]).notices
    assert not any("pin_memory" in n for n in plan_for(["data.pin_memory=true"], GPU).notices)


@pytest.mark.parametrize("overrides, words", [
    (["trainer.precision=fp8"], "trainer.precision=fp8 is not one of"),
    (["trainer.grad_accum_steps=0"], "grad_accum_steps=0 must be at least 1"),
    (["trainer.max_grad_norm=-1"], "max_grad_norm=-1.0 must be positive"),
    (["data.batch_size=big"], "data.batch_size=auto"),
    (["data.num_workers=-2"], "data.num_workers=-2"),
    (["trainer.strategy=pipeline", "trainer.grad_accum_steps=2"], "raise trainer.pipeline.microbatches"),
    (["trainer.strategy=pipeline", "data.batch_size=auto"], "give a number"),
    (["trainer.strategy=tensor", "trainer.compile=true"], "set trainer.compile=false"),
    (["data.dataset_size=64", "trainer.grad_accum_steps=4"], "(32 x 1 workers x 4 accumulation steps): raise data.dataset_size"),
])
def test_bad_feature_values_name_the_fix(overrides, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        load_config(None, overrides)


def test_batch_size_auto_is_accepted_and_numbers_stay_numbers():
    assert load_config(None, ["data.batch_size=auto"]).data.batch_size == "auto"
    assert load_config(None, ["data.batch_size=64"]).data.batch_size == 64


def test_find_batch_size_takes_the_largest_that_fits():
    from launcher.trainers.metrics.memory import find_batch_size

    need = lambda b: 1000 + 100 * b  # noqa: E731  (pure search logic: any monotone cost will do)
    found = find_batch_size(need, cap_bytes=1000 + 100 * 37, largest=512)
    assert found["batch_size"] >= 37 - 37 // 16 and need(found["batch_size"]) <= 1000 + 100 * 37
    assert any(b > found["batch_size"] for b in found["tried"])  # it backed off from a size that did not fit
    assert find_batch_size(need, cap_bytes=10**9, largest=24)["batch_size"] == 24  # bounded by the data
    assert find_batch_size(lambda b: math.inf, cap_bytes=10**9, largest=8)["batch_size"] == 0


def test_clip_grad_norm_matches_torch_on_one_process():
    from launcher.trainers.stepping import clip_grad_norm

    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    b.load_state_dict(a.state_dict())
    x = torch.randn(16, 8)
    for m in (a, b):
        (m(x) ** 2).sum().backward()
    ours = float(clip_grad_norm(a, 0.5))
    reference = float(torch.nn.utils.clip_grad_norm_(b.parameters(), 0.5))
    assert ours == pytest.approx(reference, rel=1e-6)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7)


def test_activation_checkpointing_keeps_parameter_names_and_outputs():
    from launcher.trainers.models import GPT
    from launcher.trainers.transforms import apply_activation_checkpointing

    torch.manual_seed(0)
    plain = GPT(32, 32, 2, 4, 8)
    checkpointed = GPT(32, 32, 2, 4, 8)
    checkpointed.load_state_dict(plain.state_dict())
    apply_activation_checkpointing(checkpointed)
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in checkpointed.named_parameters()]
    idx = torch.randint(0, 32, (4, 8))
    assert torch.allclose(plain(idx), checkpointed(idx), atol=1e-6)
