"""A rank that stops making progress is caught: stacks dumped, stuck ranks named, job stopped, exit 1."""

import faulthandler
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from launcher.agent.progress import RankBeat, stuck_ranks
from launcher.agent.stacks import main_thread_frames, where
from tests.helpers import QUICK, kill_group, launcher_env, only_run_dir, read_summary, wait_gone, worker_processes

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 3
# Hang detection, stack dump and shutdown, beyond the timeout itself; generous for a loaded 2-core box.
BOUND_S = 45

HANGING_SCRIPT = textwrap.dedent("""
    import os, time
    import torch
    import torch.distributed as dist
    from launcher import heartbeat

    def wait_forever():
        while True:
            time.sleep(3600)

    assert os.environ["LAUNCHER_WATCHDOG_TIMEOUT_S"] == "3"  # for a process-group timeout above it
    dist.init_process_group("gloo")
    t = torch.ones(1)
    for step in range(1, 1000000):
        heartbeat()
        if dist.get_rank() == 1 and step == 5:
            wait_forever()
        dist.all_reduce(t)
""")

SILENT_SCRIPT = textwrap.dedent("""
    import time
    time.sleep(2.5)  # never calls heartbeat(): the watchdog must leave it alone
""")


def launch(tmp_path, args, env=None):
    """Start the launcher; return (process, its worker processes once they run)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", f"output_dir={tmp_path / 'runs'}", *args],
        cwd=tmp_path, env=launcher_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(worker_processes(proc.pid)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    return proc, worker_processes(proc.pid)


def finish(proc, timeout):
    try:
        return proc.communicate(timeout=timeout)
    finally:
        kill_group(proc)


def check_hang_report(tmp_path, proc, workers, err, hung_rank_place):
    assert proc.returncode == 1, err
    assert wait_gone(workers, timeout=5) == [], "a worker outlived the launcher"
    run_dir = only_run_dir(tmp_path / "runs")
    summary = read_summary(run_dir)
    assert summary["status"] == "hung"
    message = summary["error"]
    assert message in err  # the same one line on the console
    assert "rank 0 stuck" in message and "rank 1 " in message
    assert hung_rank_place in message, message  # where the hung rank sits
    for rank in (0, 1):
        dump = (run_dir / "stacks" / f"rank-{rank}.txt").read_text()
        assert "most recent call first" in dump, dump
    return message


def test_user_script_hang_is_caught_and_explained(tmp_path):
    (tmp_path / "hang.py").write_text(HANGING_SCRIPT)
    proc, workers = launch(tmp_path, ["--gpus", "2", f"watchdog.timeout_s={TIMEOUT_S}", "hang.py"])
    assert len(workers) == 2, workers
    _, err = finish(proc, TIMEOUT_S + BOUND_S)
    message = check_hang_report(tmp_path, proc, workers, err, "wait_forever (hang.py:")
    assert "all_reduce (hang.py:" in message  # rank 0 waits for rank 1 in the collective


LOADER_SCRIPT = textwrap.dedent("""
    import os, time
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset
    from torch.nn.parallel import DistributedDataParallel as DDP

    class Slow(Dataset):
        def __len__(self):
            return 100000

        def __getitem__(self, i):
            if int(os.environ["RANK"]) == 1 and i >= 20 * 8:
                time.sleep(3600)  # a stuck read: a network filesystem, a lock
            return torch.randn(8), torch.randn(1)

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in DataLoader(Slow(), batch_size=8, num_workers=1):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
""")


def test_a_rank_stuck_in_its_data_loader_is_named_with_its_workers_place(tmp_path):
    """A plain script (no launcher import): rank 1's loader worker blocks in __getitem__, rank 0 waits in DDP."""
    (tmp_path / "loader.py").write_text(LOADER_SCRIPT)
    proc, workers = launch(tmp_path, ["--gpus", "2", f"watchdog.timeout_s={TIMEOUT_S}", "loader.py"])
    assert len(workers) >= 2, workers
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S + BOUND_S + 30)
        # before the group is killed below: the loader worker outlives its killed rank (the zygote adopts it),
        # and it must not outlive the job
        (dump,) = (only_run_dir(tmp_path / "runs") / "stacks").glob("rank-1.loader-*.txt")
        pid = int(dump.stem.rsplit("-", 1)[1])
        left = wait_gone([psutil.Process(pid)], timeout=10) if psutil.pid_exists(pid) else []
        assert left == [], "the data loader's worker outlived the job"
    finally:
        kill_group(proc)
    message = check_hang_report(tmp_path, proc, workers, err, "the data loader, waiting for a batch from its worker processes")
    assert "rank 1 stuck" in message and "its worker in Slow.__getitem__ (loader.py:14)" in message, message
    stacks = only_run_dir(tmp_path / "runs") / "stacks"
    (dump,) = stacks.glob("rank-1.loader-*.txt")
    assert "Slow.__getitem__ (loader.py:14)" in dump.read_text()


def test_builtin_trainer_hang_is_caught_and_explained(tmp_path):
    env = {"LAUNCHER_TEST_HANG_RANK": "1", "LAUNCHER_TEST_HANG_STEP": "5"}
    args = ["--gpus", "2", f"watchdog.timeout_s={TIMEOUT_S}", "trainer.steps=100000", "wandb.mode=disabled", *QUICK]
    proc, workers = launch(tmp_path, args, env)
    _, err = finish(proc, TIMEOUT_S + BOUND_S)
    message = check_hang_report(tmp_path, proc, workers, err, "maybe_hang (trainers/faults/hang.py:")
    # rank 0 waits in the step-boundary all_reduce (trainers/faults/stop.py), a path the user knows
    assert "rank 0 stuck" in message and "(trainers/" in message


