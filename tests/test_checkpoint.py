"""The checkpoint format: real DCP files on disk, atomic saves, damage detected, no arbitrary unpickling.

One process with a one-rank gloo group; the multi-rank paths run in test_restarts.py.
"""

import json
import os
import pickle
import random
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers import QUICK, REPO, launcher_env, only_run_dir, run_launcher
from launcher.trainers.checkpoint import store as ckpt
from launcher.runtime import checkpoints as files

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module", autouse=True)
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trained(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    return model, optimizer


def same_weights(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def save_steps(tmp_path, steps, keep=5):
    model, optimizer = trained(0)
    for step in steps:
        ckpt.save(tmp_path, model, optimizer, ckpt.Position(step, 0, step, 1.5, "wandb-abc"), keep=keep)
    return model, optimizer


def test_round_trip_restores_weights_optimizer_position_and_every_rng(tmp_path):
    model, optimizer = trained(0)
    random.seed(7), np.random.seed(7), torch.manual_seed(7)
    ckpt.save(tmp_path, model, optimizer, ckpt.Position(12, 1, 4, 0.25, "wandb-abc"), keep=3)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))

    fresh, fresh_opt = trained(1)
    assert not same_weights(model, fresh)
    resumed = ckpt.load_latest(tmp_path, fresh, fresh_opt)
    assert resumed is not None and resumed.position == ckpt.Position(12, 1, 4, 0.25, "wandb-abc")
    assert same_weights(model, fresh)
    for a, b in zip(optimizer.state.values(), fresh_opt.state.values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    ckpt.restore_rng(resumed.rng)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected

    manifest = files.read_manifest(resumed.path)
    assert manifest["step"] == 12 and manifest["world_size"] == 1
    assert {"rank-0.pt", ".metadata"} <= set(manifest["files"])


def test_keeps_the_newest_k(tmp_path):
    save_steps(tmp_path, [10, 20, 30, 40], keep=2)
    assert [p.name for p in files.list_checkpoints(tmp_path)] == ["step-00000040", "step-00000030"]


def test_damaged_latest_is_skipped_with_a_warning_and_the_one_before_used(tmp_path, capsys):
    save_steps(tmp_path, [10, 20, 30])
    latest = tmp_path / "step-00000030"
    shard = next(p for p in latest.iterdir() if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[:-10])  # truncated, as by a full disk
    (tmp_path / "step-00000020" / "rank-0.pt").write_bytes(b"\0" * 40)  # garbage of any size

    model, optimizer = trained(1)
    resumed = ckpt.load_latest(tmp_path, model, optimizer)
    assert resumed is not None and resumed.position.step == 10
    out = capsys.readouterr().out
    assert "step-00000030 is damaged" in out and shard.name in out and "step-00000020 is damaged" in out
    # damaged ones are set aside, so later saves of those steps start clean
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt-step-00000020", "corrupt-step-00000030", "step-00000010"]


def test_a_checkpoint_without_its_manifest_or_a_leftover_temp_dir_is_ignored(tmp_path):
    save_steps(tmp_path, [10, 20])
    (tmp_path / "step-00000020" / files.MANIFEST).unlink()
    (tmp_path / ".tmp-step-00000030").mkdir()
    assert files.latest_valid(tmp_path, warn=lambda m: None) == tmp_path / "step-00000010"
    assert ckpt.load_latest(tmp_path / "nothing-here", *trained(1)) is None


def test_killed_during_a_save_leaves_the_previous_checkpoint_intact(tmp_path):
    """A real SIGKILL at the worst moment: every file of the new checkpoint written, not yet renamed."""
    script = textwrap.dedent(f"""
        import os, signal, torch, torch.distributed as dist
        from launcher.trainers.checkpoint import store as ckpt
        from tests.test_checkpoint import trained
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model, optimizer = trained(0)
        ckpt.save(ckpt.Path({str(tmp_path)!r}), model, optimizer, ckpt.Position(10, 0, 10), keep=3)
        real_rename = os.rename
        def rename(src, dst):
            if os.path.basename(str(src)).startswith(".tmp-step"):
                os.kill(os.getpid(), signal.SIGKILL)
            real_rename(src, dst)
        os.rename = rename
        ckpt.save(ckpt.Path({str(tmp_path)!r}), model, optimizer, ckpt.Position(20, 0, 20), keep=3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=launcher_env(), capture_output=True, text=True, timeout=90)
    assert proc.returncode == -9, proc.stderr
    assert (tmp_path / ".tmp-step-00000020" / files.MANIFEST).is_file()  # it got that far
    model, optimizer = trained(1)
    resumed = ckpt.load_latest(tmp_path, model, optimizer)
    assert resumed is not None and resumed.position.step == 10
    # saving that step again replaces the leftover
    ckpt.save(tmp_path, model, optimizer, ckpt.Position(20, 0, 20), keep=3)
    assert not (tmp_path / ".tmp-step-00000020").exists()
    assert files.verify(tmp_path / "step-00000020") is None


class Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def forge(path, name, payload):
    """Replace a file and its manifest entry, as an attacker with write access to the run could."""
    (path / name).write_bytes(payload)
    manifest = files.read_manifest(path)
    manifest["files"][name] = {"size": len(payload), "sha256": files.file_sha256(path / name)}
    (path / files.MANIFEST).write_text(__import__("json").dumps(manifest))


@pytest.mark.parametrize("name", ["rank-0.pt", ".metadata"])
def test_loading_never_runs_code_from_a_checkpoint(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    save_steps(tmp_path, [10])
    path = tmp_path / "step-00000010"
    if name == "rank-0.pt":
        buffer = __import__("io").BytesIO()
        torch.save({"position": Boom()}, buffer)
        forge(path, name, buffer.getvalue())
    else:
        forge(path, name, pickle.dumps(Boom()))
    with pytest.raises(Exception, match="(?i)unpickl|not allowed|weights_only"):
        ckpt.load_latest(tmp_path, *trained(1))
    assert not (tmp_path / "pwned").exists()


def test_every_seconds_saves_when_time_has_passed_and_records_the_wandb_run(tmp_path):
    from types import SimpleNamespace

    from launcher.trainers.checkpoint.checkpointer import Checkpointer

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir=None, every_steps=0, every_seconds=1e-9, keep=5))
    (tmp_path / "wandb_run_id").write_text("run-xyz\n")  # written by the W&B logger
    model, optimizer = trained(0)
    checkpointer = Checkpointer(cfg, str(tmp_path), 0, 1, torch.device("cpu"), model, optimizer)
    for step in (1, 2, 3):
        assert checkpointer.after_step(step, 0, step, lambda: 0.5, last=False) is False
    saved = files.list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in saved] == ["step-00000003", "step-00000002", "step-00000001"]
    assert files.read_manifest(saved[0])["position"]["wandb_run_id"] == "run-xyz"


def _sharded_round_trip(rank, store, ckpt_dir, result_file):
    """FSDP2 (fully_shard) on 2 CPU ranks: save, train on, then load into a fresh model and train the same."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        for layer in (model[0], model[2], model):
            fully_shard(layer)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(model, optimizer, steps):
        for step in steps:
            g = torch.Generator().manual_seed(step * 10 + rank)
            optimizer.zero_grad()
            model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
            optimizer.step()

    def full(model):
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    model, optimizer = build(0)
    train(model, optimizer, range(3))
    ckpt.save(ckpt.Path(ckpt_dir), model, optimizer, ckpt.Position(3, 0, 3), keep=2)
    train(model, optimizer, range(3, 5))
    fresh, fresh_optimizer = build(1)
    resumed = ckpt.load_latest(ckpt.Path(ckpt_dir), fresh, fresh_optimizer)
    train(fresh, fresh_optimizer, range(3, 5))
    expected, got = full(model), full(fresh)
    if rank == 0:
        same = all(torch.equal(expected[k], got[k]) for k in expected)
        ckpt.Path(result_file).write_text(f"{resumed.position.step} {same}")
    dist.destroy_process_group()


def _two_ranks(function: str, *args: str, timeout: float = 90) -> None:
    """Run tests.test_checkpoint.<function>(rank, *args) in two real processes; both must exit 0."""
    code = f"import sys; from tests.test_checkpoint import {function} as f; f(int(sys.argv[1]), *sys.argv[2:])"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank), *args], cwd=REPO, env=launcher_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs


