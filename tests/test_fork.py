"""Warm forked workers: same results as fresh interpreters, scripts behave as under torchrun,
and an unsafe parent falls back to spawn."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import NO_WANDB, QUIET, REPO, launcher_env, only_run_dir, read_summary, run_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# Everything a script can observe about how it was started, minus what differs per run (ids, ports, pids).
OBSERVER = textwrap.dedent("""
    import json, multiprocessing, os, signal, sys
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset
    from sibling import VALUE

    got = []
    signal.signal(signal.SIGUSR1, lambda *a: got.append("usr1"))
    os.kill(os.getpid(), signal.SIGUSR1)

    dist.init_process_group("gloo")
    loader = DataLoader(TensorDataset(torch.arange(64.0)), batch_size=8, num_workers=2)
    total = torch.tensor(sum(float(b[0].sum()) for b in loader))
    dist.all_reduce(total)
    seen = {
        "name": __name__, "argv": sys.argv, "file": os.path.basename(__file__), "sibling": VALUE,
        "signal_handled": got, "loader_total": float(total), "path0": sys.path[0] == os.path.dirname(os.path.abspath(__file__)),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                                "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
                                                "TORCHELASTIC_MAX_RESTARTS", "MASTER_ADDR")},
        "threads": torch.get_num_threads(),
        "handlers": {n: str(signal.getsignal(getattr(signal, n))) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR2")},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "spec": __spec__ is None, "package": __package__, "start_method": multiprocessing.get_start_method(),
    }
    out = sys.argv[sys.argv.index("--out") + 1]
    with open(os.path.join(out, "seen-%s.json" % os.environ["RANK"]), "w") as f:
        json.dump(seen, f, sort_keys=True)
    dist.destroy_process_group()
""")


def observe(tmp_path, launcher_argv, name):
    out = tmp_path / name
    out.mkdir()
    argv = [*launcher_argv, "observer.py", "--flag", "x y", "--out", str(out)]
    proc = subprocess.run(argv, cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    return [json.loads((out / f"seen-{r}.json").read_text()) for r in range(2)], str(out)


def write_observer(where):
    (where / "observer.py").write_text(OBSERVER)
    (where / "sibling.py").write_text("VALUE = 42\n")


@pytest.fixture(scope="module")
def torchruns_world(tmp_path_factory):
    """What the observer sees under torchrun: the reference both start methods are held to, so run once."""
    where = tmp_path_factory.mktemp("torchrun")
    write_observer(where)
    torchrun = [str(REPO / ".venv" / "bin" / "torchrun"), "--nproc-per-node", "2", "--max-restarts", "0"]
    if not (REPO / ".venv" / "bin" / "torchrun").exists():
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0"]
    return observe(where, torchrun, "torchrun")


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_script_sees_the_same_world_as_under_torchrun(tmp_path, torchruns_world, start_method):
    write_observer(tmp_path)
    launcher = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path / 'runs'}",
                f"launcher.start_method={start_method}", *NO_WANDB]
    ours, ours_out = observe(tmp_path, launcher, "ours")
    theirs, theirs_out = torchruns_world
    theirs = json.loads(json.dumps(theirs))  # a copy: the loop below edits it, and the other case reads it too
    for mine, ref in zip(ours, theirs):
        mine["argv"] = [a.replace(ours_out, "OUT") for a in mine["argv"]]
        ref["argv"] = [a.replace(theirs_out, "OUT") for a in ref["argv"]]
        # docs/torchrun.md: on one machine the workers' store listens on loopback only
        assert mine["env"].pop("MASTER_ADDR") == "127.0.0.1"
        ref["env"].pop("MASTER_ADDR")
        assert mine == ref
    assert ours[0]["signal_handled"] == ["usr1"] and ours[0]["loader_total"] == 2 * sum(range(64))
    assert ours[0]["argv"] == ["observer.py", "--flag", "x y", "--out", "OUT"]


def test_a_spawned_rank_that_fails_with_loader_workers_ends_on_the_one_line_error(tmp_path):
    """Its DataLoader's queues used to leak named semaphores, and the launcher's resource tracker
    printed a warning after the error line."""
    result = run_launcher(["--gpus", "1", f"output_dir={tmp_path}", "launcher.start_method=spawn", "data.num_workers=2",
                           "trainer.steps=5", *QUIET], cwd=tmp_path, env={"LAUNCHER_INJECT_FAULT": "rank=0,step=2"})
    assert result.returncode == 1
    assert "leaked semaphore" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 0 failed") and "InjectedFault" in last, result.stderr[-2000:]


@pytest.fixture(scope="module")
def threaded_launch(tmp_path_factory):
    """A 12-step trainer run started from a process whose torch thread pool is running: its workers must still fork
    from the zygote, and it is the forked side of the fork/spawn comparison (one launch serves both tests)."""
    out = tmp_path_factory.mktemp("threaded")
    code = textwrap.dedent(f"""
        import sys, torch
        x = torch.randn(256, 256)
        (x @ x).sum()                      # starts torch's intra-op thread pool in this process
        from launcher.cli import main
        sys.exit(main(["--gpus", "2", "output_dir={out}", "trainer.steps=12", *{QUIET!r}]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=out, env=launcher_env(), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    return only_run_dir(out)


def test_forked_and_spawned_workers_train_identically(tmp_path, threaded_launch):
    results = {"fork": read_summary(threaded_launch)}
    assert json.loads((threaded_launch / "plan.json").read_text())["start_method"] == "fork"
    out = tmp_path / "spawn"
    result = run_launcher(["--gpus", "2", f"output_dir={out}", "trainer.steps=12", "launcher.start_method=spawn",
                           *QUIET], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(out)
    assert json.loads((run_dir / "plan.json").read_text())["start_method"] == "spawn"
    results["spawn"] = read_summary(run_dir)
    assert results["fork"]["param_checksum"] == results["spawn"]["param_checksum"]
    assert results["fork"]["final_loss"] == results["spawn"]["final_loss"]


def test_a_launcher_process_with_a_started_thread_pool_still_forks_workers_from_the_zygote(threaded_launch):
    plan = json.loads((threaded_launch / "plan.json").read_text())
    assert plan["start_method"] == "fork"  # the zygote is a fresh process: the launcher's threads are not its own


@pytest.mark.gpu
def test_a_launcher_process_with_cuda_initialised_still_forks_workers_from_the_zygote(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    code = textwrap.dedent(f"""
        import sys, torch
        torch.zeros(1, device="cuda")
        from launcher.cli import main
        sys.exit(main(["--gpus", "1", "output_dir={tmp_path}", "trainer.steps=3"]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=launcher_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((only_run_dir(tmp_path) / "plan.json").read_text())["start_method"] == "fork"
