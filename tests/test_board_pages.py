"""The run page answers the distributed questions, in a real headless chromium: where the time went (each step's
phases, each rank's compute and wait, the run's wall time by cause), the run's events as marks on every chart over
steps (a restart, an interrupt, a resume, a named straggler), every launcher.log call charted (downsampled for
display only, and saying so), and a scale sweep's page with every round labelled, error bars from the rounds and a
verdict that blames noise. The live header's ETA is tests/test_board.py's (a real running job).

Real runs: a built-in trainer job that fails once (a restart), is interrupted by SIGINT and resumed; a DDP script
whose rank 1 sleeps for a while and that logs every step; the scale folder holds copies of test_board's completed
run as its rounds, with scale.json written by the scale command's own writer (the board only reads those files).
Each page is saved as a PNG in the test's tmp dir.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from launcher.board.events import Timeline, log_events
from launcher.board.live import step_rate
from launcher.board.series import downsample
from launcher.commands.scale import build_points, write_report
from tests.board_helpers import assert_not_blank, board, browser_page, get_json, laid_out, needs_browser, screenshot
from tests.helpers import NO_WANDB, QUIET, REPO, kill_group, read_metrics, read_summary, run_launcher, start_launcher
from tests.test_board import runs  # noqa: F401  (the real completed 2-rank run: a module fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
SLOW_SCRIPT = REPO / "tests" / "scripts" / "slow_while_logging.py"
SCRIPT_STEPS, SLOW_FROM, SLOW_TO = 2200, 700, 800
STEP_CHARTS = ("loss", "throughput", "heatmap", "time-phases")


# --- pure units ------------------------------------------------------------------------------------------------

def test_downsampling_keeps_every_runs_extremes_within_the_limit():
    xs = list(range(10_000))
    ys = [math.sin(x / 300) for x in xs]
    ys[4321], ys[777] = 50.0, float("nan")  # a spike stays; nan is no extreme
    x, y = downsample(xs, ys, 2000)
    assert len(x) == len(y) <= 2000 and len(x) > 1900 and x == sorted(x) and 4321 in x and 50.0 in y
    assert not any(v != v for v in y) and downsample(xs[:2000], ys[:2000], 2000) == (xs[:2000], ys[:2000])


def test_the_step_rate_is_measured_after_the_first_steps_never_from_the_start():
    # the attempt's first step at t=100; a slow compile to step 3 (20 s), then a step a second
    seen = [(120.0, 3), (121.0, 4), (125.0, 8), (130.0, 13)]
    assert step_rate(seen, (100.0, 0)) == (pytest.approx(1.0), 10)
    assert step_rate([(102.0, 2)], (100.0, 0)) == (None, 0)  # nothing seen past the first steps yet: no ETA
    late = step_rate([(200.0, 100)], (100.0, 0))  # a board opened 100 steps in: from the first step, a small share
    assert late == (pytest.approx(1.0), 100)


def test_a_time_is_placed_at_the_step_the_job_had_reached():
    attempts = [("1000", 0, {"first_step_at": 10.0, "start_step": 0, "step": 20, "active_until": 30.0}),
                ("1000", 1, {"first_step_at": 40.0, "start_step": 15, "step": 35, "active_until": 60.0})]
    timeline = Timeline(attempts, [])
    assert [timeline.step_at(t) for t in (5.0, 20.0, 35.0, 50.0, 99.0, None)] == [None, 10, 20, 25, 35, None]


def test_launcher_log_lines_become_interrupt_preemption_and_warning_events(tmp_path):
    """The launcher's own log format (launcher/runtime/log.py) and its messages: a requeue is a preemption."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "launcher.log").write_text(
        "2026-11-27 10:00:01,000 launcher INFO run x: 2 workers\n"
        "2026-11-27 10:00:05,250 launcher INFO SLURM job 41 requeued 1 time(s): resuming from the latest checkpoint\n"
        "2026-11-27 10:00:09,000 launcher WARNING attempt 0: rank 1 failed: exit code 1\n"
        "2026-11-27 10:00:10,000 launcher WARNING straggler at step 40: rank 1 computes 2.0x longer\n"
        "2026-11-27 10:00:12,500 launcher INFO interrupted by SIGTERM; run directory x\n"
        "  a continuation line\n")
    events = log_events(tmp_path, Timeline([], []))
    assert [(e["kind"], e["text"].split(":")[0]) for e in events] == [
        ("preemption", "SLURM job 41 requeued 1 time(s)"), ("warning", "attempt 0"),
        ("interrupt", "interrupted by SIGTERM; run directory x")]
    assert events[2]["at"] - events[0]["at"] == pytest.approx(7.25)


