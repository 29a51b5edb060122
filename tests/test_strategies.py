"""Every parallelism strategy computes the same training run, and `compare` puts them side by side.

Real multi-process CPU runs with gloo. One `compare` invocation runs all six strategies at 2
workers (it is also what a user runs); its per-strategy metrics are checked against a
single-process reference with the same seed and the same global batch. Every run clips its
gradients (trainer.max_grad_norm, below every step's norm): the norm each strategy logs is the
one a single process computes, whatever the shards and stages.

Tolerance: losses agree to a relative 1e-5 per step, gradient norms to 1e-4. Strategies sum the
same float32 numbers in a different order (all-reduce across ranks, sharded matmuls in tensor
parallel, microbatches in the pipeline, reduce-scatter in FSDP), which changes the last bits
(about 1e-7 relative per operation; measured up to 2.4e-7 for losses and 1e-7 for norms after the
10 steps here; 1.5e-7 for losses after 20 steps without clipping); Adam normalises updates, so such differences do not
grow much. A real bug (wrong shard, a microbatch counted twice) moves the loss by far more than
1e-5. Adam's update hardly changes when every gradient is scaled alike, so a bug that only scales
them (a missing average) shows in the norm rather than in the loss.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from launcher.commands.compare import run_strategy
from launcher.config.schema import STRATEGIES, load_config
from launcher.errors import ConfigError
from tests.helpers import only_run_dir, read_metrics, read_summary, run_launcher

# compare runs 6 strategies one after another: 1-2 minutes alone, up to 7 beside the suite's other xdist workers
pytestmark = pytest.mark.timeout(600)

# 10 steps: FSDP's and tensor parallel's workers cost ~0.1 CPU-s a step each here (20 steps cost 4.5 CPU-s more)
STEPS = 10
CLIP = 0.2  # the single process's norm is 0.5-0.7 at every step: clipping scales every step's gradients
GPT = ["model.name=gpt", "model.hidden=32", "model.depth=2", "model.heads=4", "model.seq_len=16",
       "data.dataset_size=1024", f"trainer.steps={STEPS}", "trainer.log_every=1", "trainer.lr=3e-3",
       f"trainer.max_grad_norm={CLIP}",
       "wandb.mode=disabled"]  # W&B is tests/test_metrics_runs.py's (tests/helpers.py QUIET)
GLOBAL_BATCH = 16
RTOL = 1e-5
NORM_RTOL = 1e-4


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Dict[str, Any]:
    """One process, the whole global batch: what every strategy must reproduce."""
    out = tmp_path_factory.mktemp("reference")
    result = run_launcher(["--gpus", "1", f"output_dir={out}", f"data.batch_size={GLOBAL_BATCH}", *GPT], cwd=out)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(out)
    metrics = read_metrics(run_dir)
    return {"losses": [m["loss"] for m in metrics], "grad_norms": [m["grad_norm"] for m in metrics],
            "summary": read_summary(run_dir)}


def strategies_read(session: pytest.Session) -> List[str]:
    """The strategies the selected tests read from `compared`: every one, unless only per-strategy tests read it (the
    compatibility layer, `-m compat`, selects ddp and fsdp: two runs, not six)."""
    readers = [item for item in session.items if "compared" in getattr(item, "fixturenames", ())]
    params = [getattr(item, "callspec", None) for item in readers]
    if not readers or any(p is None or "strategy" not in p.params for p in params):
        return list(STRATEGIES)
    return [s for s in STRATEGIES if s in {p.params["strategy"] for p in params}]


@pytest.fixture(scope="module")
def compared(tmp_path_factory, request) -> Dict[str, Any]:
    out = tmp_path_factory.mktemp("compare")
    result = run_launcher(["compare", "--gpus", "2", f"output_dir={out}", f"data.batch_size={GLOBAL_BATCH // 2}", *GPT,
                           f"strategies={','.join(strategies_read(request.session))}"], cwd=out, timeout=560)
    assert result.returncode == 0, result.stderr
    compare_dir = only_run_dir(out)
    report = json.loads((compare_dir / "compare.json").read_text())
    return {"dir": compare_dir, "report": report, "rows": {r["strategy"]: r for r in report["rows"]}, "stdout": result.stdout}


def assert_same_run(run_dir: Path, reference: Dict[str, Any]) -> Dict[str, Any]:
    metrics = read_metrics(run_dir)
    losses = [m["loss"] for m in metrics]
    assert len(losses) == STEPS
    assert losses == pytest.approx(reference["losses"], rel=RTOL)
    assert losses[-1] < losses[0], "the loss must fall"
    # the norm before clipping, the one clipping scales by: the single process's (shards combined, stages summed)
    assert [m["grad_norm"] for m in metrics] == pytest.approx(reference["grad_norms"], rel=NORM_RTOL)
    summary = read_summary(run_dir)
    assert summary["global_batch_size"] == GLOBAL_BATCH
    for group in summary["replica_groups"]:  # replicas (the same stage in every pipeline) are identical
        assert len({summary["param_checksums"][r] for r in group}) == 1, group
    return summary


@pytest.mark.parametrize("strategy", [pytest.param(s, marks=pytest.mark.compat) if s in ("ddp", "fsdp") else s
                                      for s in STRATEGIES])
def test_every_strategy_at_2_workers_matches_the_single_process_reference(compared, reference, strategy):
    row = compared["rows"][strategy]
    assert row["status"] == "completed", row.get("error")
    summary = assert_same_run(Path(row["run_dir"]), reference)
    assert summary["strategy"] == strategy and summary["model"] == "gpt"
    if strategy != "pipeline":  # every rank holds (or gathers) the whole model: it ends where the reference ends
        assert summary["param_checksum"] == pytest.approx(reference["summary"]["param_checksum"], rel=RTOL)
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 16)


def test_clipped_gradient_norm_is_the_single_process_norm_under_fsdp_and_tensor(compared, reference):
    """Sharded gradients (DTensors) clip by the norm of the full tensors: each strategy's norms and losses are the
    single process's at every step (assert_same_run holds every run to the norms; these two shard the gradients)."""
    assert reference["summary"]["max_grad_norm"] == CLIP and min(reference["grad_norms"]) > CLIP  # clipped every step
    for strategy in ("fsdp", "tensor"):
        run_dir = Path(compared["rows"][strategy]["run_dir"])
        norms = [m["grad_norm"] for m in read_metrics(run_dir)]
        assert norms == pytest.approx(reference["grad_norms"], rel=NORM_RTOL), strategy
        summary = read_summary(run_dir)
        assert summary["max_grad_norm"] == CLIP, strategy
        assert summary["final_loss"] == pytest.approx(reference["summary"]["final_loss"], rel=NORM_RTOL), strategy


