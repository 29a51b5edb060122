"""`python -m launcher board` against real runs: its APIs, its refusals, and the page in a real headless chromium."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from launcher.board.views import heatmap, inside
from tests.board_helpers import Board, assert_not_blank, board, browser_page, get, get_json, needs_browser, screenshot
from tests.helpers import NO_WANDB, QUIET, REPO, kill_group, read_metrics, run_bounded, run_launcher, start_launcher

pytestmark = pytest.mark.timeout(300)
SCRIPTS = REPO / "tests" / "scripts"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """An output directory with one real completed 2-rank run (its processes all ended)."""
    out = tmp_path_factory.mktemp("board-runs")
    result = run_launcher(["--gpus", "2", f"output_dir={out}", "run_id=done", "trainer.steps=20", "trainer.log_every=5",
                           *QUIET], cwd=out, timeout=240)
    assert result.returncode == 0, result.stderr
    return out


def board_rows(b: Board) -> list:
    return get_json(b.url("/api/runs"))["runs"]


# --- pure units -----------------------------------------------------------------------------------------

def test_inside_keeps_every_path_under_the_output_directory(tmp_path):
    (tmp_path / "run" / "logs").mkdir(parents=True)
    (tmp_path / "escape").symlink_to("/etc")
    assert inside(tmp_path, "run") == (tmp_path / "run").resolve()
    assert inside(tmp_path, "run/logs/../logs") == (tmp_path / "run" / "logs").resolve()
    for bad in ("..", "../x", "run/../../x", "/etc", "escape", "escape/passwd", "run/\x00"):
        assert inside(tmp_path, bad) is None, bad


def test_heatmap_is_ranks_by_log_steps():
    rows = [{"step": 5, "step_time_s_per_rank": [0.01, 0.05]}, {"step": 10}, {"step": 15, "step_time_s_per_rank": [0.02, 0.06]}]
    assert heatmap(rows, "step_time_s_per_rank") == {"steps": [5, 15], "ranks": [0, 1], "z": [[0.01, 0.02], [0.05, 0.06]],
                                                     "what": "step time"}


def ls_json(root: Path) -> list:
    done = run_launcher(["ls", str(root), "--json"], cwd=root, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# --- the command's refusals ------------------------------------------------------------------------------

def board_command(args, cwd, prelude: str = "pass") -> tuple:
    code = f"import sys; {prelude}; from launcher.cli import main; sys.exit(main(sys.argv[1:]))"
    done = run_bounded([sys.executable, "-c", code, "board", *args], cwd, timeout=60)
    return done.returncode, done.stderr.strip().splitlines()


def test_bad_input_is_one_line_and_exit_2(runs, tmp_path):
    code, err = board_command([str(runs), "--host", "0.0.0.0"], tmp_path)
    assert code == 2 and len(err) == 1 and "--expose" in err[0], err
    code, err = board_command([str(tmp_path / "nope")], tmp_path)
    assert code == 2 and len(err) == 1 and "not a directory" in err[0], err
    code, err = board_command([str(runs)], tmp_path, prelude="sys.modules['flask'] = None")
    assert code == 2 and err == ["error: the board needs flask: pip install -e .[board]"], err
    with board(runs) as b:
        port = b.base.rsplit(":", 1)[1]
        code, err = board_command([str(runs), "--port", port], tmp_path)
    assert code == 2 and len(err) == 1 and "--port" in err[0], err
    assert sorted(os.listdir(tmp_path)) == [], "a refused board leaves nothing behind"


def test_the_rest_of_the_launcher_does_not_import_the_board_dependencies(tmp_path):
    code = ("import sys; sys.modules['flask'] = sys.modules['plotly'] = None; from launcher.cli import main; "
            "sys.exit(main(['--dry-run', '--gpus', '2']))")
    done = run_bounded([sys.executable, "-c", code], tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr


# --- the served APIs, over HTTP ----------------------------------------------------------------------------

def test_only_files_under_the_output_directory_are_served(runs, tmp_path):
    secret = tmp_path / "secret-run"
    (secret / "logs").mkdir(parents=True)
    (secret / "logs" / "rank-0.log").write_text("SECRET-LINE\n")
    link = runs / "link-out"
    link.symlink_to(secret)
    try:
        with board(runs) as b:
            assert get(b.url("/api/run?path=done"))[0] == 200
            assert "[rank1]: " in get(b.url("/api/logs?path=done&rank=all"))[1].decode()
            for path in ("..", f"../{secret.name}", str(secret), "link-out", "done/../..", "%2e%2e", "done/../../etc"):
                for api in ("run", "logs"):
                    status, body = get(b.url(f"/api/{api}?path={path}"))
                    assert status == 404 and b"SECRET" not in body, (api, path, status)
            for path in ("/static/..%2fviews.py", "/static/../views.py", "/static/%2e%2e%2fserver.py", "/../../etc/passwd"):
                status, body = get(b.url(path))
                assert status == 404 and b"import" not in body, (path, status)
            assert get(b.url("/api/logs?path=done&rank=../../x"))[0] == 400
            assert get(b.url("/api/runs"), host="attacker.example:80")[0] == 403  # DNS rebinding
            assert get(b.url("/api/runs"), method="POST")[0] == 405  # read-only
    finally:
        link.unlink()


def test_the_run_api_has_every_rank_step_times_and_memory(runs):
    metrics = read_metrics(runs / "done")
    assert all(len(m["step_time_s_per_rank"]) == 2 and len(m["rss_mb_per_rank"]) == 2 for m in metrics)
    with board(runs) as b:
        view = get_json(b.url("/api/run?path=done"))
    assert view["status"] == "completed" and view["step"] == 20 and view["steps"] == 20
    assert view["series"]["step"] == [5, 10, 15, 20] and all(loss > 0 for loss in view["series"]["loss"])
    assert view["step_times"]["ranks"] == [0, 1] and len(view["step_times"]["z"][1]) == 4
    assert len(view["memory"]["mb"]) == 2 and min(view["memory"]["mb"]) > 50
    assert view["ranks"] == [0, 1] and view["restarts"] == 0


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory) -> Path:
    """One real run of a user's DDP script (no launcher code but launcher.log calls): its board page. Without W&B's
    offline run (~2 CPU-s and ~3 s): the board reads the run's own files, and a script's W&B run with its
    launcher.log series is tests/test_script_metrics.py's."""
    out = tmp_path_factory.mktemp("board-script")
    (out / "o").mkdir()
    result = run_launcher(["--gpus", "2", f"output_dir={out / 'runs'}", "run_id=script", *NO_WANDB,
                           str(SCRIPTS / "ddp_loader.py"), "--out", str(out / "o"), "--epochs", "3", "--launcher-log",
                           "--sleep", "0.005"], cwd=out, timeout=240)
    assert result.returncode == 0, result.stderr
    return out / "runs"