# --- a trainer job with a restart, an interrupt and a resume ---------------------------------------------------------

@pytest.fixture(scope="module")
def journey(tmp_path_factory) -> Path:
    """Rank 1 fails at step 10 (a restart from the step-10 checkpoint); from step 24 of the second attempt both ranks
    sleep 1 s a step, and SIGINT stops the job there (it checkpoints at the next step); `resume` finishes it."""
    out = tmp_path_factory.mktemp("board-journey")
    faults = "rank=1,step=10;rank=0,step=24,attempt=1,action=slow;rank=1,step=24,attempt=1,action=slow"
    # straggler_fraction: on a loaded machine a rank can really lag for a while, and its mark is not this page's subject
    job = start_launcher(["--gpus", "2", f"output_dir={out}", "run_id=journey", "trainer.steps=40",
                          "trainer.log_every=2", "checkpoint.every_steps=5", "launcher.max_restarts=1",
                          "metrics.straggler_fraction=1000", *QUIET],
                         cwd=out, env={"LAUNCHER_INJECT_FAULT": faults})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and job.poll() is None and attempt_step(out / "journey", 1) < 25:
            time.sleep(0.3)
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it to the job's process group
        job.communicate(timeout=120)
    finally:
        kill_group(job)
    assert job.returncode != 0 and read_summary(out / "journey")["status"] == "interrupted"
    done = run_launcher(["resume", str(out / "journey")], cwd=out, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def attempt_step(run_dir: Path, attempt: int) -> int:
    """Rank 0's step in the attempt, from its goodput record (rewritten in place every step)."""
    for path in (run_dir / "goodput").glob(f"*-attempt-{attempt}.json"):
        try:
            return int(json.loads(path.read_text()).get("step") or 0)
        except ValueError:
            return 0
    return 0


def events_by_kind(view: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    found: Dict[str, List[Dict[str, Any]]] = {}
    for event in view["events"]:
        found.setdefault(event["kind"], []).append(event)
    return found


def test_a_restart_an_interrupt_and_a_resume_are_events_at_their_steps(journey):
    summary = read_summary(journey / "journey")
    with board(journey) as b:
        view = get_json(b.url("/api/run?path=journey"))
    events = events_by_kind(view)
    (restart,), (interrupt,), (resume,) = events["restart"], events["interrupt"], events["resume"]
    assert restart["text"] == "attempt 0 failed" and 9 <= restart["step"] <= 10, restart
    assert interrupt["text"].startswith("interrupted by SIGINT") and interrupt["step"] == summary["resumed_from_step"]
    assert resume["step"] == summary["resumed_from_step"] > 24 and resume["text"].startswith("launch 2: resumed from step")
    assert restart["at"] < interrupt["at"] < resume["at"]
    # each step's phases: all-reduce wait is the part of backward spent in it, so backward is split, not counted twice
    phases, rows = view["time"]["phases"], read_metrics(journey / "journey")
    assert phases["steps"] == [r["step"] for r in rows]
    for i, row in enumerate(rows):
        assert phases["backward"][i] + phases["comm"][i] == pytest.approx(row["time_backward_s"])
        assert phases["comm"][i] == pytest.approx(min(row["time_comm_s"], row["time_backward_s"]))
    # the run's wall time, every launch's: kept steps and each cause (by phase) add up to it
    badput = view["time"]["badput"]
    assert sum(p["s"] for p in badput["parts"]) == pytest.approx(summary["goodput_wall_s"], rel=1e-3)
    assert {p["phase"] for p in badput["parts"] if p["cause"] == "restart"} >= {"launch", "build"}


@needs_browser
def test_every_chart_over_steps_marks_the_events_and_the_time_breakdown_is_drawn(journey, tmp_path):
    with board(journey) as b, browser_page() as page:
        marked = [e for e in get_json(b.url("/api/run?path=journey"))["events"] if e["kind"] in
                  ("restart", "interrupt", "resume") and e["step"] is not None]
        page.goto(b.url("/run?path=journey"))
        layout = laid_out(page, 6)
        assert layout["charts"][:4] == ["loss", "throughput", "heatmap", "memory"], layout
        assert {"time-phases", "time-badput"} <= set(layout["charts"]) and layout["faults"] == [], layout
        for chart in STEP_CHARTS:
            labels = sorted(t.text_content() for t in page.query_selector_all(f"#{chart} .annotation-text"))
            assert labels == ["interrupt", "restart", "resume"], (chart, labels)
            assert page.locator(f"#{chart} .shapelayer path").count() == len(marked) == 3, chart
        assert page.locator("#memory .annotation-text").count() == 0  # ranks, not steps: no marks
        names = page.evaluate("[...document.querySelectorAll('#time-phases .legendtext')].map(t => t.textContent)")
        assert set(names) == {"data loading", "forward", "backward (compute)", "all-reduce wait (in backward)",
                              "optimizer", "step time"}, names
        assert "% kept" in page.text_content("#time-badput .gtitle") and page.locator("#time-badput .bars .point").count() > 5
        events = page.inner_text("#events")
        assert "(step 10) attempt 0 failed" in events or "(step 9) attempt 0 failed" in events, events
        assert_not_blank(screenshot(page, tmp_path / "events-and-time.png"), drawn=0.1)
        assert page.errors == []


# --- a script with a straggler for a while, logging every step ----------------------------------------------------

@pytest.fixture(scope="module")
def slow_script(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("board-straggler")
    done = run_launcher(["--gpus", "2", f"output_dir={out}", "run_id=slow", *NO_WANDB, str(SLOW_SCRIPT),
                         str(SCRIPT_STEPS), "1", str(SLOW_FROM), str(SLOW_TO)], cwd=out, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def series_values(run_dir: Path, key: str) -> List[float]:
    lines = [json.loads(line) for line in (run_dir / "series" / "rank-0.jsonl").read_text().splitlines()]
    return [c["values"][key] for c in lines if key in c["values"] and not c["per_rank"]]


def test_every_launcher_log_call_is_charted_and_the_straggler_marked_where_it_was_named(slow_script):
    with board(slow_script) as b:
        view = get_json(b.url("/api/run?path=slow"))
    loss = view["logged"]["loss"]
    every = series_values(slow_script / "slow", "loss")
    assert loss["calls"] == len(every) == SCRIPT_STEPS and 1900 < loss["shown"] <= 2000  # downsampled for display only
    (trace,) = loss["traces"]
    assert trace["x"][0] == 1 and trace["x"][-1] == SCRIPT_STEPS and max(trace["y"]) == pytest.approx(max(every))
    seen = view["logged"]["seen"]
    assert [t["name"] for t in seen["traces"]] == ["rank 0", "rank 1"] and seen["calls"] == seen["shown"] == 2 * 220
    named = events_by_kind(view)["straggler"][0]
    assert SLOW_FROM < named["step"] <= SLOW_TO + 100 and "rank 1 (node 0) computes" in named["text"], named
    gone = events_by_kind(view).get("straggler_gone") or [{}]
    assert gone[0].get("step", SCRIPT_STEPS) > named["step"]
    ranks = view["time"]["ranks"]
    assert len(ranks["compute"]) == len(ranks["wait"]) == 2 and ranks["compute"][1] > ranks["compute"][0]


@needs_browser
def test_a_scripts_page_says_its_series_is_downsampled_and_marks_its_straggler(slow_script, tmp_path):
    with board(slow_script) as b, browser_page() as page:
        page.goto(b.url("/run?path=slow"))
        layout = laid_out(page, 5)
        assert layout["faults"] == [], layout
        title = re.fullmatch(rf"loss \(launcher.log: (\d+) of {SCRIPT_STEPS} calls, downsampled\)",
                             page.text_content("#loss .gtitle"))
        assert title and 1900 < int(title[1]) <= 2000, page.text_content("#loss .gtitle")
        for chart in ("loss", "throughput", "heatmap", "logged-0"):
            labels = [t.text_content() for t in page.query_selector_all(f"#{chart} .annotation-text")]
            assert labels.count("straggler") >= 1, (chart, labels)
        assert page.locator("#time-ranks .bars .point").count() == 4  # compute and wait, each rank
        assert "straggler: rank 1 (node 0) computes" in page.inner_text("#events")
        assert_not_blank(screenshot(page, tmp_path / "script-straggler.png"), drawn=0.1)
        assert page.errors == []


# --- a scale sweep's page --------------------------------------------------------------------------------------

def noisy_scale_sweep(root: Path, done: Path) -> Path:
    """A strong-scaling sweep at 1 and 2 workers, 3 rounds each, whose 1-worker rounds ranged 93 to 435 samples/s
    (issue 44's), each round a copy of `done` with its throughput; scale.json from the scale command's writer."""
    sweep = root / "scale-20261127-101500"
    points = build_points([1, 2], [1], "strong", 32)
    figures = {1: (93.0, 435.0, 210.0), 2: (480.0, 520.0, 500.0)}
    rounds = []
    for point in points:
        summaries = []
        for number, value in enumerate(figures[point.world_size], start=1):
            name = point.name if number == 1 else f"{point.name}-r{number}"
            shutil.copytree(done, sweep / "runs" / name, symlinks=True)
            summary = json.loads((sweep / "runs" / name / "summary.json").read_text())
            summary.update(run_id=name, samples_per_s=value, world_size=point.world_size, gpus_per_node=point.gpus)
            (sweep / "runs" / name / "summary.json").write_text(json.dumps(summary))
            summaries.append(summary)
        rounds.append(summaries)
    write_report("strong", points, rounds, sweep, sweep.name, None, 0.10)
    return sweep


@needs_browser
def test_the_scale_page_labels_every_round_draws_error_bars_and_blames_noise(runs, tmp_path):  # noqa: F811
    root = tmp_path / "out"
    sweep = noisy_scale_sweep(root, runs / "done")
    labels = [f"nodes=1 gpus={g} round={r}" for g in (1, 2) for r in (1, 2, 3)]
    with board(root) as b, browser_page() as page:
        page.goto(b.url("/"))
        page.wait_for_selector("#runs tr.member a")
        assert [a.inner_text() for a in page.query_selector_all("#runs tr.member td.run-id a")] == labels
        page.click(f"#runs a:text('{sweep.name}')")
        page.wait_for_selector("#group-table td a")
        layout = laid_out(page, 2)
        assert layout["charts"] == ["chart-0", "chart-1"] and layout["faults"] == [], layout
        assert [a.inner_text() for a in page.query_selector_all("#group-table td a")] == labels
        verdict = page.inner_text("#verdict")
        assert "2 workers: noise, not scaling (119%)" in verdict and "the 1-worker rounds ranged 93 to 435 samples/s" in verdict
        assert "noisy: throughput spread up to 163%" in verdict and "cache" not in page.inner_text("#main")
        for chart in ("chart-0", "chart-1"):  # each size's median with its bar from the slowest to the fastest round
            assert page.locator(f"#{chart} .errorbar").count() == 2, chart
        assert page.locator("#chart-0 .scatterlayer .trace .point").count() >= 6 + 2  # every round a dot
        assert_not_blank(screenshot(page, tmp_path / "scale.png"), drawn=0.05)
        assert page.errors == []
    assert (sweep / "scale.png").read_bytes()[:4] == b"\x89PNG"
