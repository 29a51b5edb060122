"""checkpoint.dir=s3://... and output_dir=s3://...: training saves to, resumes from and survives faults of a real S3
API (moto's server on loopback), with the guarantees of local checkpoints: a checkpoint exists once its manifest
does, a resume is bitwise the uninterrupted run, a damaged one is set aside, credentials never reach the run
directory; a run whose output_dir is a bucket leaves its whole record there, and `ls`/`logs` read it back.

The launchers reach moto through a small TCP relay, so "the store stops answering" is the relay closing while
moto (whose state lives in its memory) keeps what was saved, for the test to look at afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.helpers import (QUIET, communicate_bounded, finish_all, kill_group, launcher_env, only_run_dir, read_summary,
                           run_launcher, start_launcher)
from tests.object_store_servers import (  # noqa: F401 (fixtures: pytest finds them by name in this module)
    CREDENTIALS, SECRET, STEPS, Relay, assert_no_secret, bucket_run, free_port, gcs, job, monkeypatch_module, moto,
    published, read_until, store_env, via)

pytest.importorskip("s3fs")
pytest.importorskip("moto")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]



def test_killed_upload_then_resume_on_a_new_node_is_bitwise_the_uninterrupted_run(tmp_path, store_env, moto, bucket_run):
    fs, relay = store_env, Relay(moto)
    reference = json.loads(fs.cat_file(f"runs/exp/{bucket_run['run_id']}/summary.json"))
    url = "s3://ckpts/resume"
    # node 1: saves step 8 (in the background), then is killed while step 16's files are uploaded, unpublished
    first = start_launcher([*job(f"checkpoint.dir={url}", "checkpoint.async_save=true", "checkpoint.keep=2"),
                            f"output_dir={tmp_path / 'node1'}"], cwd=tmp_path,
                           env={**via(relay), "LAUNCHER_TEST_SAVE_DELAY_S": "120,step=16"})
    try:
        lines = read_until(first, "save of step 16 delayed")
        assert any("save of step 16 delayed" in line for line in lines), "".join(lines)
        assert fs.ls("ckpts/resume/step-00000016", refresh=True), "step 16's files are not in the bucket yet"
    finally:
        kill_group(first)
        first.communicate(timeout=30)
    assert published(fs, "resume") == ["step-00000008"]  # step 16 has no manifest: it does not exist
    node1 = only_run_dir(tmp_path / "node1")
    assert not (node1 / "checkpoints").exists() and not (tmp_path / "s3:").exists()
    # node 2: its own empty output folder; the bucket is all it shares with node 1
    second = run_launcher([*job(f"checkpoint.dir={url}", "checkpoint.keep=2"), f"output_dir={tmp_path / 'node2'}"],
                          cwd=tmp_path, timeout=240, env=via(relay))
    assert second.returncode == 0, second.stdout + second.stderr
    node2 = only_run_dir(tmp_path / "node2")
    summary = read_summary(node2)
    assert summary["resumed_from_step"] == 8
    assert summary["param_checksums"] == reference["param_checksums"]
    assert published(fs, "resume") == ["step-00000016", "step-00000024"], second.stdout  # keep=2; the cut-off upload replaced
    assert f"dir: {url}\n" in (node2 / "config.yaml").read_text()  # the URL only: nothing of the credentials
    for run_dir in (node1, node2):
        assert_no_secret(run_dir)
    # a damaged newest checkpoint is set aside and the one before it loads
    fs.pipe_file("ckpts/resume/step-00000024/rank-1.pt", b"not a checkpoint")
    from launcher.runtime.checkpoints import latest_valid

    warnings: List[str] = []
    assert latest_valid(url, warn=warnings.append, set_aside=True) == f"{url}/step-00000016"
    assert "does not match its checksum" in warnings[0] or "has 16 bytes" in warnings[0]
    assert published(fs, "resume") == ["step-00000016"] and fs.exists("ckpts/resume/corrupt-step-00000024/manifest.json")
    relay.close()


# The store is checked in the launcher's main(), after launcher.prestart has exec'd into torch's import and forked
# the workers' zygote (~5 CPU-s for the one line): the endpoint case refuses there, as a default launch does; the
# bucket cases' point is their message, and their launches start workers by spawn (no exec, no zygote: ~1 CPU-s).
@pytest.mark.parametrize("where, key, problem", [
    ("endpoint", "checkpoint.dir", "cannot reach the object store at http://127.0.0.1:"),
    ("bucket", "checkpoint.dir", "the bucket no-such-bucket does not exist: create it"),
    ("bucket", "output_dir", "the bucket no-such-bucket does not exist: create it, or fix the bucket name in output_dir"),
])
def test_a_wrong_endpoint_or_bucket_is_one_line_before_anything_starts(tmp_path, store_env, moto, where, key, problem):
    url = "s3://no-such-bucket/x" if where == "bucket" else "s3://ckpts/x"
    endpoint = f"http://127.0.0.1:{free_port() if where == 'endpoint' else moto}"
    where_to = [f"checkpoint.dir={url}", f"output_dir={tmp_path / 'out'}"] if key == "checkpoint.dir" else [f"output_dir={url}"]
    spawn = ["launcher.start_method=spawn"] if where == "bucket" else []
    result = run_launcher([*job(), *spawn, *where_to], cwd=tmp_path, timeout=120,
                          env={**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "TMPDIR": str(tmp_path)})
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0] and f"{key}={url}" in lines[0], result.stderr
    assert SECRET not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("launcher-staging-*"))


def test_an_output_dir_in_a_bucket_holds_the_whole_run_record_and_ls_lists_it(store_env, bucket_run):
    fs, run_id, tmp, env = store_env, bucket_run["run_id"], bucket_run["tmp"], bucket_run["env"]
    fs.invalidate_cache()
    names = {p[len(f"runs/exp/{run_id}/"):] for p in fs.find(f"runs/exp/{run_id}")}
    for name in ("config.yaml", "plan.json", "summary.json", "metrics.jsonl", "logs/launcher.log", "logs/rank-0.log",
                 "logs/rank-1.log", "checkpoints/step-00000024/manifest.json"):
        assert name in names, sorted(names)
    assert not any(n.startswith(("locks/", "heartbeats/", ".")) for n in names), sorted(names)
    summary = json.loads(fs.cat_file(f"runs/exp/{run_id}/summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    for name in names:  # nothing of the credentials in any object of the record
        assert SECRET.encode() not in fs.cat_file(f"runs/exp/{run_id}/{name}"), name
    assert f"run record: s3://runs/exp/{run_id}" in bucket_run["result"].stdout
    assert not list(tmp.glob("launcher-staging-*")), "the staging folder outlived a whole upload"
    listed = run_launcher(["ls", "s3://runs/exp", "--json"], cwd=tmp, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["run_id"], r["status"], r["step"], r["path"]) for r in rows] == \
        [(run_id, "completed", STEPS, f"s3://runs/exp/{run_id}")], rows
    logs = run_launcher(["logs", f"s3://runs/exp/{run_id}", "--rank", "1"], cwd=tmp, timeout=120, env=env)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr
    status = run_launcher(["status", run_id, "--output-dir", "s3://runs/exp"], cwd=tmp, timeout=120, env=env)
    assert status.returncode == 0 and "COMPLETED" in status.stdout, status.stdout + status.stderr
    assert f"run directory s3://runs/exp/{run_id}" in status.stdout


def test_ctrl_c_uploads_the_record_and_resume_from_the_bucket_ends_as_the_uninterrupted_run(store_env, bucket_run):
    """A run whose record lives only in the bucket: Ctrl-C after its first checkpoint, then `resume URL/RUN` on a
    machine with nothing of it (its own TMPDIR) continues from that checkpoint to the uninterrupted run's weights."""
    fs, tmp = store_env, bucket_run["tmp"]
    reference = json.loads(fs.cat_file(f"runs/exp/{bucket_run['run_id']}/summary.json"))
    here, there = tmp / "ctrlc-here", tmp / "ctrlc-there"
    here.mkdir(), there.mkdir()
    # rank 0 sleeps 1 s a step from step 9 of this first launch only (no CPU, no number changed): Ctrl-C lands mid-run
    first = start_launcher([*job(), "output_dir=s3://runs/ctrlc"], cwd=here,
                           env={**bucket_run["env"], "TMPDIR": str(here), "LAUNCHER_INJECT_FAULT": "rank=0,step=9,action=slow"})
    lines: List[str] = []
    try:
        lines = read_until(first, "checkpoints/step-00000008")
        if lines and "checkpoints/step-00000008" in lines[-1]:
            os.killpg(first.pid, 2)  # Ctrl-C, as a terminal sends it to the foreground group
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            kill_group(first)
            first.wait()
    lines.append(out or "")
    assert first.returncode == 130, "".join(lines)
    fs.invalidate_cache()
    [run_url] = [f"s3://{p}" for p in fs.ls("runs/ctrlc")]
    assert json.loads(fs.cat_file(f"{run_url[5:]}/summary.json"))["status"] == "interrupted"
    resumed = run_launcher(["resume", run_url], cwd=there, timeout=240, env={**bucket_run["env"], "TMPDIR": str(there)})
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    fs.invalidate_cache()
    summary = json.loads(fs.cat_file(f"{run_url[5:]}/summary.json"))
    assert summary["status"] == "completed" and summary["steps"] == STEPS and summary["resumed_from_step"] >= 8
    assert summary["param_checksums"] == reference["param_checksums"]