def test_pipeline_times_data_parallel_at_4_workers_matches(tmp_path, reference):
    result = run_launcher(["--gpus", "4", f"output_dir={tmp_path}", "trainer.strategy=pipeline", "trainer.pipeline.stages=2",
                           "trainer.pipeline.schedule=1f1b", "trainer.pipeline.microbatches=2",
                           f"data.batch_size={GLOBAL_BATCH // 4}", *GPT], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = assert_same_run(only_run_dir(tmp_path), reference)
    assert summary["replica_groups"] == [[0, 2], [1, 3]]
    assert "2 stages x 2 data-parallel pipelines, 1f1b" in summary["strategy_note"]
    # the two stages hold different layers
    assert summary["param_checksums"][0] != summary["param_checksums"][1]


def test_compare_writes_json_markdown_and_chart_with_a_row_per_strategy(compared):
    compare_dir, rows = compared["dir"], compared["rows"]
    assert list(rows) == list(STRATEGIES)
    for row in rows.values():
        assert row["samples_per_s"] > 0 and row["step_time_s_median"] > 0 and row["final_loss"] > 0
        assert len(row["peak_memory_bytes_per_rank"]) == row["processes"]
        assert all(b > 0 for b in row["peak_memory_bytes_per_rank"]) and row["peak_memory_kind"] == "process_rss"
    table = (compare_dir / "compare.md").read_text()
    printed = [line.split()[:2] for line in compared["stdout"].splitlines()]  # the console's table: columns
    for strategy in STRATEGIES:
        assert f"| {strategy} | completed |" in table and [strategy, "completed"] in printed
    assert (compare_dir / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_shows_what_sharding_does_to_per_rank_state(compared):
    rows = compared["rows"]
    ddp, fsdp, tensor = rows["ddp"], rows["fsdp"], rows["tensor"]
    for key in ("param_bytes_per_rank", "grad_bytes_per_rank", "optimizer_bytes_per_rank"):
        assert ddp[key][0] == ddp[key][1] > 0
        # FSDP over 2 ranks holds half of each (up to padding of uneven shards)
        assert all(0.45 * ddp[key][0] <= b <= 0.55 * ddp[key][0] for b in fsdp[key]), (key, fsdp[key], ddp[key])
        assert all(b < ddp[key][0] for b in tensor[key])
    assert sum(rows["pipeline"]["param_bytes_per_rank"]) == ddp["param_bytes_per_rank"][0]  # stages split the model


def test_comm_share_is_measured_for_ddp_and_not_guessed_for_the_others(compared):
    rows = compared["rows"]
    assert 0 <= rows["ddp"]["comm_share"] < 1
    assert all(row["comm_share"] is None for name, row in rows.items() if name != "ddp")
    assert "| n/m |" in (compared["dir"] / "compare.md").read_text()


def test_single_process_strategies_say_they_ran_on_the_cpu(compared):
    for strategy in ("dp", "naive_mp"):
        row = compared["rows"][strategy]
        assert row["processes"] == 1 and row["world_size"] == 1
        assert "1 process per node" in row["strategy_note"] and "CPU" in row["strategy_note"]
        assert row["strategy_note"] in (compared["dir"] / "compare.md").read_text()
        log = (Path(row["run_dir"]) / "logs" / "launcher.log").read_text()
        assert f"trainer.strategy={strategy} runs 1 process per node" in log


@pytest.mark.parametrize("model,strategy", [("cnn", "tensor"), ("mlp", "pipeline")])
def test_other_models_train_under_sharded_strategies(tmp_path, model, strategy):
    result = run_launcher(["--gpus", "2", f"output_dir={tmp_path}", f"model.name={model}", f"trainer.strategy={strategy}",
                           "model.hidden=32", "model.depth=2", "model.in_dim=16", "model.channels=8", "model.image_size=8",
                           "data.dataset_size=512", "data.batch_size=16", "trainer.steps=30", "trainer.log_every=10",
                           "trainer.lr=3e-3", "wandb.mode=disabled"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    metrics = read_metrics(only_run_dir(tmp_path))
    assert metrics[-1]["loss"] < metrics[0]["loss"]


UNSUPPORTED = [
    (["trainer.strategy=pipeline", "model.depth=2", "--gpus=4"], "a pipeline of 4 stages needs at least 4 layers but model.depth=2"),
    (["trainer.strategy=tensor", "model.hidden=30", "--gpus=4"], "splits model.hidden=30 over 4 workers, which does not divide"),
    (["trainer.strategy=tensor", "model.name=gpt", "model.heads=2", "--gpus=4"], "splits model.heads=2 over 4 workers"),
    (["trainer.strategy=dp", "--nodes=2"], "trainer.strategy=dp runs one process per node and cannot span nodes"),
    (["trainer.strategy=pipeline", "trainer.pipeline.microbatches=3", "--gpus=2"], "does not split into trainer.pipeline.microbatches=3"),
    (["trainer.pipeline.schedule=zigzag"], "trainer.pipeline.schedule=zigzag is not one of"),
]


def _overrides(args: List[str]) -> List[str]:
    return [a.replace("--gpus=", "gpus=").replace("--nodes=", "nodes=") for a in args]


@pytest.mark.parametrize("args,message", UNSUPPORTED)
def test_unsupported_combinations_are_rejected_with_the_fix(args, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, _overrides(args))


def test_unsupported_combination_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    args, message = UNSUPPORTED[0]
    result = run_launcher([*args, f"output_dir={tmp_path / 'out'}"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_compare_marks_a_strategy_unsupported_without_running_it(tmp_path):
    row = run_strategy("tensor", None, ["model.hidden=30", "gpus=4"], tmp_path)
    assert row["status"] == "unsupported" and "does not divide" in row["error"]
    assert not (tmp_path / "runs").exists()


def test_dp_plan_starts_one_worker_per_node(tmp_path):
    result = run_launcher(["--gpus", "4", "trainer.strategy=dp", "--dry-run"], cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout.split("# launch plan\n", 1)[1])
    assert plan["workers_per_node"] == 1 and plan["world_size"] == 1
    assert any("runs 1 process per node" in n for n in plan["notices"])
