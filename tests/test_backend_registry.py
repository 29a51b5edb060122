"""The one Backend interface (launcher.backends.base) and its registry: every registered engine implements every
verb with the interface's signature, the registry loads no engine's heavy imports, a run's kind is read from
its record (older runs: guessed, and marked so), and `status`/`cancel` work on a run on this machine too.

The black-box contract every engine's runs meet is tests/test_backend_contract.py."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import time

import pytest

from launcher.backends import registry
from launcher.backends.base import Backend, run_kind
from tests.helpers import REPO, kill_group, read_summary, run_launcher, start_launcher

pytestmark = pytest.mark.timeout(180)
VERBS = [name for name, member in inspect.getmembers(Backend, inspect.isfunction) if not name.startswith("_")]


@pytest.mark.parametrize("kind", registry.names())
def test_every_registered_backend_implements_every_verb_with_the_interfaces_signature(kind):
    backend = registry.get(kind)
    assert isinstance(backend, Backend) and backend.name == kind and backend.label, backend
    assert not inspect.isabstract(type(backend)), f"{kind} leaves abstract: {type(backend).__abstractmethods__}"
    assert {"takes", "dry_run", "launch", "describe", "cancel", "running", "log_files", "runs"} <= set(VERBS)
    for verb in VERBS:
        mine, theirs = inspect.signature(getattr(type(backend), verb)), inspect.signature(getattr(Backend, verb))
        assert list(mine.parameters) == list(theirs.parameters), (kind, verb, mine, theirs)
        assert mine.return_annotation == theirs.return_annotation, (kind, verb, mine, theirs)


def test_the_registry_and_every_backend_load_no_torch_submitit_or_ray():
    code = ("import sys; from launcher.backends import registry; [registry.get(k) for k in registry.names()]; "
            "print(sorted(m for m in ('torch', 'submitit', 'ray') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_ls_loads_no_engine_and_status_only_the_runs_own(tmp_path):
    """The registry imports an engine's module only when that engine is asked: `ls` reads the runs' records alone,
    `status` loads the one engine that made the run."""
    run = tmp_path / "old"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"kind": "simulated", "mode": "simulated", "world_size": 2}))
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    code = ("import sys; from launcher.cli import main; main(sys.argv[1:]); print(sorted(m for m in sys.modules "
            "if m.startswith('launcher.backends.') and m.count('.') >= 2 and not m.endswith(('.base', '.registry'))))")
    for argv, loaded in ((["ls", str(tmp_path)], "[]"), (["status", str(run)], "['launcher.backends.here']")):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0 and done.stdout.splitlines()[-1] == loaded, (argv, done.stdout + done.stderr)


def test_a_runs_kind_is_its_record_and_an_older_runs_is_guessed_from_its_files():
    assert run_kind({"kind": "ray", "cluster": "ray"}, {"kind": "multinode", "mode": "static"}) == ("ray", True)
    assert run_kind({}, {"kind": "simulated", "mode": "simulated"}) == ("simulated", True)
    assert run_kind({"cluster": "ray", "job_id": None}, {"mode": "static"}) == ("ray", False)  # before `kind`
    assert run_kind({"job_id": "12"}, {}) == ("slurm", False)
    assert run_kind({}, {"mode": "c10d"}) == ("multinode", False)
    assert run_kind({}, {}) == ("unknown", False)


def test_an_older_run_without_a_recorded_kind_is_listed_as_guessed(tmp_path):
    run = tmp_path / "old"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps({"mode": "simulated", "world_size": 2}))
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))
    done = run_launcher(["ls", str(tmp_path), "--json"], cwd=tmp_path, timeout=60)
    row = json.loads(done.stdout)[0]
    assert (row["kind"], row["kind_guessed"]) == ("simulated", True), row


def test_status_and_cancel_work_on_a_run_on_this_machine(tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    out.mkdir()
    proc = start_launcher(["--gpus", "1", f"output_dir={runs}", "run_id=held", str(REPO / "tests" / "scripts" / "contract.py"),
                           "--out", str(out), "--block"], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 90
        while not (out / "ready-0").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not come up"
            time.sleep(0.2)
        running = run_launcher(["status", "held", "--output-dir", str(runs)], cwd=tmp_path, timeout=60)
        assert running.returncode == 0 and "local run held RUNNING" in running.stdout, running.stdout + running.stderr
        cancel = run_launcher(["cancel", str(runs / "held")], cwd=tmp_path, timeout=90)
        assert cancel.returncode == 0 and "cancelled local run held" in cancel.stdout, cancel.stdout + cancel.stderr
        proc.wait(timeout=30)
    finally:
        kill_group(proc)
    assert read_summary(runs / "held")["status"] == "interrupted"
    ended = run_launcher(["status", str(runs / "held")], cwd=tmp_path, timeout=60)
    assert ended.returncode == 130 and "INTERRUPTED" in ended.stdout, ended.stdout + ended.stderr
    again = run_launcher(["cancel", str(runs / "held")], cwd=tmp_path, timeout=60)  # idempotent: nothing to stop
    assert again.returncode == 0 and "already ended (INTERRUPTED)" in again.stdout, again.stdout
    # listing: each backend recognises its own runs by their record
    assert registry.get("local").runs(runs) == [(runs / "held").resolve()]
    assert registry.get("slurm").runs(runs) == [] and registry.get("simulated").runs(runs) == []


def test_status_of_no_run_is_one_line_naming_what_to_pass(tmp_path):
    done = run_launcher(["status", "nothing-here", "--output-dir", str(tmp_path)], cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "no run 'nothing-here'" in done.stderr and "Traceback" not in done.stderr


def test_a_toy_engine_registered_from_outside_runs_a_job_with_its_own_section_and_allocation(tmp_path):
    """tests/toy_engine.py, registered with one entry of $LAUNCHER_ENGINES (what a user's own engine does): --cluster
    names it, its section's keys come from the command line and are checked by it, it adopts the allocation it
    detects (its run id), and the run it made is listed with its kind."""
    env = {"LAUNCHER_ENGINES": "toy=tests.toy_engine:BACKEND", "PYTHONPATH": str(REPO), "TOY_JOB_ID": "42"}
    runs = tmp_path / "runs"
    (tmp_path / "t.py").write_text("import os\nopen('ran-%s' % os.environ['RANK'], 'w').close()\n")
    helped = run_launcher(["--help"], cwd=tmp_path, timeout=60, env=env)
    assert "--cluster {local,toy,slurm,ray}" in helped.stdout, helped.stdout
    assert "toy: run here through the toy engine (config: toy.*)" in " ".join(helped.stdout.split()), helped.stdout
    bad = run_launcher(["--cluster", "toy", "toy.repeat=0", f"output_dir={runs}", "t.py"], cwd=tmp_path, timeout=60, env=env)
    assert bad.returncode == 2 and bad.stderr == "error: toy.repeat=0 must be at least 1\n", bad.stderr
    done = run_launcher(["--cluster", "toy", "--gpus", "1", "toy.greeting=hi", "toy.repeat=2", f"output_dir={runs}",
                         "wandb.mode=disabled", "t.py"], cwd=tmp_path, timeout=180, env=env)
    assert done.returncode == 0, done.stderr
    run = runs / "toy-42"  # the run id the toy allocation gave it
    assert (tmp_path / "ran-0").exists() and read_summary(run)["status"] == "completed"
    assert json.loads((run / "toy.json").read_text()) == {"greetings": ["hi", "hi"]}
    assert "toy:\n  greeting: hi\n  repeat: 2\n" in (run / "config.yaml").read_text()
    listed = run_launcher(["ls", str(runs), "--json"], cwd=tmp_path, timeout=60, env=env)
    row = json.loads(listed.stdout)[0]
    assert (row["run_id"], row["kind"], row["status"]) == ("toy-42", "toy", "completed") and not row.get("kind_guessed"), row
    status = run_launcher(["status", str(run)], cwd=tmp_path, timeout=60, env=env)
    assert status.returncode == 0 and "toy run toy-42 COMPLETED" in status.stdout, status.stdout + status.stderr
