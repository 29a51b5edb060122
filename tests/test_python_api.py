"""launcher.launch / launcher.submit (docs/python-api.md): a Python function run on every rank by the launcher's own
command, real processes, 2 CPU workers with gloo.

A function from a script's __main__ and from an imported module returns each rank's value in rank order (from a
Jupyter cell: tests/test_notebook_api.py); a rank that raises is one LaunchFailed naming it with its traceback; a
wrong setting is a ValueError before anything starts; submit returns a Job (status, wait, result, logs, cancel)
locally, on SLURM and on Ray; run_id= of a run that exists is refused, and no Job adopts another run.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import launcher
from launcher.api import payload, pickling
from launcher.api.job import LAUNCHER_OUTPUT, Job
from tests import api_functions
from tests.helpers import run_bounded, slurm_unavailable

QUIET = {"wandb_mode": "disabled"}  # tests/helpers.QUIET's W&B switch, as a setting
DONE = ("COMPLETED",)


def test_an_unknown_setting_is_one_value_error_naming_the_key_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"unknown setting 'trainer_step': did you mean trainer_steps\?.*--show-config"):
        launcher.launch(api_functions.environment, "x", gpus=2, trainer_step=3, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="the function you pass is the job's script"):
        launcher.submit(api_functions.environment, "x", script_path="train.py", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="trainer.steps"):  # a known key with a value the config refuses
        launcher.submit(api_functions.environment, "x", trainer_steps="many", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="keep a run in a local folder"):  # not a local folder named s3:
        launcher.submit(api_functions.environment, "x", output_dir="s3://bucket/runs")
    assert list(tmp_path.iterdir()) == [] and not Path("s3:").exists()  # refused before anything was made


def test_a_result_file_not_signed_by_the_job_is_refused(tmp_path):
    call = {"key": b"k" * 32, "run_id": "r", "run_dir": str(tmp_path)}
    payload.write_outcome(call, 0, "result", b"data")
    assert payload.read_outcome(b"k" * 32, "r", str(tmp_path), 0, "result") == b"data"
    for key, run_id, rank in ((b"x" * 32, "r", 0), (b"k" * 32, "other-run", 0)):
        with pytest.raises(launcher.LaunchFailed, match="not signed by this job"):
            payload.read_outcome(key, run_id, str(tmp_path), rank, "result")
    os.rename(payload.outcome_path(str(tmp_path), 0, "result"), payload.outcome_path(str(tmp_path), 1, "result"))
    with pytest.raises(launcher.LaunchFailed, match="not signed by this job"):  # rank 0's file passed off as rank 1's
        payload.read_outcome(b"k" * 32, "r", str(tmp_path), 1, "result")
    os.symlink("/etc/passwd", payload.outcome_path(str(tmp_path), 2, "result"))
    with pytest.raises(launcher.LaunchFailed, match="cannot be read"):
        payload.read_outcome(b"k" * 32, "r", str(tmp_path), 2, "result")


def test_a_function_pickled_by_value_keeps_its_file_and_lines_in_a_fresh_interpreter(tmp_path):
    """As a Jupyter cell is: compiled under a file name whose lines only linecache has (IPython puts them there)."""
    import linecache

    name = str(tmp_path / "cell-7.py")  # never written: the lines are the caller's alone
    source = "def boom(x):\n    y = x * 2\n    raise KeyError(f'no {y}')  # cell line 3\n"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    namespace: dict = {}
    exec(compile(source, name, "exec"), namespace)
    call, sources = pickling.dumps_call(namespace["boom"], (21,))
    assert sources == {name: source.splitlines(True)}
    (tmp_path / "call.pkl").write_bytes(pickle.dumps({"call": call, "sources": sources}))
    rank = ("import pickle, sys, traceback, cloudpickle\n"
            "from launcher.api.pickling import register_sources\n"
            "loaded = pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "fn, args = cloudpickle.loads(loaded['call'])\n"
            "register_sources(loaded['sources'])\n"
            "try:\n    fn(*args)\nexcept KeyError as e:\n    print(traceback.format_exc())\n")
    done = run_bounded([sys.executable, "-c", rank, str(tmp_path / "call.pkl")], tmp_path, 60)
    assert done.returncode == 0, done.stderr
    assert f'File "{name}", line 3, in boom\n' in done.stdout
    assert "raise KeyError(f'no {y}')  # cell line 3" in done.stdout and "<dynamic-code>" not in done.stdout


def test_a_job_whose_launcher_was_refused_never_adopts_the_run_that_has_its_id(tmp_path):
    """Two submits of one run_id at once: the second's launcher is refused (exit 2); its Job is not the first's run."""
    other = tmp_path / "runs" / "taken"
    other.mkdir(parents=True)
    (other / "plan.json").write_text("{}")
    (other / "summary.json").write_text(json.dumps({"status": "running", "world_size": 2}))
    staging = tmp_path / "runs" / ".call-taken-x"
    staging.mkdir()
    line = "error: run_id=taken already names a run in ...: start a new run with another run_id=ID"
    with open(staging / LAUNCHER_OUTPUT, "wb") as out:
        process = subprocess.Popen([sys.executable, "-c", f"print({line!r}); raise SystemExit(2)"], stdout=out)
    assert process.wait(timeout=60) == 2
    job = Job(other, "local", b"k" * 32, 2, staging, process)
    assert job.status() == "FAILED" and job.done()
    assert job.cancel() == "job taken never started; nothing to cancel"
    with pytest.raises(launcher.LaunchFailed, match="already names a run") as caught:
        job.result()
    assert caught.value.rank is None and (other / "plan.json").exists()  # the other run is left as it was


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_returns_once_the_job_completed_and_its_wandb_run_still_ends_whole(tmp_path, capsys):
    """W&B on, offline, as a user gets it: launch() returns the values once summary.json and the launcher's last line
    are out (the line echoed), not after the W&B run's end; the launcher ends that run after, and it holds the rows,
    the summary and the console up to that last line."""
    from launcher.runlock import live_holders
    from tests.wandb_records import history, run_summary

    assert launcher.launch(api_functions.train_steps, 6, gpus=2, output_dir=str(tmp_path)) == [0, 1]
    echoed = capsys.readouterr().out
    assert "completed in" in echoed.strip().splitlines()[-1], echoed[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    deadline = time.monotonic() + 60
    while live_holders(run_dir) and time.monotonic() < deadline:  # its launcher, ending the W&B run
        time.sleep(0.1)
    assert not live_holders(run_dir), "the launcher did not end within 60 s of the job's completion"
    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    assert run_summary(folder)["status"] == "completed" and run_summary(folder)["steps"] == 6
    assert [row["step"] for row in history(folder) if "steps_per_s" in row][-1] == 6
    console = (folder / "files" / "output.log").read_text()
    assert "completed in" in console.strip().splitlines()[-1], console[-2000:]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # the call folder is gone


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_from_a_scripts_main_returns_every_ranks_value_with_torchruns_environment(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import json, os, sys\n"
        "import launcher\n\n"
        "OUT = sys.argv[2]  # a global of __main__: it travels with the function, by value\n\n"
        "def reduce(scale):\n"
        "    import atexit, torch, torch.distributed as dist\n"
        "    dist.init_process_group('gloo')\n"
        "    total = torch.tensor([float(dist.get_rank() + 1) * scale])\n"
        "    dist.all_reduce(total)\n"
        "    dist.destroy_process_group()\n"
        "    rank = os.environ['RANK']\n"
        "    left = open(os.path.join(OUT, f'left-open-{rank}'), 'w')  # buffered, never closed: flushed at exit\n"
        "    left.write('kept')\n"
        "    sys.modules['__main__'].__dict__.setdefault('kept', []).append(left)\n"
        "    atexit.register(lambda: open(os.path.join(OUT, f'atexit-{rank}'), 'w').write('ran'))\n"
        "    import threading, time  # a thread the function leaves running: joined before the process ends\n"
        "    threading.Thread(target=lambda: (time.sleep(0.3), open(os.path.join(OUT, f'thread-{rank}'), 'w').write('ran'))).start()\n"
        "    return {'sum': total.item(), **{k: os.environ[k] for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR')}}\n\n"
        "if __name__ == '__main__':\n"
        "    values = launcher.launch(reduce, 10.0, gpus=2, output_dir=sys.argv[1], wandb_mode='disabled')\n"
        "    print('RESULT ' + json.dumps(values))\n")
    done = run_bounded([sys.executable, str(script), str(tmp_path / "runs"), str(tmp_path)], tmp_path, 200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    values = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert [v["RANK"] for v in values] == ["0", "1"] and [v["LOCAL_RANK"] for v in values] == ["0", "1"]
    assert {v["WORLD_SIZE"] for v in values} == {"2"} and {v["MASTER_ADDR"] for v in values} == {"127.0.0.1"}
    assert [v["sum"] for v in values] == [30.0, 30.0]  # (1 + 2) x 10 over gloo
    run_dir = next(p for p in (tmp_path / "runs").iterdir() if not p.name.startswith("."))
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"  # a launcher run like any
    assert [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith(".")] == []  # the call file is gone
    for rank in (0, 1):  # a rank's process ended as an interpreter does: threads joined, atexit handlers, files
        assert (tmp_path / f"atexit-{rank}").read_text() == "ran"  # flushed (docs/python-api.md)
        assert (tmp_path / f"thread-{rank}").read_text() == "ran"
        assert (tmp_path / f"left-open-{rank}").read_text() == "kept"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_launch_of_an_imported_modules_function_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tests.api_functions is found through the caller's sys.path, not the folder
    values = launcher.launch(api_functions.environment, "hello", gpus=2, output_dir="runs", **QUIET)
    assert [v["RANK"] for v in values] == ["0", "1"]
    assert all(v["tag"] == "hello" and v["WORLD_SIZE"] == "2" and v["MASTER_PORT"] and v["TORCHELASTIC_RUN_ID"]
               for v in values)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failing_rank_is_one_exception_naming_it_with_its_traceback(tmp_path):
    with pytest.raises(launcher.LaunchFailed) as caught:
        launcher.launch(api_functions.fail_on_rank, 1, gpus=2, output_dir=str(tmp_path), **QUIET)
    failed = caught.value
    assert failed.rank == 1 and failed.state == "FAILED"
    assert str(failed).startswith("rank 1 failed: ValueError: rank 1 broke on purpose")
    assert "in fail_on_rank" in failed.traceback and failed.traceback.rstrip().endswith("rank 1 broke on purpose")
    assert "launcher/api/worker.py" not in failed.traceback  # the function's frames, not the shim's
    assert Path(failed.run_dir).parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == [Path(failed.run_dir).name]  # its call file went with the job


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_submit_here_returns_a_job_to_follow_and_one_to_cancel(tmp_path):
    job = launcher.submit(api_functions.environment, "from a job", gpus=2, output_dir=str(tmp_path), **QUIET)
    assert job.status() in ("PENDING", "RUNNING", "COMPLETED")
    assert job.wait(timeout=200) in DONE and job.done()
    assert [v["RANK"] for v in job.result()] == ["0", "1"]
    assert "rank 1 says from a job" in job.logs(rank=1) and "rank 0 says" in job.logs()
    assert "already ended" in job.cancel()  # a finished job is left alone
    with pytest.raises(ValueError, match=f"^run_id={job.job_id} already names a run .*leave run_id out"):
        launcher.launch(api_functions.environment, "again", run_id=job.job_id, gpus=2, output_dir=str(tmp_path), **QUIET)

    long = launcher.submit(api_functions.sleep_then_return, 600, gpus=2, output_dir=str(tmp_path), **QUIET)
    deadline = time.monotonic() + 120
    while "sleeping" not in long.logs(rank=1):
        assert time.monotonic() < deadline and not long.done(), long.status()
        time.sleep(0.5)
    made = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ValueError, match=f"^run_id={long.job_id} already names a run") as refused:
        launcher.submit(api_functions.environment, "mistyped", run_id=long.job_id, gpus=2, output_dir=str(tmp_path))
    assert "\n" not in str(refused.value) and sorted(p.name for p in tmp_path.iterdir()) == made  # nothing made
    assert long.status() == "RUNNING"
    assert "cancelled" in long.cancel()
    assert long.done() and long.status() == "INTERRUPTED"
    with pytest.raises(launcher.LaunchFailed, match="INTERRUPTED") as caught:
        long.result()
    assert caught.value.rank is None
    assert not [p for p in psutil.process_iter(["cmdline"]) if long.job_id in " ".join(p.info["cmdline"] or [])]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.timeout(300)
def test_submit_to_slurm_returns_a_working_job(tmp_path):
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    job = launcher.submit(api_functions.environment, "on slurm", cluster="slurm", nodes=2, gpus=1, slurm_time_min=5,
                          output_dir=str(tmp_path), **QUIET)
    try:
        assert job.status() in ("PENDING", "RUNNING", "COMPLETED", "CONFIGURING", "COMPLETING")
        assert job.wait(timeout=240) in DONE
        values = job.result()
        assert [v["RANK"] for v in values] == ["0", "1"] and [v["GROUP_RANK"] for v in values] == ["0", "1"]
        assert "rank 1 says on slurm" in job.logs(rank=1)
    finally:
        for job_file in tmp_path.glob("*/job.json"):
            subprocess.run(["scancel", str(json.loads(job_file.read_text())["job_id"])], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def ray_cluster_env(tmp_path_factory):
    from tests.ray_cluster import ray_cluster, ray_env

    for cluster in ray_cluster(tmp_path_factory, 2):
        yield ray_env(cluster)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_submit_to_ray_returns_a_working_job(tmp_path, monkeypatch, ray_cluster_env):
    for name, value in ray_cluster_env.items():
        monkeypatch.setenv(name, value)
    job = launcher.submit(api_functions.environment, "on ray", cluster="ray", nodes=2, gpus=1,
                          output_dir=str(tmp_path), **QUIET)
    assert job.wait(timeout=240) in DONE, job.logs()
    values = job.result()
    assert [v["RANK"] for v in values] == ["0", "1"] and [v["GROUP_RANK"] for v in values] == ["0", "1"]
    assert "rank 1 says on ray" in job.logs(rank=1)
    assert "already ended" in job.cancel()