def test_a_scripts_run_view_has_its_step_rate_ranks_memory_and_every_launcher_log_series(script_runs):
    with board(script_runs) as b:
        view = get_json(b.url("/api/run?path=script"))
    assert view["status"] == "completed" and view["steps"] is None and view["step"] == 3 * 1024 // 2 // 16
    assert [s for s in view["series"]["steps_per_s"] if s] and [s for s in view["series"]["loss"] if s]
    assert view["step_times"]["ranks"] == [0, 1] and len(view["memory"]["mb"]) == 2
    # every launcher.log call, from series/rank-<k>.jsonl: one a step (loss and lr rank 0's, seen every rank's)
    logged = view["logged"]
    assert set(logged) == {"loss", "lr", "seen"} and not any(c["own_step"] for c in logged.values())
    assert logged["lr"]["calls"] == logged["lr"]["shown"] == view["step"] and set(logged["lr"]["traces"][0]["y"]) == {0.05}
    assert logged["lr"]["traces"][0]["x"] == list(range(1, view["step"] + 1))
    assert [t["name"] for t in logged["seen"]["traces"]] == ["rank 0", "rank 1"] and logged["seen"]["calls"] == 2 * view["step"]
    ranks = view["time"]["ranks"]  # where the time went: each rank's compute and wait
    assert len(ranks["compute"]) == len(ranks["wait"]) == 2 and min(ranks["compute"]) > 0


@needs_browser
def test_a_scripts_page_draws_its_launcher_log_series(script_runs):
    with board(script_runs) as b, browser_page() as page:
        page.goto(b.url("/run?path=script"))
        page.wait_for_selector("#logged-charts .chart .main-svg")
        assert page.locator("#logged-charts .chart").count() == 2  # lr and seen; loss is the loss chart, every call
        assert page.text_content("#loss .gtitle").startswith("loss (launcher.log: ")
        assert page.locator("#time-ranks .bars .point").count() == 4  # compute and wait of each rank
        assert page.locator("#throughput .scatterlayer .trace").count() == 1
        assert page.locator("#heatmap .hm").count() == 1
        assert page.errors == []