def test_a_scheme_without_its_package_names_the_extra(tmp_path):
    """As where gcsfs is not installed: a `gcsfs` first on the path that cannot be imported (the test extra has it)."""
    (tmp_path / "absent" / "gcsfs").mkdir(parents=True)
    (tmp_path / "absent" / "gcsfs" / "__init__.py").write_text("raise ImportError(\"No module named 'gcsfs'\")\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "absent"), os.environ.get("PYTHONPATH")]))}
    for argv in (["--dry-run", "checkpoint.dir=gs://bucket/x"], ["ls", "gs://bucket/x"]):  # `ls URL` too, not a traceback
        result = run_launcher(argv, cwd=tmp_path, timeout=60, env=env)
        assert result.returncode == 2 and "pip install 'torch-launcher[gcs]'" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_checkpoints_in_gcs_resume_on_a_new_node_bitwise_as_the_uninterrupted_run(tmp_path, store_env, bucket_run, gcs, monkeypatch):
    """checkpoint.dir=gs://...: a job that fails at step 12 has published step 8 there; the same command on a node
    with an empty output folder resumes from it and ends on the uninterrupted run's weights (the S3 run's).
    Two saves in all (the second job saves only at its end). The emulator serves GCS's moveTo, which torch's
    checkpoint writer uses once a save (tests/gcs_emulator.py: without it gcsfs retried ~30 s a save)."""
    reference = json.loads(store_env.cat_file(f"runs/exp/{bucket_run['run_id']}/summary.json"))
    url = "gs://ckpts/exp"
    first = run_launcher([*job(f"checkpoint.dir={url}"), f"output_dir={tmp_path / 'node1'}"], cwd=tmp_path, timeout=240,
                         env={**gcs, "LAUNCHER_INJECT_FAULT": "rank=1,step=12"})
    assert first.returncode not in (0, 2), first.stdout + first.stderr
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs["STORAGE_EMULATOR_HOST"])
    from launcher.runtime.checkpoints import latest_valid

    assert latest_valid(url) == f"{url}/step-00000008"  # published, every object matching its manifest
    second = run_launcher([*job(f"checkpoint.dir={url}", "checkpoint.every_steps=1000"), f"output_dir={tmp_path / 'node2'}"],
                          cwd=tmp_path, timeout=240, env=gcs)
    assert second.returncode == 0, second.stdout + second.stderr
    summary = read_summary(only_run_dir(tmp_path / "node2"))
    assert summary["resumed_from_step"] == 8
    assert summary["param_checksums"] == reference["param_checksums"]
    assert latest_valid(url) == f"{url}/step-00000024"


