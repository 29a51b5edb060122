"""The run records' schema (launcher/runtime/schema.py): what each writer writes is what the schema declares, a value
read back is checked against it, the statuses are the words summary.json always had, and a new step-record field
is one edit of the schema that reaches the step records, metrics.jsonl, summary.json, `ls --json`, the board's API
and the W&B run.

How the last test adds a field without editing the repository: it copies the package (launcher/, with trainers/ and
configs/ where they install, launcher/trainers/ and launcher/configs/) into a temporary folder, adds one field to
the copy's launcher/runtime/schema.py, exactly as a developer writes it there, and runs the copy
(PYTHONPATH puts it before the installed one): the launcher, its workers, `ls` and the board. No other file of the
copy differs from the repository's, which the test checks, so whatever reaches the readers came from that one edit.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launcher
from launcher.runtime.goodput import GoodputClock, record_failure
from launcher.runtime.schema import ENDED, FAILURE, GOODPUT, LISTED, NODE, STEP, SUMMARY, SUMMARY_ALWAYS, Status
from tests.board_helpers import board, get_json
from tests.helpers import REPO, only_run_dir, run_launcher

# The one edit, as a developer makes it: a step-record field measured in each worker, the ranks' maximum in rows and
# in the summary, declared in STEP's list (and the module it measures with imported).
NEW_FIELD = ('    F("final", bool,', '''    F("cpu_s", float, "s", "CPU time the rank's process has used", sample=time.process_time,
      rows="max", per_rank=True, summary="max"),
    F("final", bool,''')
NEW_IMPORT = ("import sys\n", "import sys\nimport time\n")


def test_the_statuses_are_summary_jsons_words():
    assert [s.value for s in ENDED] == ["completed", "failed", "hung", "interrupted", "preempted"]
    assert [s.value for s in LISTED] == ["running", "completed", "failed", "interrupted", "preempted", "dead", "unknown",
                                         "damaged"]
    assert json.dumps({"status": Status.HUNG}) == '{"status": "hung"}' and f"{Status.FAILED}" == "failed"
    assert Status.COMPLETED == "completed" and {"completed": 0}[Status.COMPLETED] == 0


def test_what_the_writers_write_is_what_the_schema_declares(tmp_path):
    """The goodput clock's record and the agent's failure record read back whole; so does a summary's base."""
    clock = GoodputClock(str(tmp_path), time.time() - 5, attempt=0, rank=0)
    clock.mark("launch")
    clock.step_started()
    clock.step_ended(1)
    clock.keep(clock.snapshot())
    clock.close()
    (written,) = (tmp_path / "goodput").glob("*-attempt-0.json")
    record = json.loads(written.read_text())
    assert GOODPUT.check(record) == record and record["kept"]["step"] == 1
    record_failure(str(tmp_path), time.time() - 5, 0, hang=True)
    (failure,) = (tmp_path / "goodput").glob("*-failure-0.json")
    assert FAILURE.check(json.loads(failure.read_text()))["hang"] is True
    assert set(SUMMARY_ALWAYS) <= set(SUMMARY.fields) and "status" in SUMMARY_ALWAYS


@pytest.mark.parametrize("record, problem", [
    ({"status": "completed", "restarts": "many"}, "restarts: expected int, got str"),
    ({"status": "finished"}, "status: expected one of"),
    ({"wall_s": float("inf")}, "wall_s: out of range"),
    ({"root_cause": {"log": "x"}}, "root_cause: rank is missing"),
])
def test_a_summary_field_of_another_shape_is_named(record, problem):
    with pytest.raises(ValueError, match=problem):
        SUMMARY.check(record)
    assert problem.split(":")[0] not in SUMMARY.read(record)  # a lenient reader leaves it out


def test_a_node_record_keeps_only_declared_fields_of_their_shape():
    record = {"status": "hung", "error": "rank 2 stuck", "ranks": [2, 3], "planted": "x", "node_rank": "0"}
    assert NODE.read(record) == {"status": Status.HUNG, "error": "rank 2 stuck", "ranks": [2, 3]}