@pytest.mark.timeout(400)
def test_restarts_and_hang_verdicts_show_in_the_run_view(tmp_path):
    """A rank that fails once (a restart, then completed) and a rank that hangs (the watchdog's verdict)."""
    common = ["--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=30", "trainer.log_every=5", *QUIET]
    done = run_launcher([*common, "run_id=restarted", "launcher.max_restarts=1"], cwd=tmp_path, timeout=240,
                        env={"LAUNCHER_INJECT_FAULT": "rank=1,step=5"})
    assert done.returncode == 0, done.stderr
    hung = run_launcher([*common, "run_id=hung", "watchdog.timeout_s=5"], cwd=tmp_path, timeout=240,
                        env={"LAUNCHER_INJECT_FAULT": "rank=1,step=5,action=hang"})
    assert hung.returncode != 0
    with board(tmp_path) as b:
        restarted = get_json(b.url("/api/run?path=restarted"))
        hang = get_json(b.url("/api/run?path=hung"))
    assert restarted["status"] == "completed" and restarted["restarts"] == 1 and restarted["step"] == 30
    texts = [e["text"] for e in restarted["events"]]
    assert any("rank 1 failed" in t and "restarting" in t for t in texts), texts
    # the restart is marked at the failed attempt's last step: the fault's, step 5 (or the one before it)
    (restart,) = [e for e in restarted["events"] if e["kind"] == "restart"]
    assert restart["text"] == "attempt 0 failed" and restart["step"] in (4, 5), restart
    assert hang["status"] == "failed" and "hang" in hang["summary"]["error"], hang["summary"]
    assert any("watchdog: ranks made no progress" in e["text"] for e in hang["events"]), hang["events"]
    (verdict,) = [e for e in hang["events"] if e["kind"] == "hang"]  # no restart left: the watchdog's own line
    assert verdict["text"].startswith("watchdog: ranks made no progress") and verdict["step"] in (4, 5), verdict


# --- the page, in a real browser -----------------------------------------------------------------------------

@needs_browser
def test_the_page_shows_the_run_list_a_run_and_its_logs_by_rank(runs):
    with board(runs) as b, browser_page() as page:
        page.goto(b.url("/"))
        page.wait_for_selector("#runs tbody tr")
        on_screen = {tr.get_attribute("data-run-id"): tr.inner_text().split("\t")
                     for tr in page.query_selector_all("#runs tbody tr.run")}
        listed = ls_json(runs)
        expected = {row["run_id"]: row for row in listed}
        assert list(on_screen) == [row["run_id"] for row in listed][::-1] and "done" in on_screen  # newest first
        for run_id, cells in on_screen.items():
            row = expected[run_id]
            progress = "" if row["step"] is None else f"{row['step']}/{row['steps']}" if row["steps"] else str(row["step"])
            loss = "" if row["loss"] is None else f"{row['loss']:.4f}"
            assert cells[1:6] == [row["kind"], row["what"] or "", row["status"], progress, loss], cells
        assert on_screen["done"][2] == "ddp mlp" and float(on_screen["done"][5]) > 0
        page.click("#runs a:text('done')")
        page.wait_for_selector("#heatmap .main-svg")
        assert page.inner_text("#step") == "step 20/20" and "completed" in page.inner_text("#status")
        assert page.locator("#heatmap .hm").count() == 1 and page.locator("#loss .scatterlayer .trace").count() == 1
        page.click("#logs-link")
        page.wait_for_function("(document.querySelector('#log')?.textContent || '').includes('[rank1]: ')")
        log = page.inner_text("#log")
        assert "[rank0]: step 20/20" in log and "[rank1]: rank 1/2" in log
        page.click("button[data-rank='1']")
        page.wait_for_function("(document.querySelector('#log')?.textContent || '').startsWith('rank 1/2')")
        assert "rank 0/2" not in page.inner_text("#log")
        assert page.errors == []


LIVE_STEPS = 300


def the_rate_past_the_first_steps(b: Board) -> dict:
    """The live header once its rate is measured over steps past the first ones (polls of the page and this one)."""
    deadline = time.monotonic() + 60
    while True:
        live = get_json(b.url("/api/run?path=live"))["live"]
        if live.get("eta_s") is not None and live["step"] - live["rate_steps"] >= 3 or time.monotonic() > deadline:
            return live
        time.sleep(1.0)