def test_a_store_that_stops_answering_ends_the_job_with_the_last_checkpoint_intact(tmp_path, store_env, moto):
    fs, relay, url = store_env, Relay(moto), "s3://ckpts/outage"
    proc = start_launcher([*job(f"checkpoint.dir={url}"), f"output_dir={tmp_path}"], cwd=tmp_path,
                          env={**via(relay), "LAUNCHER_TEST_SAVE_DELAY_S": "3,step=16"})
    try:
        lines = read_until(proc, "save of step 16 delayed")
        if lines and "save of step 16 delayed" in lines[-1]:
            relay.close()  # the store goes away between the upload and the manifest
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_group(proc)
    text = "".join(lines) + out
    assert proc.returncode not in (0, None), text
    assert "saving checkpoint step 16 to s3://ckpts/outage failed" in text, text
    assert "this save did not touch the checkpoints published before it" in text, text
    assert published(fs, "outage") == ["step-00000008"]
    from launcher.runtime.checkpoints import latest_valid

    assert latest_valid(url) == f"{url}/step-00000008"  # intact: every object matches its manifest
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["status"] == "failed"


def test_a_bucket_deleted_mid_run_is_named_with_the_checkpoints_that_went_with_it(tmp_path, store_env, moto):
    """The line used to say the checkpoints published before were untouched, after they went with the bucket."""
    fs, url = store_env, "s3://doomed/ckpts"
    fs.mkdir("doomed")
    proc = start_launcher([*job(f"checkpoint.dir={url}"), f"output_dir={tmp_path}"], cwd=tmp_path,
                          env={**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto}",
                               "LAUNCHER_TEST_SAVE_DELAY_S": "5,step=16"})
    try:
        lines = read_until(proc, "save of step 16 delayed")
        if lines and "save of step 16 delayed" in lines[-1]:
            for _ in range(20):  # the bucket and everything in it: step 8 included (the run's own uploads may land
                try:               # between s3fs's listing and its delete_bucket: again, as a user would)
                    fs.rm("doomed", recursive=True)
                    break
                except OSError:
                    fs.invalidate_cache()
        out, _ = communicate_bounded(proc, 180, "the job")
    finally:
        kill_group(proc)
    text = "".join(lines) + out
    assert proc.returncode not in (0, None), text
    failed = [line for line in text.splitlines() if "saving checkpoint step 16 to s3://doomed/ckpts failed" in line]
    assert failed and "the bucket doomed no longer exists, and the checkpoints published before it went with it" \
        in failed[-1], text
    assert "untouched" not in text and "did not touch" not in text, text
    fs.invalidate_cache()
    assert not fs.exists("doomed")


