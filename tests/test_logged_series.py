"""Every launcher.log call is kept: a script logging at each of 500 steps has all 500 values, at their steps, in
its run directory (series/rank-<k>.jsonl) and in the job's W&B run (read back from its offline files), per rank
with per_rank=True, at a step of its own with step=N; a string is refused in one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import launcher_env, only_run_dir, read_summary
from tests.wandb_records import history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = Path(__file__).parent / "scripts" / "log_every_step.py"
STEPS = 500


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("series")
    done = subprocess.run([sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp / 'runs'}", str(SCRIPT),
                           str(tmp)], cwd=tmp, env=launcher_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads((tmp / f"logged-{r}.json").read_text()) for r in range(2)]
    return only_run_dir(tmp / "runs"), logged, done.stderr


def lines(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_call_of_rank_0_is_in_the_series_at_its_step(job):
    run_dir, logged, _ = job
    calls = [c for c in lines(run_dir / "series" / "rank-0.jsonl") if not c["per_rank"] and not c["own_step"]]
    assert [c["step"] for c in calls] == list(range(1, STEPS + 1))  # logged after each optimizer step
    assert [c["values"]["loss"] for c in calls] == pytest.approx(logged[0]["loss"], rel=1e-6)
    assert calls[-1]["values"]["my_lr"] == pytest.approx(0.01 * (1 - (STEPS - 1) / STEPS))
    own = [c for c in lines(run_dir / "series" / "rank-0.jsonl") if c["own_step"]]
    assert [(c["step"], c["values"]["val"]) for c in own] == [(10_000 + i, float(i)) for i in range(99, STEPS, 100)]


def test_per_rank_calls_are_kept_on_every_rank(job):
    run_dir, logged, _ = job
    for rank in range(2):
        calls = [c for c in lines(run_dir / "series" / f"rank-{rank}.jsonl") if c["per_rank"]]
        assert [c["values"]["tokens"] for c in calls] == logged[rank]["tokens"]
        assert all(c["rank"] == rank for c in calls)


def test_the_wandb_run_holds_every_value_at_its_step(job):
    run_dir, logged, _ = job
    (run,) = (run_dir / "wandb").glob("offline-run-*")
    rows = history(run)
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(losses) == list(range(1, STEPS + 1)), sorted(losses)[:5]
    assert [losses[s] for s in range(1, STEPS + 1)] == pytest.approx(logged[0]["loss"], rel=1e-6)
    tokens = sorted((r["step"], r["tokens/rank1"]) for r in rows if "tokens/rank1" in r)
    assert [t for _, t in tokens] == logged[1]["tokens"]
    assert sorted(r["val"] for r in rows if "val" in r) == logged[0]["val"]


def test_the_summary_and_rows_still_say_the_last_loss_and_a_string_is_refused_in_one_line(job):
    run_dir, logged, err = job
    summary = read_summary(run_dir)
    assert summary["final_loss"] == pytest.approx(logged[0]["loss"][-1], rel=1e-6)
    said = [line for line in err.splitlines() if "'note' skipped" in line]
    assert len(said) == 1 and "only numbers are recorded (it is a str)" in said[0], err[-2000:]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two-nodes")
    done = subprocess.run([sys.executable, "-m", "launcher", "--nodes", "2", "--gpus", "1", f"output_dir={tmp / 'runs'}",
                           str(SCRIPT), str(tmp), "--steps", "200", "--lr", "0.02"],
                          cwd=tmp, env=launcher_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = only_run_dir(tmp / "runs")
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    return run_dir, wandb_run


def test_a_two_node_jobs_wandb_run_holds_both_machines_the_console_args_group_and_per_rank_series(two_nodes):
    from tests.wandb_records import run_record

    run_dir, wandb_run = two_nodes
    rows = history(wandb_run)
    for node in (0, 1):  # every node's machine, not only rank 0's
        assert any(f"system/node{node}/cpu_percent" in r for r in rows), sorted({k for r in rows for k in r})[:40]
        assert any(r.get(f"system/node{node}/workers_rss_mb", 0) > 0 for r in rows)
    for rank in (0, 1):  # a series a rank, from the rows' per-rank lists
        assert any(f"step_time_s/rank{rank}" in r for r in rows) and any(f"compute_s/rank{rank}" in r for r in rows)
    assert not [k for r in rows for k, v in r.items() if isinstance(v, str)]  # numbers only in the history
    run = run_record(wandb_run)
    assert run["group"] == run_dir.name and {"local", "2x1", "script"} <= set(run["tags"])
    assert run["config"]["script_args"] == {"lr": 0.02, "steps": 200, "_positional": [str(run_dir.parent.parent)]}
    console = (wandb_run / "files" / "output.log").read_text()
    assert "[launcher] completed in" not in console  # written as the run closed, before the launcher's last line
    assert "[launcher] run " in console and "[rank0]: launcher.log: 'note' skipped" in console, console[-2000:]
    assert console.index("[launcher] run ") < console.index("[rank0]: launcher.log"), console[-2000:]  # in order
