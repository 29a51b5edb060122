"""A failed run as ls, logs and the board show it: led by the rank that failed first, counted restarts.

Real 2-rank runs of a plain script (tests/scripts/fail_in_allreduce.py) whose rank 1 raises ValueError while
rank 0 waits for it in an all_reduce, and then fails with gloo's knock-on error: the views lead with rank 1 and
its traceback, not rank 0's. With --max-restarts 2: a rank that fails once is 1 restart; a run that fails on its
last attempt made 2 restarts, though it left 3 failure records.
"""

from pathlib import Path

import pytest

from launcher.runindex import list_runs
from tests.board_helpers import board, browser_page, get_json, needs_browser
from tests.helpers import REPO, read_summary, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = str(REPO / "tests" / "scripts" / "fail_in_allreduce.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """boom: fails, no restart; once: fails in attempt 0 of 3, then completes; always: fails in all 3 attempts."""
    out = tmp_path_factory.mktemp("failed-runs")
    for run_id, restarts, failing_attempts, code in (("boom", 0, 1, 1), ("once", 2, 1, 0), ("always", 2, 3, 1)):
        result = run_launcher(["--gpus", "2", "--max-restarts", str(restarts), f"output_dir={out}", f"run_id={run_id}",
                               SCRIPT, str(failing_attempts)], cwd=out, timeout=240)
        assert result.returncode == code, f"{run_id}:\n{result.stderr}"
    return out


def rows(out: Path) -> dict:
    return {row["run_id"]: row for row in list_runs(out)}


def test_the_root_cause_leads_ls_logs_and_the_board(runs):
    summary = read_summary(runs / "boom")
    cause = summary["root_cause"]
    assert {k: v for k, v in cause.items() if k != "failed_at"} == {
        "rank": 1, "attempt": 0, "log": "logs/rank-1.log", "error_file": "logs/rank-1.error.json", "how": "exited"}, summary
    assert cause["failed_at"] <= (runs / "boom" / "summary.json").stat().st_mtime
    row = rows(runs)["boom"]
    assert row["failed_rank"] == 1 and row["error"].startswith("rank 1 failed: exit code 1: ValueError: boom"), row
    assert row["command"].endswith("logs " + str(runs / "boom") + " --rank 1"), row
    table = run_launcher(["ls", str(runs)], cwd=runs, timeout=60).stdout.splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("boom "))
    assert table[at + 1].strip().startswith("error: rank 1 failed: exit code 1: ValueError: boom"), table

    logs = run_launcher(["logs", str(runs / "boom")], cwd=runs, timeout=60)  # no --rank: the root cause's log
    assert logs.returncode == 0 and "ValueError: boom on rank 1 at step 5" in logs.stdout, logs
    assert logs.stdout == run_launcher(["logs", str(runs / "boom"), "--rank", "1"], cwd=runs, timeout=60).stdout
    assert "rank 1's log follows, the root cause" in logs.stderr, logs.stderr

    with board(runs) as b:
        view = get_json(b.url("/api/run?path=boom"))
    failure = view["failure"]
    assert failure["rank"] == 1 and failure["error"].startswith("rank 1 failed"), failure
    traceback = failure["traceback"]
    assert traceback.startswith("Traceback (most recent call last):") and traceback.endswith(
        "ValueError: boom on rank 1 at step 5"), traceback
    assert "fail_in_allreduce.py" in traceback and "bootstrap.py" not in traceback and "launcher/" not in traceback


@needs_browser
def test_the_run_page_leads_with_the_root_cause_before_its_charts(runs):
    with board(runs) as b, browser_page() as page:
        page.goto(b.url("/run?path=boom"))
        page.wait_for_selector("#failure-traceback")
        assert page.inner_text("#failure h3") == "root cause: rank 1 failed first"
        assert page.inner_text("#failure-traceback").endswith("ValueError: boom on rank 1 at step 5")
        order = page.evaluate("[...document.querySelectorAll('#failure, .charts')].map(e => e.id || e.className)")
        # the failure first, then the charts (the metric charts and, where the run logged any, the launcher.log() ones)
        charts = {"run-charts", "time-charts", "logged-charts"}
        assert order[0] == "failure" and "run-charts" in order[1:] and set(order[1:]) <= charts, order
        page.click("#failure a")
        page.wait_for_function("(document.querySelector('#log')?.textContent || '').includes('ValueError: boom')")
        assert page.errors == []


def test_the_restart_count_is_the_restarts_made_not_the_failure_records(runs):
    found = rows(runs)
    for run_id, restarts, failures in (("boom", 0, 1), ("once", 1, 1), ("always", 2, 3)):
        assert read_summary(runs / run_id)["restarts"] == restarts, run_id
        assert found[run_id]["restarts"] == restarts, found[run_id]
        assert len(list((runs / run_id / "goodput").glob("*-failure-*.json"))) == failures, run_id
    assert found["once"]["status"] == "completed" and found["always"]["status"] == "failed"
    assert read_summary(runs / "always")["root_cause"]["log"] == "logs/rank-1.attempt-2.log"
    table = run_launcher(["ls", str(runs)], cwd=runs, timeout=60).stdout.splitlines()
    column = table[0].index("restarts")
    assert [line[column:].split()[0] for line in table if line.startswith(("once ", "always "))] == ["1", "2"], table
    with board(runs) as b:
        for run_id, restarts, failures in (("once", 1, 1), ("always", 2, 3)):
            view = get_json(b.url(f"/api/run?path={run_id}"))
            assert view["restarts"] == restarts, (run_id, view["restarts"], view["events"])
            attempts = [e["text"] for e in view["events"] if e["kind"] == "restart"]  # (the warning that said so: listed too)
            assert attempts == [f"attempt {a} failed" for a in range(failures)], view["events"]  # each failure, named