def test_a_launcher_killed_before_its_first_periodic_upload_leaves_a_run_ls_lists_and_resume_continues(
        tmp_path, store_env, bucket_run):
    """kill -9 of the launcher within its first seconds (here during step 16's save, step 8 published): the record
    went up as the run started and again at step 8's checkpoint (seen in the bucket within 10 s of it, before the
    kill), not only after runrecord.INTERVAL_S, so `ls` lists
    the run (dead: its staging folder is here, its launcher gone), `ls` and `resume` name that folder, and `resume`
    continues from step 8 to the uninterrupted run's weights. It used to leave no record: "no run recorded"."""
    fs, env = store_env, {**bucket_run["env"], "TMPDIR": str(tmp_path)}
    reference = json.loads(fs.cat_file(f"runs/exp/{bucket_run['run_id']}/summary.json"))
    first = start_launcher([*job(), "output_dir=s3://runs/killed"], cwd=tmp_path,
                           env={**env, "LAUNCHER_TEST_SAVE_DELAY_S": "120,step=16"})
    try:
        lines = read_until(first, "save of step 16 delayed")
        assert any("save of step 16 delayed" in line for line in lines), "".join(lines)
        wait_for_upload(fs, "runs/killed/*/goodput/*-attempt-0.json", lambda record: (record["kept"] or {}).get("step") == 8)
        os.kill(first.pid, 9)  # the launcher alone: its zygote and workers die with it
        first.wait(timeout=30)
    finally:
        kill_group(first)
    [staging] = list(tmp_path.glob("launcher-staging-*"))
    listed = run_launcher(["ls", "s3://runs/killed", "--json"], cwd=tmp_path, timeout=120, env=env)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["status"] == "dead" and row["path"] == f"s3://runs/killed/{row['run_id']}", row
    assert f"run {row['run_id']}'s launcher ended without uploading all" in listed.stderr, listed.stderr
    assert str(staging / row["run_id"]) in listed.stderr, listed.stderr
    resumed = run_launcher(["resume", row["path"]], cwd=tmp_path, timeout=240, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert str(staging / row["run_id"]) in resumed.stderr, resumed.stderr
    fs.invalidate_cache()
    summary = json.loads(fs.cat_file(f"runs/killed/{row['run_id']}/summary.json"))
    assert summary["status"] == "completed" and summary["resumed_from_step"] == 8, summary
    assert summary["param_checksums"] == reference["param_checksums"]
    assert [p.name for p in tmp_path.glob("launcher-staging-*")] == [staging.name], "the resumed launch left its own"


def wait_for_upload(fs, pattern: str, check, timeout: float = 10.0) -> None:
    """An object of the record that passes check within timeout seconds (well before runrecord.INTERVAL_S)."""
    deadline, found = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        fs.invalidate_cache()
        # a goodput record is created empty as its attempt starts (filled at its first step), and goes up as it is
        found = [json.loads(data) for data in (fs.cat_file(path) for path in fs.glob(pattern)) if data.strip()]
        if any(check(record) for record in found):
            return
        time.sleep(0.5)
    raise AssertionError(f"no {pattern} that passes within {timeout}s: {found}")


def test_a_running_bucket_run_is_listed_as_running_and_its_rank_logs_read_back_before_it_ends(tmp_path, store_env, moto):
    """The record goes up while the job runs (changed files every runrecord.INTERVAL_S), not only at its end:
    `ls URL` lists the run as running and `logs URL/RUN --rank 0` shows rank 0's lines, then `ls` says completed.
    Rank 0 sleeps 1 s a step from step 1 (no CPU): the job outlasts its first periodic upload whatever the load."""
    from launcher.objectstore.runrecord import INTERVAL_S

    fs, env = store_env, {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto}", "TMPDIR": str(tmp_path)}
    steps = int(INTERVAL_S) + 20  # a first upload 30 s in; 20 s left for `ls` and `logs` once it is there
    started = time.monotonic()
    proc = start_launcher(["--gpus", "1", f"trainer.steps={steps}", "trainer.log_every=1", *QUIET,
                           "output_dir=s3://runs/live"], cwd=tmp_path,
                          env={**env, "LAUNCHER_INJECT_FAULT": "rank=0,step=1,action=slow"})
    try:
        while proc.poll() is None and time.monotonic() < started + INTERVAL_S:  # nothing can be up before its first sync
            time.sleep(0.5)
        rank0 = ""
        while proc.poll() is None and f"/{steps} loss" not in rank0:  # the bucket, read as the job runs
            time.sleep(0.5)
            fs.invalidate_cache()
            found = fs.glob("runs/live/*/logs/rank-0.log")
            rank0 = fs.cat_file(found[0]).decode() if found else ""
        assert proc.poll() is None and f"step {steps}/{steps} " not in rank0, \
            "rank 0's log reached the bucket only as the job ended:\n" + rank0
        run_id = found[0].split("/")[2]
        listed, logs = (subprocess.Popen([sys.executable, "-m", "launcher", *argv], cwd=tmp_path, env=launcher_env(env),
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
                        for argv in (["ls", "s3://runs/live", "--json"], ["logs", f"s3://runs/live/{run_id}", "--rank", "0"]))
        (rows, ls_err), (log_out, log_err) = (communicate_bounded(p, 60, "ls/logs") for p in (listed, logs))
        assert proc.poll() is None, "the job ended before `ls` and `logs` read it: the machine is too slow for this test"
        assert listed.returncode == 0 and logs.returncode == 0, ls_err + log_err
        assert [(r["run_id"], r["status"]) for r in json.loads(rows)] == [(run_id, "running")], rows
        first = next(line for line in rank0.splitlines() if f"/{steps} loss" in line)  # "step 1/50 loss ..."
        assert first in log_out, log_out
        out, _ = communicate_bounded(proc, 120, "the job")
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out
    listed = run_launcher(["ls", "s3://runs/live", "--json"], cwd=tmp_path, timeout=60, env=env)
    assert [(r["run_id"], r["status"], r["step"]) for r in json.loads(listed.stdout)] == [(run_id, "completed", steps)], listed.stdout


def test_every_node_of_a_two_node_bucket_run_removes_its_staging_folder_and_the_record_has_both(tmp_path, store_env, moto):
    """Two node agents on loopback (--node-rank 0 and 1, as on two machines), output_dir=s3://: each writes in its
    own staging folder, node 1's rank log reaches the head's (launcher.backends.mirror), the head uploads the
    record; then neither node leaves its staging folder behind (both under this test's own TMPDIR)."""
    port, tmp = free_port(), tmp_path / "tmp"
    tmp.mkdir()
    env = {**CREDENTIALS, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{moto}", "TMPDIR": str(tmp)}
    procs = [start_launcher(["--nodes", "2", "--gpus", "1", "--node-rank", str(k), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), "--rdzv-timeout", "60", "trainer.steps=4", *QUIET,
                             "output_dir=s3://runs/two-nodes"], cwd=tmp_path, env=env) for k in (0, 1)]
    outs = finish_all(procs, timeout=180)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert not list(tmp.glob("launcher-staging-*")), outs  # only this job's launchers write under tmp
    record = f"runs/two-nodes/job-127.0.0.1-{port}"
    store_env.invalidate_cache()
    names = {p[len(record) + 1:] for p in store_env.find(record)}
    assert {"logs/rank-0.log", "logs/rank-1.log", "nodes/node-0.json", "nodes/node-1.json", "summary.json"} <= names, sorted(names)
    assert "rank 1/2 (node 1" in store_env.cat_file(f"{record}/logs/rank-1.log").decode()
    assert json.loads(store_env.cat_file(f"{record}/summary.json"))["world_size"] == 2


def test_a_staging_folder_is_removed_only_while_it_is_the_one_this_launch_made(tmp_path, monkeypatch):
    """staging.Staging removes its own mkdtemp folder and nothing else: not a link put in its place (nor what the
    link points at), not a folder kept for what is in it, never a local output_dir."""
    import tempfile

    from launcher.objectstore.staging import Staging

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = Staging("s3://runs/x", make=True)
    assert Path(mine.path).parent == tmp_path and Path(mine.path).name.startswith("launcher-staging-")
    (Path(mine.path) / "run").mkdir()
    (Path(mine.path) / "run" / "rank-0.log").write_text("a line")
    mine.remove()
    assert not os.path.lexists(mine.path)
    swapped, victim = Staging("s3://runs/x", make=True), tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("not the launcher's")
    shutil.rmtree(swapped.path)  # its owner record and all
    os.symlink(victim, swapped.path)
    swapped.remove()
    assert os.path.islink(swapped.path) and (victim / "keep.txt").read_text() == "not the launcher's"
    kept = Staging("s3://runs/x", make=True)
    kept.keep()
    kept.remove()
    assert os.path.isdir(kept.path)
    local = Staging(str(tmp_path / "out"), make=True)
    assert local.path == str(tmp_path / "out")
    local.remove()  # nothing made, nothing removed