def test_script_that_never_beats_is_not_judged(tmp_path):
    (tmp_path / "silent.py").write_text(SILENT_SCRIPT)
    proc, _ = launch(tmp_path, ["--gpus", "2", "watchdog.timeout_s=1", "silent.py"])
    _, err = finish(proc, 60)
    assert proc.returncode == 0, err
    assert read_summary(only_run_dir(tmp_path / "runs"))["status"] == "completed"


def test_a_real_dump_names_the_main_threads_place():
    """Parse a real faulthandler dump with a second thread in it, as a worker's would look."""
    ready, release = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (ready.set(), release.wait()))
    other.start()
    ready.wait()
    try:
        with open(__file__ + ".dump.tmp", "w+") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            dump = f.read()
    finally:
        release.set()
        other.join()
        import os

        os.unlink(__file__ + ".dump.tmp")
    frames = main_thread_frames(dump, threading.main_thread().ident)
    assert frames and frames[0][2] == "test_a_real_dump_names_the_main_threads_place"
    assert where(frames).startswith("test_a_real_dump_names_the_main_threads_place (")
    assert "test_watchdog.py:" in where(frames)


def test_the_node_with_the_hung_rank_leads_the_job_verdict_whichever_watchdog_fired_first():
    from launcher.agent.watchdog import nodes_verdict

    waits = "rank 0 stuck 9s in _engine_run_backward (ddp_hang.py:44); all in a collective, waiting for another node"
    sleeps = "rank 1 stuck 9s in sleep_forever (ddp_hang.py:24)"
    node_0_first = {0: f"hang: no progress for over 9s (watchdog.timeout_s): {waits}; stacks in m0",
                    1: f"hang (node 0's watchdog fired first): {sleeps}; stacks in m1"}
    assert nodes_verdict(node_0_first).startswith("node 1: hang (node 0's watchdog fired first): rank 1 stuck")
    assert nodes_verdict(node_0_first).split(" | ")[1].startswith("node 0: hang: no progress")
    node_1_first = {0: f"hang (node 1's watchdog fired first): {waits}; stacks in m0",
                    1: f"hang: no progress for over 9s (watchdog.timeout_s): {sleeps}; stacks in m1"}
    assert nodes_verdict(node_1_first).startswith("node 1: hang: no progress")
    # neither says where it waits (NCCL: ranks wait in .item()): the node whose watchdog fired first
    follows = {0: "hang (node 1's watchdog fired first): rank 0 stuck 9s in step (train.py:8); stacks in m0",
               1: "hang: no progress for over 9s (watchdog.timeout_s): rank 1 stuck 9s in step (train.py:8); stacks in m1"}
    assert nodes_verdict(follows).startswith("node 1: hang: no progress")
    failed = {0: "rank 0 failed: exit code 1: RuntimeError: Connection closed by peer", 1: node_1_first[1]}
    assert nodes_verdict(failed).startswith("node 1: hang: no progress")


def test_only_ranks_that_beat_and_went_silent_are_stuck():
    ranks = [RankBeat(0, 0, 10, 1, beat_at=100.0), RankBeat(1, 1, 11, 1, beat_at=0.0), RankBeat(2, 2, 12, 1, beat_at=95.0)]
    assert stuck_ranks(ranks, 3, now=97.0) == []  # rank 1 never beat: never judged
    assert [r.rank for r in stuck_ranks(ranks, 3, now=99.0)] == [2]
    assert [r.rank for r in stuck_ranks(ranks, 3, now=104.0)] == [2, 0]  # longest silent first


def test_negative_timeout_is_refused_with_the_fix():
    from launcher.config.schema import load_config
    from launcher.errors import ConfigError

    with pytest.raises(ConfigError, match=r"watchdog.timeout_s=-1 .*0 to disable"):
        load_config(None, ["watchdog.timeout_s=-1"])
    assert load_config(None, ["watchdog.timeout_s=0"]).watchdog.timeout_s == 0


def test_a_rank_is_allowed_its_start_up_and_twice_its_slowest_step():
    from launcher.agent.progress import Progress

    def beat(at):
        return RankBeat(0, 0, pid=10, thread=1, beat_at=at, started_at=100.0)

    progress = Progress()
    progress.update([beat(0.0)])
    assert progress.stuck([beat(0.0)], 3, now=1000.0) == []  # never made progress: not judged
    progress.update([beat(110.0)])  # start-up 10 s
    assert progress.of(beat(0)).allowed_s(3) == 10
    progress.update([beat(116.0)])  # a 6 s step
    assert progress.of(beat(0)).allowed_s(3) == 12
    assert progress.stuck([beat(116.0)], 3, now=127.0) == []
    assert [r.rank for r in progress.stuck([beat(116.0)], 3, now=129.0)] == [0]
    progress.update([beat(1.0)])  # disarmed (DONE_AT) after its last step: finished, never a hang
    assert progress.stuck([beat(1.0)], 3, now=1000.0) == [] and progress.never_started([beat(1.0)]) == []