def _both(rank, folder):
    """The two 2-rank checks below, one after the other, in one pair of processes (each pair imports torch and
    the trainer, ~3 CPU-s a process); each has its own process group, store and files under folder."""
    _agree_on_a_stop(rank, f"{folder}/agree-store", f"{folder}/seen")
    _sharded_round_trip(rank, f"{folder}/store", f"{folder}/ckpt", f"{folder}/result")
    # Leave like a forked worker does (multiprocessing ends it with os._exit): torch 2.13 sometimes
    # aborts in interpreter teardown after FSDP + DCP ("terminate called without an active exception").
    sys.stdout.flush()
    os._exit(0)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """One pair of real rank processes that ran both 2-rank checks (_both): their folder of results."""
    folder = tmp_path_factory.mktemp("two-ranks")
    _two_ranks("_both", str(folder), timeout=180)  # the two checks' own bounds were 90 and 60 s
    return folder


@pytest.mark.timeout(300)  # the first test to ask for two_ranks waits for it (up to 180 s, _two_ranks)
def test_sharded_fsdp_model_and_optimizer_resume_exactly(two_ranks):
    result = two_ranks / "result"
    assert result.read_text() == "3 True"
    shards = sorted(p.name for p in (two_ranks / "ckpt" / "step-00000003").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard


def _agree_on_a_stop(rank, store, result_file):
    """Rank 1 asks to stop at step 3 only; every rank must see the agreed stop at the same step."""
    from launcher.trainers.faults.stop import StepSignals

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    signals = StepSignals(2, torch.device("cpu"))
    seen = []
    for step in range(1, 7):
        stop, due = signals.exchange(stop=rank == 1 and step == 3, time_due=rank == 0 and step == 5)
        seen.append((step, stop, due))
    signals.settle()
    ckpt.Path(f"{result_file}.{rank}").write_text(json.dumps(seen))
    dist.destroy_process_group()


@pytest.mark.timeout(300)  # as above, where it runs alone
def test_ranks_agree_on_a_stop_and_a_timed_save_one_step_after_either_rank_asked(two_ranks):
    result = two_ranks / "seen"
    seen = [json.loads(ckpt.Path(f"{result}.{rank}").read_text()) for rank in (0, 1)]
    assert seen[0] == seen[1]  # the same decision at the same step on both ranks
    assert [step for step, stop, _ in seen[0] if stop] == [4]  # asked at 3 by rank 1 only
    assert [step for step, _, due in seen[0] if due] == [6]  # due at 5 on rank 0 only


def test_killed_during_a_background_write_leaves_the_previous_checkpoint_intact(tmp_path):
    """A real SIGKILL while an async save of step 20 writes: step 10 stays the newest and loads exactly."""
    script = textwrap.dedent(f"""
        import os, signal, sys, threading, torch, torch.distributed as dist
        from types import SimpleNamespace
        from launcher.trainers.checkpoint import store as ckpt
        from launcher.trainers.checkpoint.checkpointer import Checkpointer
        from tests.test_checkpoint import trained

        class Watch:  # sees the writer's own "delayed" line pass, then lets the kill come (a fixed sleep raced it)
            def __init__(self, out):
                self.out, self.seen = out, threading.Event()
            def write(self, text):
                written = self.out.write(text)
                if "save of step 20 delayed" in text:
                    self.out.flush()
                    self.seen.set()
                return written
            def flush(self):
                self.out.flush()
        sys.stdout = Watch(sys.stdout)
        delayed = sys.stdout.seen
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model, optimizer = trained(0)
        cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir={str(tmp_path)!r}, every_steps=10, every_seconds=0,
                                                         keep=3, async_save=True))
        checkpointer = Checkpointer(cfg, None, 0, 1, torch.device("cpu"), model, optimizer)
        checkpointer.after_step(10, 0, 10, lambda: 0.5, last=False)
        checkpointer.finish()
        torch.save(model.state_dict(), {str(tmp_path / "at-10.pt")!r})
        os.environ["LAUNCHER_TEST_SAVE_DELAY_S"] = "30"
        checkpointer.after_step(20, 0, 20, lambda: 0.5, last=False)  # returns with the write in flight
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # the loop goes on changing the weights the write copied
        print("training on while the write is in flight", flush=True)
        assert delayed.wait(60), "the background write never reached its delay"
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=launcher_env(), capture_output=True, text=True,
                          timeout=90)
    assert proc.returncode == -9, proc.stderr
    assert "save of step 20 delayed" in proc.stdout and "training on while" in proc.stdout
    assert (tmp_path / ".tmp-step-00000020").is_dir() and not (tmp_path / "step-00000020").exists()
    model, optimizer = trained(1)
    resumed = ckpt.load_latest(tmp_path, model, optimizer)
    assert resumed is not None and resumed.position.step == 10
    expected = torch.load(tmp_path / "at-10.pt", weights_only=True)
    assert all(torch.equal(expected[k], v) for k, v in model.state_dict().items())


def test_an_async_save_is_the_copy_taken_at_its_step(tmp_path):
    """Weights changed after an async save returns do not leak into the checkpoint it writes."""
    from types import SimpleNamespace

    from launcher.trainers.checkpoint.checkpointer import Checkpointer

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir=str(tmp_path), every_steps=1, every_seconds=0, keep=3,
                                                     async_save=True))
    model, optimizer = trained(0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    checkpointer = Checkpointer(cfg, None, 0, 1, torch.device("cpu"), model, optimizer)
    checkpointer.after_step(1, 0, 1, lambda: 0.5, last=False)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.0)
    checkpointer.finish()
    fresh, fresh_opt = trained(1)
    assert ckpt.load_latest(tmp_path, fresh, fresh_opt).position.step == 1
    assert all(torch.equal(expected[k], v) for k, v in fresh.state_dict().items())
    assert checkpointer.staged_bytes > 0


def test_every_steps_auto_times_one_save_and_picks_the_young_daly_interval(tmp_path, capsys):
    from types import SimpleNamespace

    from launcher.trainers.checkpoint.interval import young_daly_steps
    from launcher.trainers.checkpoint.checkpointer import PROBE_STEPS, Checkpointer

    assert young_daly_steps(0.08, 0.01, 3600)[0] == 2400  # sqrt(2 x 0.08 x 3600) = 24 s of 10 ms steps
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir=None, every_steps="auto", every_seconds=0, keep=2,
                                                     mtbf_s=1e-9, async_save=False))
    checkpointer = Checkpointer(cfg, str(tmp_path), 0, 1, torch.device("cpu"), *trained(0))
    for step in range(1, PROBE_STEPS + 4):
        time.sleep(0.01)  # a step's time
        checkpointer.after_step(step, 0, step, lambda: 0.5, last=False)
    out = capsys.readouterr().out
    assert "checkpoint.every_steps=auto: a save blocks the loop" in out and "= 1 steps (Young/Daly" in out
    saved = [p.name for p in files.list_checkpoints(tmp_path / "checkpoints")]
    assert saved == [f"step-{s:08d}" for s in (PROBE_STEPS + 3, PROBE_STEPS + 2)]  # every step from the probe on, keep 2


def test_auto_plans_for_failures_as_often_as_this_job_has_restarted():
    from launcher.trainers.checkpoint.interval import young_daly_steps

    steps, reason = young_daly_steps(0.08, 0.01, 3600, restarts=2, elapsed_s=100)  # a failure every 50 s so far
    assert steps == 283 and "MTBF 50s as this job has shown (2 restarts in 100s; checkpoint.mtbf_s=3600)" in reason
    assert young_daly_steps(0.08, 0.01, 30, restarts=1, elapsed_s=100)[0] == 219  # mtbf_s below what was seen stands
    assert young_daly_steps(0.08, 0.01, 3600, restarts=0, elapsed_s=100)[0] == 2400  # no failure yet: mtbf_s


def test_a_run_saves_on_the_young_daly_interval_by_default(tmp_path):
    """No checkpoint setting given: the probe save after 10 steps picks the interval, and the run says so."""
    done = run_launcher(["--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=30", "checkpoint.mtbf_s=0.001",
                         "wandb.mode=disabled", *QUICK], tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "checkpoint.every_steps=auto: a save blocks the loop" in done.stdout + done.stderr
    run_dir = only_run_dir(tmp_path)
    saved = [p.name for p in files.list_checkpoints(run_dir / "checkpoints")]
    assert len(saved) == 3 and saved[0] == "step-00000030"  # a save every step from the probe on, keep 3