@needs_browser
def test_a_running_job_advances_on_screen_and_shows_as_running(runs, tmp_path):
    # both ranks sleep 1 s a step from step 2 (no CPU, where full speed burnt 2 cores while the browser started)
    slow = {"LAUNCHER_INJECT_FAULT": "rank=0,step=2,action=slow;rank=1,step=2,action=slow"}
    job = start_launcher(["--gpus", "2", f"output_dir={runs}", "run_id=live", f"trainer.steps={LIVE_STEPS}",
                          "trainer.log_every=1", *QUIET], cwd=tmp_path, env=slow)
    try:
        deadline = time.monotonic() + 120
        while not (runs / "live" / "plan.json").is_file() and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)  # the page of a run that does not exist yet is a 404 (a console error)
        with board(runs) as b, browser_page() as page:
            page.goto(b.url("/run?path=live"))
            step = page.locator("#step")
            page.wait_for_function("/step [1-9]\\d*\\//.test(document.querySelector('#step')?.textContent || '')",
                                   timeout=180_000)
            first = int(re.search(r"step (\d+)/", step.inner_text()).group(1))
            assert page.inner_text("#status") == "status: running"
            page.wait_for_function("parseInt(((document.querySelector('#step')?.textContent || '')"
                                   f".match(/step (\\d+)/) || [0, 0])[1]) > {first}", timeout=60_000)
            live = the_rate_past_the_first_steps(b)
            # a step a second (each sleeps 1 s from step 2): the ETA is the steps left at that rate, start-up aside
            assert 0.4 <= live["step_rate"] <= 1.02 and live["step"] - live["rate_steps"] >= 3, live
            left = LIVE_STEPS - live["step"]
            assert left * 0.98 <= live["eta_s"] <= left / 0.4, live
            page.wait_for_function("(() => { const m = (document.querySelector('#eta')?.textContent || '').match("
                                   "/over the last (\\d+) steps?\\)/), s = (document.querySelector('#step')?.textContent || '')"
                                   ".match(/step (\\d+)/); return m && s && s[1] - m[1] >= 3; })()")
            shown = re.match(r"ETA (\d+):(\d\d) \(at ([\d.]+) steps/s over the last (\d+) steps?\)", page.inner_text("#eta"))
            assert shown and left * 0.9 - 5 <= 60 * int(shown[1]) + int(shown[2]) <= left / 0.4 + 5, page.inner_text("#eta")
            assert re.fullmatch(r"now [\d,]+ samples/s", page.inner_text("#rate")), page.inner_text("#rate")
            assert_not_blank(screenshot(page, tmp_path / "live-run.png"), drawn=0.05)
            page.goto(b.base + "/")  # the cookie the first page left: no token needed again
            page.wait_for_selector("#runs tr[data-run-id='live'] td.status")
            assert page.inner_text("#runs tr[data-run-id='live'] td.status") == "running"
            assert page.errors == []
    finally:
        kill_group(job)
        job.communicate(timeout=30)
    time.sleep(0.5)
    with board(runs) as b:
        assert {r["run_id"]: r["status"] for r in board_rows(b)}["live"] == "dead"  # killed: its lock is gone


@needs_browser
def test_a_sweep_shows_its_members_and_a_failed_member_its_failure(tmp_path):
    """A sweep folder in the agreed sweep.json format around two real runs, one failing at step 3."""
    out = tmp_path / "out"
    sweep = out / "sweep-t"
    members = []
    for index, (steps, fault) in enumerate((("8", None), ("12", "rank=0,step=3"))):
        env = {"LAUNCHER_INJECT_FAULT": fault} if fault else None
        done = run_launcher(["--gpus", "1", f"output_dir={sweep}", f"run_id=m{index}", f"trainer.steps={steps}",
                             "trainer.log_every=2", *QUIET], cwd=tmp_path, timeout=240, env=env)
        assert done.returncode == (1 if fault else 0), done.stderr
        members.append({"index": index, "overrides": {"trainer.steps": steps}, "run_dir": f"m{index}",
                        "status": "failed" if fault else "completed"})
    (sweep / "sweep.json").write_text(json.dumps({
        "kind": "sweep", "sweep_id": "sweep-t", "created": time.time(), "cluster": "local", "keys": ["trainer.steps"],
        "base_args": ["--gpus", "1"], "members": members}))
    with board(out) as b, browser_page() as page:
        page.goto(b.url("/"))
        page.wait_for_selector("#runs tr.member")
        assert [tr.inner_text().split("\t")[:4] for tr in page.query_selector_all("#runs tr.member")] == [
            ["trainer.steps=8", "local", "ddp mlp", "completed"], ["trainer.steps=12", "local", "ddp mlp", "failed"]]
        page.click("#runs tr.run a")
        page.wait_for_selector("#group-table td")
        assert page.inner_text("#status") == "status: failed" and page.locator("#chart-0 .bars").count() == 1
        rows = [tr.inner_text().split("\t")[:3] for tr in page.query_selector_all("#group-table tbody tr")]
        assert rows == [["trainer.steps=8", "completed", "8/8"], ["trainer.steps=12", "failed", "2/12"]], rows
        page.click("#group-table a:text('trainer.steps=12')")
        page.wait_for_selector("#events li")
        page.wait_for_function("(document.querySelector('#events')?.textContent || '').includes('attempt 0 failed')")
        assert page.errors == []
