"""The board's layout, measured in a real headless chromium: no mode bar over a chart title, no axis label cut off,
counts printed whole, and a failed run's page led by its error with no empty chart or blank field.

One real run (test_board's `runs`: the launcher's own files); the failed run and the sweep beside it are written
with the launcher's own writers (launcher.rundir.finish, sweep.json as the sweep command writes it), since the
board only reads those files. Each page is also saved as a PNG in the test's tmp dir and checked not to be blank.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from launcher.rundir import finish
from tests.board_helpers import assert_not_blank, board, browser_page, laid_out, needs_browser, screenshot
from tests.test_board import runs  # noqa: F401  (the real completed 2-rank run: a module fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300), needs_browser]
TRACEBACK = ('Traceback (most recent call last):\n  File "train.py", line 9, in step\n'
             '    raise ValueError("boom")\nValueError: boom\n')
SWEEP_KEYS = ["trainer.steps", "optimizer.learning_rate"]
COUNT = r"^\d+$"


def fail_like_the_launcher(run_dir: Path, done: Path) -> Dict[str, Any]:
    """run_dir as a launch of done's plan leaves it when rank 1 raised before its first log step: no metrics,
    its traceback in its log, summary.json written by the launcher's own finish() with the agent's root cause."""
    (run_dir / "logs").mkdir(parents=True)
    for name in ("plan.json", "config.yaml"):
        shutil.copy(done / name, run_dir / name)
    (run_dir / "logs" / "rank-0.log").write_text("rank 0/2 on cpu\n")
    (run_dir / "logs" / "rank-1.log").write_text("rank 1/2 on cpu\n" + TRACEBACK)
    ran = json.loads((done / "summary.json").read_text())
    base = {k: ran[k] for k in ("world_size", "nodes", "gpus_per_node", "backend", "device_type", "strategy", "model",
                                "script", "restarts")}
    base.update(run_id=run_dir.name, root_cause={"rank": 1, "attempt": 0, "log": "logs/rank-1.log"})
    error = f"rank 1 failed: exit code 1: ValueError: boom; see {run_dir / 'logs' / 'rank-1.log'}"
    return finish(run_dir, base, None, "failed", time.time() - 4.0, error=error)


@pytest.fixture(scope="module")
def output(runs: Path) -> Path:  # noqa: F811
    """runs' real `done`, plus `failed` (no metrics at all) and `sweep-s`: three members, one of them failed,
    with labels long enough that plotly must turn them."""
    fail_like_the_launcher(runs / "failed", runs / "done")
    sweep = runs / "sweep-s"
    members = []
    for index, (source, status) in enumerate((("done", "completed"), ("failed", "failed"), ("done", "completed"))):
        shutil.copytree(runs / source, sweep / f"m{index}", symlinks=True)
        members.append({"index": index, "overrides": {"trainer.steps": "20", "optimizer.learning_rate": f"0.00{index + 1}"},
                        "run_dir": f"m{index}", "status": status})
    (sweep / "sweep.json").write_text(json.dumps({
        "kind": "sweep", "sweep_id": "sweep-s", "created": time.time(), "cluster": "local", "keys": SWEEP_KEYS,
        "base_args": ["--gpus", "2"], "members": members}))
    return runs


# Every tick label on an axis of counts (steps, ranks, workers) and every count in a table column.
COUNT_TEXTS = """() => {
  const texts = [];
  for (const chart of document.querySelectorAll(".js-plotly-plot")) {
    for (const [axis, ticks] of [["g-xtitle", ".xtick text"], ["g-ytitle", ".ytick text"]]) {
      const title = chart.querySelector(`.${axis} text`)?.textContent || "";
      if (["step", "rank", "workers"].includes(title)) texts.push(...[...chart.querySelectorAll(ticks)].map(t => t.textContent));
    }
  }
  for (const table of document.querySelectorAll("table")) {
    const columns = [...table.querySelectorAll("th")].map(th => th.textContent);
    for (const tr of table.querySelectorAll("tbody tr")) {
      [...tr.children].forEach((td, i) => {
        if (["restarts", "workers", "nodes"].includes(columns[i]) && td.textContent) texts.push(td.textContent);
      });
    }
  }
  return texts;
}"""


def visible_facts(page: Any) -> List[str]:
    return [span.inner_text() for span in page.query_selector_all(".facts span") if span.is_visible()]


def test_a_finished_runs_charts_keep_their_titles_and_labels_clear(output, tmp_path):
    with board(output) as b, browser_page() as page:
        page.goto(b.url("/run?path=done"))
        layout = laid_out(page, 6)
        assert layout["charts"] == ["loss", "throughput", "heatmap", "memory", "time-phases", "time-badput"], layout
        assert layout["modebars"] == 6 and layout["titles"] == 6 and layout["faults"] == [], layout
        counts = page.evaluate(COUNT_TEXTS)
        assert len(counts) >= 10 and all(re.match(COUNT, t) for t in counts), counts
        facts = visible_facts(page)
        assert facts[:4] == ["status: completed", "step 20/20", "restarts: 0", "world size 2 on 1 node"], facts
        assert all(facts) and page.locator("#failure").is_hidden()
        assert_not_blank(screenshot(page, tmp_path / "finished-run.png"), drawn=0.15)
        assert page.errors == []


def test_a_failed_run_leads_with_its_root_cause_and_shows_no_empty_chart_or_blank_field(output, tmp_path):
    summary = json.loads((output / "failed" / "summary.json").read_text())
    with board(output) as b, browser_page() as page:
        page.goto(b.url("/run?path=failed"))
        page.wait_for_selector("#failure-head")
        page.wait_for_timeout(2000)  # a second poll: still nothing empty drawn
        first = page.evaluate("document.querySelector('#title').nextElementSibling.id")
        assert first == "failure" and page.inner_text("#failure-head") == "root cause: rank 1 failed first"
        assert page.inner_text("#failure-error") == summary["error"] and "ValueError: boom" in page.inner_text("#failure-traceback")
        # no chart of steps it never made: only where its wall time went (all of it lost)
        assert [c.get_attribute("id") for c in page.query_selector_all(".chart")] == ["time-badput"]
        assert "0% kept" in page.text_content("#time-badput .gtitle")
        facts = visible_facts(page)
        assert facts == ["status: failed", "restarts: 0", "world size 2 on 1 node", "goodput 0%"], facts
        text = page.inner_text("#main")
        assert "step -" not in text and "samples/s" not in text and "loss" not in text and " ," not in text, text
        assert_not_blank(screenshot(page, tmp_path / "failed-run.png"), drawn=0.03)
        assert page.errors == []


def test_a_sweeps_charts_keep_every_label_and_print_counts_whole(output, tmp_path):
    with board(output) as b, browser_page() as page:
        page.goto(b.url("/"))
        page.wait_for_selector("#runs tr.member")
        restarts = [td.inner_text() for td in page.query_selector_all("#runs td.restarts")]
        assert len(restarts) == 6 and all(re.match(COUNT, r) for r in restarts), restarts
        page.goto(b.url("/run?path=sweep-s"))
        page.wait_for_selector("#group-table td")
        layout = laid_out(page, 2)
        assert layout["charts"] == ["chart-0", "chart-1"] and layout["modebars"] == 2, layout
        assert layout["faults"] == [], layout
        rows = [tr.inner_text().split("\t") for tr in page.query_selector_all("#group-table tbody tr")]
        names = page.evaluate("[...document.querySelectorAll('#chart-0 .ytick text')]"
                              ".sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top)"
                              ".map(t => t.textContent)")
        assert names == [r[0] for r in rows] and len(names[0]) > 40, names  # whole, top down, long enough to test
        assert [r[1:3] for r in rows] == [["completed", "20/20"], ["failed", ""], ["completed", "20/20"]], rows
        assert [r[5] for r in rows] == ["0", "0", "0"] and page.inner_text("#step") == "members done: 2/3", rows
        assert_not_blank(screenshot(page, tmp_path / "sweep.png"), drawn=0.05)
        assert page.errors == []
