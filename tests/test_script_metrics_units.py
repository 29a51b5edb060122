"""The pieces of a script's step metrics, in one process: the worker's step watch (launcher/worker/progress.py) on a
real optimizer and DataLoader, launcher.log() outside the launcher, reading records back (nothing trusted), and
the job's rows and summary figures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, TensorDataset

from launcher.steps.records import StepFiles, parse, read_records
from launcher.steps.rows import JobRows, summary_figures, weighted_median
from launcher.worker.progress import WORKER_FILES, steps_file

REPO = Path(__file__).resolve().parent.parent


def progress_namespace() -> dict:
    """launcher/worker/progress.py as a worker runs it: executed into a namespace (after loaders.py), not imported."""
    namespace = {"__name__": "launcher_worker_progress"}
    for name in WORKER_FILES:
        path = REPO / "launcher" / "worker" / name
        exec(compile(path.read_bytes(), str(path), "exec"), namespace)
    return namespace


def watch_for(tmp_path: Path, rank: int = 0):
    where = {"run_dir": str(tmp_path), "rank": rank, "attempt": 0, "launch": "1000", "wandb": False}
    namespace = progress_namespace()
    return namespace["StepWatch"](where, None, 1.0, namespace["Loader"]())


def records(tmp_path: Path, rank: int = 0) -> list:
    return [json.loads(line) for line in Path(steps_file(str(tmp_path), rank)).read_text().splitlines()]


def train(watch, accum: int = 1, epochs: int = 2, batch: int = 8) -> int:
    """A real training loop on a real DataLoader, the watch called as torch calls a global step hook."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=batch)
    handle = register_optimizer_step_post_hook(watch)
    steps = 0
    try:
        for _ in range(epochs):
            for i, (x,) in enumerate(loader):
                model(x).sum().backward()
                if (i + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad()
                    steps += 1
                    watch.next_flush = 0.0  # a record at every step: every window is looked at
    finally:
        handle.remove()
    watch.close()
    return steps


@pytest.mark.parametrize("accum", [1, 2])
def test_the_watch_counts_steps_and_samples_of_a_real_loop(tmp_path, accum):
    watch = watch_for(tmp_path)
    steps = train(watch, accum=accum)
    found = records(tmp_path)
    assert found[-1]["step"] == steps == 2 * 64 // 8 // accum and found[-1]["final"]
    assert sum(r["steps"] for r in found) == steps
    assert found[0]["first_step_at"] > 0 and all(r["batch_size"] == 8 for r in found)
    assert sum(r["samples"] for r in found) == steps * 8 * accum  # accumulated batches are counted
    assert all(r["rss_mb"] > 10 and r["rss_peak_mb"] >= r["rss_mb"] for r in found)
    goodput = json.loads(Path(tmp_path, "goodput", "1000-attempt-0.json").read_text())
    assert goodput["step"] == steps and goodput["kept"]["step"] == steps


def test_the_first_optimizer_counts_and_another_takes_over_when_it_stops(tmp_path):
    watch = watch_for(tmp_path)
    a, b = object.__new__(torch.optim.SGD), object.__new__(torch.optim.SGD)
    for _ in range(3):
        watch(a, (), {})
        watch(b, (), {})  # a second optimizer in the same iteration (a GAN's): not a step of its own
    assert watch.step == 3
    watch.flush(time.perf_counter())
    watch(b, (), {})
    watch.flush(time.perf_counter())  # a window where only b stepped: b counts from now on
    watch(b, (), {})
    assert watch.step == 4
    watch.close()


def test_logged_values_are_numbers_and_only_rank_0s_unless_per_rank(tmp_path, capsys):
    watch = watch_for(tmp_path)
    watch.log({"loss": torch.tensor(0.5), "lr": 0.1, "name": "x", "bad": float("nan")}, per_rank=False)
    watch.log({"seen": 3}, per_rank=True)
    watch.close()
    record = records(tmp_path)[-1]
    assert record["logged"] == {"loss": 0.5, "lr": 0.1, "bad": None} and record["per_rank"] == {"seen": 3}
    assert "'name' skipped" in capsys.readouterr().err
    other = watch_for(tmp_path, rank=1)
    other.log({"loss": 1.0}, per_rank=False)
    other.close()
    assert not Path(steps_file(str(tmp_path), 1)).exists()  # rank 1's default values are not kept


def test_a_full_disk_stops_the_records_not_the_training(tmp_path, capsys):
    watch = watch_for(tmp_path)
    watch.where = {**watch.where, "run_dir": "/dev/full/x"}  # cannot be created: as a vanished or full run directory
    watch(object.__new__(torch.optim.SGD), (), {})
    watch(object.__new__(torch.optim.SGD), (), {})
    watch.writer.close()  # the writes run on a thread of their own: done by now
    err = capsys.readouterr().err
    assert watch.fd == -1 and err.count("training goes on") == 1, err  # said once
    watch.close()


def test_launcher_log_outside_the_launcher_does_nothing_and_checks_its_argument():
    code = ("import launcher, torch\n"
            "launcher.log({'loss': 1.0})\n"
            "try:\n    launcher.log([1.0])\nexcept TypeError as e:\n    print('TypeError', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    assert "TypeError launcher.log takes a dict" in done.stdout


# ---- reading records back: nothing trusted


GOOD = {"v": 1, "rank": 0, "attempt": 0, "launch": "1", "t": 10.0, "step": 5, "steps": 5, "window_s": 1.0,
        "step_time_s": 0.2, "logged": {"loss": 0.5}}


@pytest.mark.parametrize("change", [
    {"v": 2}, {"rank": -1}, {"rank": True}, {"step": 2 ** 60}, {"t": float("nan")}, {"window_s": None},
    {"step_time_s": -1.0}, {"step_time_s": "fast"}, {"launch": 5},
])
def test_a_record_that_is_not_well_formed_is_dropped(change):
    assert parse(json.dumps(GOOD).encode()) is not None
    assert parse(json.dumps({**GOOD, **change}).encode()) is None


def test_logged_values_read_back_are_bounded_numbers():
    record = parse(json.dumps({**GOOD, "logged": {"loss": 1.0, "x" * 500: 1.0, "s": "text", "n": None}}).encode())
    assert record["logged"] == {"loss": 1.0, "n": None}
    assert parse(b"{" * 100000) is None and parse(b"\xff\xfe") is None and parse(b"[1]") is None


def test_step_files_are_read_as_they_grow_whole_lines_only_and_never_through_a_symlink(tmp_path):
    folder = tmp_path / "steps"
    folder.mkdir()
    path = folder / "rank-0.jsonl"
    line = json.dumps(GOOD)
    path.write_text(line + "\n" + line[:20])
    files = StepFiles(tmp_path)
    assert len(files.new_records()) == 1
    with open(path, "a") as f:
        f.write(line[20:] + "\n")
    assert len(files.new_records()) == 1 and files.new_records() == []
    secret = tmp_path / "elsewhere.jsonl"
    secret.write_text(line + "\n")
    os.symlink(secret, folder / "rank-1.jsonl")
    assert StepFiles(tmp_path).new_records() == [parse(line.encode())] * 2  # rank 0's two lines, nothing through the link
    assert len(read_records(tmp_path)) == 2


# ---- the job's view


def record(rank: int, t: float, step: int, steps: int = 10, **extra) -> dict:
    base = {"v": 1, "rank": rank, "attempt": 0, "launch": "1", "t": t, "step": step, "steps": steps,
            "window_s": 1.0, "step_time_s": 0.1 * (rank + 1), "step_time_s_median": 0.1, "rss_mb": 100.0 + rank,
            "rss_peak_mb": 100.0 + rank,
            "samples": 160, "batch_size": 16}
    return parse(json.dumps({**base, **extra}).encode())


def test_a_row_waits_for_every_rank_and_takes_each_ranks_nearest_record():
    rows = JobRows(0.2, world_size=2)
    rows.add(record(0, 10.0, 10))
    assert rows.take() == []  # rank 1 has not written this window yet
    rows.add(record(1, 10.01, 10))
    (row,) = rows.take()
    assert row["step"] == 10 and row["step_time_s_per_rank"] == [0.1, 0.2] and row["samples_per_s"] == 320
    assert row["straggler_rank"] == 1 and row["rss_mb_per_rank"] == [100.0, 101.0]


def test_rows_count_steps_across_attempts_and_keep_launcher_log_keys_apart_from_ours():
    rows = JobRows(0.2, world_size=1)
    rows.add(record(0, 10.0, 10, logged={"loss": 1.0, "step": 99.0}))
    assert rows.take(final=True)[0]["logged/step"] == 99.0
    rows.add(record(0, 20.0, 4, attempt=1))
    (row,) = rows.take(final=True)
    assert row["step"] == 14 and row["attempt_step"] == 4 and row["attempt"] == 1


def test_summary_figures_of_a_launch():
    found = [record(0, 10.0, 1, steps=1, first_step_at=9.5, step_time_s=None),
             record(1, 10.0, 1, steps=1, step_time_s=None),
             record(0, 11.0, 11, logged={"loss": 2.0}), record(1, 11.0, 11),
             record(0, 12.0, 21, logged={"loss": 1.5}), record(1, 12.0, 21, samples=None, samples_note="no loader")]
    figures = summary_figures(found, 5.0, 0.2)
    assert figures["steps"] == 21 and figures["time_to_first_step_s"] == 4.5 and figures["final_loss"] == 1.5
    assert figures["steps_per_s"] == 10.0 and figures["step_time_s_median"] == 0.1
    assert figures["samples_per_s"] is None and "no loader" in figures["samples_note"]  # one rank unknown: unknown
    assert math.isclose(figures["step_time_s_per_rank"][1], 0.2) and figures["rss_peak_mb"] == 101.0
    assert summary_figures([], 0.0, 0.2)["metrics_note"].startswith("no optimizer step")
    assert weighted_median([(1.0, 1), (5.0, 10)]) == 5.0


def test_a_resumed_or_requeued_run_moves_the_earlier_launchs_records_aside(tmp_path):
    from launcher.rundir import archive_rank_logs

    (tmp_path / "steps").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "steps" / "rank-0.jsonl").write_text(json.dumps(GOOD) + "\n")
    (tmp_path / "logs" / "rank-0.log").write_text("earlier\n")
    archive_rank_logs(tmp_path, "before-resume-1")
    assert read_records(tmp_path) == []  # steps/ holds this launch's records only
    assert (tmp_path / "steps" / "before-resume-1" / "rank-0.jsonl").is_file()
    assert (tmp_path / "logs" / "before-resume-1" / "rank-0.log").is_file()