def package_copy(root: Path) -> Path:
    """The installed package's files, laid out as installed (trainers/ as launcher/trainers/), under root."""
    here = Path(launcher.__file__).resolve().parent
    copy = root / "launcher"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(here, copy, ignore=ignore)
    for part in ("trainers", "configs"):
        source = here / part if (here / part).is_dir() else REPO / part  # installed, or the repository (pip -e)
        shutil.copytree(source, copy / part, ignore=ignore)
    return root


def differing(a: Path, b: Path) -> list:
    """Files that differ between two trees (.py files only; the caches were not copied)."""
    out, compare = [], filecmp.dircmp(a, b, ignore=["__pycache__"])
    out += [str(Path(a, name)) for name in compare.diff_files + compare.left_only + compare.right_only
            if name.endswith(".py")]
    for name in compare.common_dirs:
        out += differing(a / name, b / name)
    return out


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_new_step_field_added_in_the_schema_alone_reaches_every_reader(tmp_path):
    assert "cpu_s" not in STEP.fields  # the repository's schema has no such field: the edit below adds it
    pkg = package_copy(tmp_path / "pkg")
    schema = pkg / "launcher" / "runtime" / "schema.py"
    text = schema.read_text()
    assert text.count(NEW_FIELD[0]) == text.count(NEW_IMPORT[0]) == 1
    schema.write_text(text.replace(*NEW_FIELD).replace(*NEW_IMPORT))
    assert [Path(p).name for p in differing(Path(launcher.__file__).resolve().parent, pkg / "launcher")] == ["schema.py"]
    env = {"PYTHONPATH": str(pkg), "OMP_NUM_THREADS": "1"}
    which = subprocess.run([sys.executable, "-c", "import launcher; print(launcher.__file__)"], env={**os.environ, **env},
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert which.stdout.strip() == str(pkg / "launcher" / "__init__.py"), which.stderr

    shutil.copy(REPO / "tests" / "scripts" / "ddp_loader.py", tmp_path / "ddp_loader.py")
    (tmp_path / "out").mkdir()
    done = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'runs'}", "ddp_loader.py", "--out",
                         str(tmp_path / "out"), "--epochs", "2", "--sleep", "0.02"], cwd=tmp_path, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not declared" not in done.stderr  # summary.json holds nothing the schema lacks
    run_dir = only_run_dir(tmp_path / "runs")

    # the workers measured it: every record of every rank
    for rank in (0, 1):
        records = [json.loads(line) for line in (run_dir / "steps" / f"rank-{rank}.jsonl").read_text().splitlines()]
        assert records and all(r["cpu_s"] > 0 for r in records), records
    # metrics.jsonl: the job's value (the ranks' maximum) and each rank's
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(len(r["cpu_s_per_rank"]) == 2 and r["cpu_s"] == max(r["cpu_s_per_rank"]) for r in rows), rows
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["cpu_s"] >= rows[-1]["cpu_s"] > 0

    # ls --json: the newest row's figures
    listed = run_launcher(["ls", str(tmp_path / "runs"), "--json"], cwd=tmp_path, timeout=60, env=env)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["metrics"]["cpu_s"] == rows[-1]["cpu_s"]

    # the board's API: a chart of it, with its unit, the job's line and each rank's
    with board(tmp_path / "runs", env=env) as b:
        view = get_json(b.url(f"/api/run?path={run_dir.name}"))
    (chart,) = [f for f in view["figures"] if f["name"] == "cpu_s"]
    assert chart["unit"] == "s" and chart["job"] == [r["cpu_s"] for r in rows]
    assert [list(values) for values in zip(*chart["per_rank"])] == [r["cpu_s_per_rank"] for r in rows]

    # W&B (the offline run the launcher made): the key and every value it was sent, and the summary's
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    history = next(wandb_run.glob("*.wandb")).read_bytes()
    assert b"cpu_s" in history
    for value in [r["cpu_s"] for r in rows] + [summary["cpu_s"]]:
        assert json.dumps(value).encode() in history, value
